"""The passes of a token VLA over its prompts and images (:class:`HFPasses`): the prompt
``[BOS] + [image token] * n_image_tokens + prompt + appended ids``, the image's features in place of
its tokens, the text model over embeddings after a KV cache, and the LM head's 256 action rows.

What differs between model families is their model half (:class:`VLAModules`): how an image is
resized and normalised, the vision tower(s) and projector, and the text model's forward. A
Llava-style Hugging Face model is one (:class:`~vla_accel_ros.models.hf.modules.LlavaModules`);
OpenVLA as published is another (:class:`~vla_accel_ros.models.openvla.modules.OpenVLAModules`).

:class:`~vla_accel_ros.models.token_vla.policy.HFTokenVLA` is the policy made of these passes, and
:mod:`.incremental` recomputes part of them from frame to frame. Where the text model runs op by
op (a Llama through :class:`~vla_accel_ros.models.hf.direct.DirectLlamaText`), the prefill and the
passes after it take the fast path (:mod:`.static`: a preallocated KV cache, fixed-shape passes,
CUDA graphs on a GPU); ``info["fast_path"]`` says which path runs and, when it is transformers'
DynamicCache, why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.cuda_graph import CudaGraphs
from vla_accel_ros.models.files import CONFIG_FILE
from vla_accel_ros.models.token_vla.cache import CacheSlot
from vla_accel_ros.models.token_vla.spec import VLASpec
from vla_accel_ros.models.token_vla.static import StaticKVCache, StaticText
from vla_accel_ros.models.token_vla.statistics import ActionStatistics
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

@dataclass(frozen=True)
class HFVLAConfig:
    """What the runner and the decoders read of a policy's configuration.

    d_model: the text decoder's width (of ``Prefix.pooled`` and ``hidden_last``). image_size: the
    square side images are resized to. vocab_size: the text vocabulary (the action ids' range).
    n_image_tokens: image positions in the prompt. max_position_embeddings: the context (None:
    unbounded).
    """

    d_model: int
    image_size: int
    vocab_size: int
    n_image_tokens: int
    max_position_embeddings: int | None
    n_action_tokens: int = ACTION_DIM
    n_bins: int = N_BINS


class VLAModules(Protocol):
    """The model half of a token VLA's passes, as a family builds it.

    model: every weight (an ``nn.Module``). text_config: the text model's transformers config
    (hidden_size, max_position_embeddings, the attention implementation). image_token_id: the id
    whose positions take the image features. image_size / patch_size: the square image side and the
    side of the patch behind one image token (0: image tokens are not one per patch).
    n_image_tokens: image positions per prompt. device / dtype: the weights'. direct: what runs the
    vision tower over some of the patches (``tower_pass``, :class:`~.cache.TowerCache`), None
    when nothing does. forward_name: how the passes run, for ``info``. direct_text: the text
    model op by op (:class:`~vla_accel_ros.models.hf.direct.DirectLlamaText`), which the fast
    path (:mod:`.static`) runs; None when transformers' modules run it.
    """

    model: Any
    text_config: Any
    image_token_id: int
    image_size: int
    patch_size: int
    n_image_tokens: int
    device: torch.device
    dtype: torch.dtype
    direct: Any
    forward_name: str
    direct_text: Any

    def resized_image(self, image: np.ndarray) -> torch.Tensor:
        """(1, 3, S, S) float32 on the 0..255 scale, on the CPU: a checked RGB uint8 image (H, W, 3)
        resized, before normalisation."""
        ...

    def normalised_pixels(self, resized: torch.Tensor) -> torch.Tensor:
        """The model input of a :meth:`resized_image`, on the model's device and in its dtype."""
        ...

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(1, n_image_tokens, d): what takes the image tokens' places for the model input ``pixels``."""
        ...

    def new_cache(self) -> Any:
        """An empty KV cache for the text model."""
        ...

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (1, n, d) of text ids (1, n)."""
        ...

    def forward(self, ids: torch.Tensor, pixels: torch.Tensor | None, cache: Any) -> torch.Tensor:
        """Final hidden states of the model over ``ids`` after the cache's positions, the image of
        ``pixels`` (if any) in its tokens' places."""
        ...

    def text_after_cache(self, embeddings: torch.Tensor, cache: Any) -> torch.Tensor:
        """Final hidden states (1, q, d) over embeddings (1, q, d), causal, after the cache's rows."""
        ...

    def forward_embeddings(self, embeddings: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                           attention_mask: torch.Tensor) -> torch.Tensor:
        """Final hidden states over embeddings (1, q, d) at ``position_ids`` (1, q), after the cache's
        rows, under a 4D additive ``attention_mask`` (1, 1, q, cached + q)."""
        ...

    def get_output_embeddings(self) -> Any:
        """The LM head (``weight`` (vocab rows, d), optional ``bias``)."""
        ...

    def get_input_embeddings(self) -> Any:
        """The input embedding (``weight`` (vocab rows, d))."""
        ...


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor on ``device``: from the host to CUDA through pinned memory, without waiting."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def embeddings_with_image(modules: VLAModules, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Input embeddings (1, n, d) of ``ids`` (1, n) with the image features (1, n_image_tokens, d)
    in the image tokens' places."""
    embeddings = modules.embed_ids(ids)
    embeddings[ids == modules.image_token_id] = features.reshape(-1, embeddings.shape[-1]).to(embeddings.dtype)
    return embeddings


class HFPasses:
    """A token VLA's model half (:class:`VLAModules`), its text tokenizer and its spec, checked to
    be an OpenVLA-style VLA, and the passes over its prompts (module docstring); ``source`` names
    the model in error messages, ``statistics`` bin the proprioception a prompt may read.
    ``static``: the fast path's text passes (:class:`~.static.StaticText`), None where transformers'
    modules run the text model."""

    def __init__(self, modules: VLAModules, text_tokenizer: PreTrainedTokenizerBase, spec: VLASpec, *,
                 source: str = "<in-memory model>", statistics: ActionStatistics | None = None) -> None:
        self.modules = modules
        self.model = modules.model
        self.direct = modules.direct
        self.text_tokenizer = text_tokenizer
        self.spec = spec
        self.source = source
        self.statistics = statistics
        if spec.reads_proprio and (statistics is None or statistics.proprio_q01 is None):
            raise ValueError(f"{source}: the prompt reads the proprioception ('{{proprio}}'), but the statistics "
                             "have no proprio q01/q99 to bin it with")
        text_config = modules.text_config
        vocab_size = int(text_tokenizer.vocab_size)
        head = modules.get_output_embeddings()
        try:
            action_ids = spec.action_ids(vocab_size)
        except ValueError as error:
            raise ValueError(f"{source}: not an OpenVLA-style VLA: {error}") from None
        if int(action_ids.max()) >= head.weight.shape[0]:
            raise ValueError(f"{source}: action ids up to {int(action_ids.max())} leave the model's "
                             f"{head.weight.shape[0]} output rows")
        bos = text_tokenizer.bos_token_id if text_tokenizer.bos_token_id is not None else text_config.bos_token_id
        if bos is None:
            raise ValueError(f"{source}: the tokenizer has no BOS token")
        self.appended_ids = spec.resolved_appended_ids(vocab_size)
        specials = {"BOS": bos, "image token": modules.image_token_id, "EOS": text_tokenizer.eos_token_id,
                    "pad": text_tokenizer.pad_token_id, "unk": text_tokenizer.unk_token_id}
        specials |= {f"appended id {i}": i for i in self.appended_ids}
        in_range = set(action_ids.tolist())
        clashes = [f"{name} ({i})" for name, i in specials.items() if i is not None and i in in_range]
        if clashes:
            raise ValueError(f"{source}: not an OpenVLA-style VLA: the action ids "
                             f"{int(action_ids.min())}..{int(action_ids.max())} include {', '.join(clashes)}")
        self.bos_id, self.image_token_id = int(bos), int(modules.image_token_id)
        weight = head.weight.detach()
        self.device, self.dtype = weight.device, weight.dtype
        self.compute_dtype = weight.dtype  # the language model's: what every pass computes in
        self.action_ids = action_ids  # (256,) our bin -> HF id
        self._hf_ids = torch.from_numpy(action_ids).to(self.device)
        # The LM head's 256 action rows, gathered once; logits in float32 whatever the weights' dtype.
        self._head_weight = weight[self._hf_ids].float()
        bias = getattr(head, "bias", None)
        self._head_bias = None if bias is None else bias.detach()[self._hf_ids].float()
        self._softcap = getattr(text_config, "final_logit_softcapping", None)
        embeddings = modules.get_input_embeddings()
        if embeddings is None or embeddings.weight.shape[1] != int(text_config.hidden_size):
            raise ValueError(f"{source}: {type(modules.model).__name__} has no input embeddings of its hidden size")
        # The input embeddings of our 256 bins, gathered once: what the draft head reads of a token.
        self.action_embeddings = embeddings.weight.detach()[self._hf_ids].float()
        self._prompt_cache: tuple[str, tuple[torch.Tensor, torch.Tensor, int]] | None = None
        max_positions = getattr(text_config, "max_position_embeddings", None)
        self.config = HFVLAConfig(d_model=int(text_config.hidden_size), image_size=modules.image_size,
                                  vocab_size=vocab_size, n_image_tokens=modules.n_image_tokens,
                                  max_position_embeddings=None if max_positions is None else int(max_positions))
        on_gpu = self.device.type == "cuda"
        # the fast path over the op-by-op text model; transformers' modules keep their DynamicCache
        self.static = (None if modules.direct_text is None
                       else StaticText(modules.direct_text, self.device, self.dtype, graphs=on_gpu))
        self._image_graphs = CudaGraphs(modules.image_features, torch.Tensor.clone) if on_gpu else None
        if self.static is None:
            fast_path = f"none: transformers' DynamicCache, the text model runs as transformers' modules " \
                        f"({modules.forward_name})"
        else:
            fast_path = "static KV cache, " + ("CUDA graphs" if on_gpu else "eager passes (CPU)")
        self.info: dict[str, Any] = {"source": source, "unnorm_key": None if statistics is None else statistics.key,
                                     "forward": modules.forward_name, "fast_path": fast_path}

    # --- inputs -------------------------------------------------------------------------------
    def prompt_ids(self, instruction: str, proprio: np.ndarray | None = None) -> torch.Tensor:
        """(1, L) ids of one instruction's prompt: BOS, the prompt text before the image (none in
        OpenVLA's layout), the image tokens, the prompt text after it with the proprioception
        tokens (joints then gripper, ``proprio``) where the prompt has a ``{proprio}`` field, the
        appended ids. ValueError when the prompt and an action do not fit in the context, or the
        prompt reads the proprioception and ``proprio`` is missing or bad."""
        head, tail, _ = self._cached_parts(instruction)
        if not self.spec.reads_proprio:
            return head
        if proprio is None:
            raise ValueError(f"{self.source}: the prompt reads the proprioception (its '{{proprio}}' field); "
                             "give the joints and the gripper")
        assert self.statistics is not None  # the constructor checks a proprio prompt has them
        bins = self.statistics.proprio_bins(proprio)
        return torch.cat([head, self._hf_ids[to_device(torch.from_numpy(bins), self.device)][None], tail], dim=1)

    def _cached_parts(self, instruction: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        """:meth:`_prompt_parts` of the instruction, kept while the instruction stays the same."""
        cached = self._prompt_cache
        if cached is None or cached[0] != instruction:
            cached = (instruction, self._prompt_parts(instruction))
            self._prompt_cache = cached
        return cached[1]

    def _prompt_parts(self, instruction: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The ids (1, n) of one instruction's prompt before and after its proprioception tokens
        (the whole prompt and nothing without a ``{proprio}`` field), and the position of its first
        image token."""
        before, middle, after = self.spec.format_prompt(instruction)
        encode = self.text_tokenizer
        head = list(encode(before, add_special_tokens=False)["input_ids"]) if before else []
        text = list(encode(middle, add_special_tokens=False)["input_ids"]) if middle else []
        tail = list(encode(after, add_special_tokens=False)["input_ids"]) if after else []
        appended = list(self.appended_ids)
        if not self.spec.reads_proprio:
            text, tail = text + tail, []
            if appended and text[-len(appended):] != appended:
                text += appended
        elif appended and tail[-len(appended):] != appended:
            tail += appended
        ids = [self.bos_id] + head + [self.image_token_id] * self.config.n_image_tokens + text
        n_proprio = (0 if self.statistics is None or self.statistics.proprio_q01 is None
                     else self.statistics.proprio_q01.size)
        limit = self.config.max_position_embeddings
        n_actions = self.config.n_action_tokens
        if limit is not None and len(ids) + n_proprio + len(tail) + n_actions > limit:
            raise ValueError(f"instruction too long: its prompt takes {len(ids) + n_proprio + len(tail)} positions and "
                             f"the action {n_actions} more, beyond max_position_embeddings={limit} "
                             f"({self.source}/{CONFIG_FILE}): {instruction[:80]!r}")
        return (torch.tensor([ids], dtype=torch.long, device=self.device),
                torch.tensor([tail], dtype=torch.long, device=self.device), 1 + len(head))

    def pixel_values(self, image: np.ndarray) -> torch.Tensor:
        """The model input of one RGB uint8 image (H, W, 3): resized, scaled to [0, 1] and
        normalised as the model's processor does it."""
        return self.normalised_pixels(self.resized_image(image))

    def normalised_pixels(self, resized: torch.Tensor) -> torch.Tensor:
        """The model input of a :meth:`resized_image`."""
        return self.modules.normalised_pixels(resized)

    def resized_image(self, image: np.ndarray) -> torch.Tensor:
        """(1, 3, S, S) float32 on the 0..255 scale, on the CPU: one RGB uint8 image (H, W, 3)
        resized to the model's size, before normalisation."""
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3
                and image.shape[2] == 3 and image.shape[0] > 0 and image.shape[1] > 0):
            shape, dtype = getattr(image, "shape", None), getattr(image, "dtype", type(image).__name__)
            raise ValueError(f"the observation image must be an (H, W, 3) uint8 array, "
                             f"got shape {shape}, dtype {dtype}")
        return self.modules.resized_image(image)

    def prompt_pass(self, obs: Observation, tokens: torch.Tensor | None,
                    features: torch.Tensor | None = None) -> tuple[torch.Tensor, CacheSlot]:
        """Final hidden states (1, L [+ k], d) of the prompt [and the checked action tokens (1, k)],
        and their cache: the forward that :meth:`prefill_batch` runs.
        ``features`` (1, n_image_tokens, d), :meth:`image_features` of this image already computed,
        take the image tokens' places instead of running the tower again."""
        ids = self.prompt_ids(obs.instruction, obs.proprio)
        if tokens is not None and tokens.shape[1]:
            ids = torch.cat([ids, self.hf_action_ids(tokens)], dim=1)
        held = [] if tokens is None else tokens[0].tolist()
        if self.static is not None:
            if features is None:
                features = self.image_features(self.pixel_values(obs.image))
            start = self._cached_parts(obs.instruction)[2]  # the image tokens' places: one slice, no search
            embeddings = self.embed_ids(ids)
            embeddings[:, start:start + features.shape[1]] = features.to(embeddings.dtype)
            static_cache = self.static.claim(ids.shape[1] + self.config.n_action_tokens)
            return self.static.run(static_cache, embeddings), CacheSlot(static_cache, held)
        cache = self.new_cache()
        if features is None:
            hidden = self._forward(ids, self.pixel_values(obs.image), cache)
        else:
            hidden = self._text_after_cache(self._embeddings_with_image(ids, features), cache)
        return hidden, CacheSlot(cache, held)

    def new_cache(self) -> Any:
        """An empty KV cache for the text model (transformers' DynamicCache)."""
        return self.modules.new_cache()

    def extend(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """Final hidden states (1, q, d) over text ids (1, q) right after the cache's positions, which
        then include them: a fixed-shape pass on the fast path's cache, the model's forward on
        transformers'."""
        if isinstance(cache, StaticKVCache):
            assert self.static is not None  # only the fast path makes these caches
            return self.static.run(cache, self.embed_ids(ids))
        return self._forward(ids, None, cache)

    def hf_action_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """The HF ids (1, k) of our action tokens (1, k)."""
        return self._hf_ids[tokens.to(self.device)]

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (1, n, d) of text ids (1, n)."""
        return self.modules.embed_ids(ids)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(1, n_image_tokens, d): what the model puts in place of the image tokens for the model
        input ``pixels``: the vision tower(s), feature selection and projector (one CUDA graph on a GPU)."""
        if self._image_graphs is not None:
            return self._image_graphs(pixels)
        return self.modules.image_features(pixels)

    def forward_embeddings(self, embeddings: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                           attention_mask: torch.Tensor) -> torch.Tensor:
        """The model's base over input embeddings (1, q, d) at ``position_ids`` (1, q), after the
        cache's rows, under a 4D additive ``attention_mask`` (1, 1, q, cached + q) that replaces
        the causal one: final hidden states (1, q, d)."""
        return self.modules.forward_embeddings(embeddings, cache, position_ids, attention_mask)

    def _forward(self, ids: torch.Tensor, pixels: torch.Tensor | None, cache: Any) -> torch.Tensor:
        """The model's base (everything but the LM head) over ``ids`` after the cache's positions."""
        return self.modules.forward(ids, pixels, cache)

    def _embeddings_with_image(self, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return embeddings_with_image(self.modules, ids, features)

    def _text_after_cache(self, embeddings: torch.Tensor, cache: Any) -> torch.Tensor:
        return self.modules.text_after_cache(embeddings, cache)

    def action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., 256) float32 logits of our bins from final hidden states (..., d): the LM head's
        action rows (exact for those logits; the draft head reads its predictions with it too)."""
        logits = hidden.float() @ self._head_weight.T
        if self._head_bias is not None:
            logits = logits + self._head_bias
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` on the model's device; ValueError unless they are (1, k) int64 bins."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens must be a (1, k) tensor, got {tuple(getattr(tokens, 'shape', ()))}")
        if tokens.dtype != torch.long:
            raise ValueError(f"tokens must be int64, got {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= N_BINS):
            raise ValueError(f"action tokens must lie in [0, {N_BINS})")
        return tokens if tokens.device == self.device else to_device(tokens, self.device)

    def _no_tokens(self) -> torch.Tensor:
        return torch.empty(1, 0, dtype=torch.long, device=self.device)
