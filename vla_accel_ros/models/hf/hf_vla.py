"""A Hugging Face VLA with OpenVLA's action tokens (:class:`HFTokenVLA`), as a policy the decoders run.

The model is an image-text-to-text model (``AutoModelForImageTextToText``, e.g. Llava with a Llama
decoder: OpenVLA's layout, the image features right after BOS) whose 7 action dimensions are
tokens of its text vocabulary; :class:`vla_accel_ros.models.hf.vla_spec.VLASpec` says which, and how
the prompt, the image and the actions are made. The decoders see what they see of our own policy:

- ``prefill(obs)``: ONE forward over ``[BOS] + [image token] * n_image_tokens + prompt + appended
  ids`` (the model puts the projected vision features in place of the image tokens) -> a prefix;
- ``score(prefix, tokens)``: ONE forward over k of our action tokens (bins 0..255, mapped to HF
  ids) -> logits (1, k+1, 256) over OUR bins (index b is HF id ``vocab_size - 1 - b`` by
  default), logits[:, i] the distribution after tokens[:, :i], and the extended prefix;
- ``prefill_scored(obs, tokens)``: both in one pass; ``tokens_to_action``: OpenVLA's decoding.

The LM head runs on the 256 action rows only (exact for those logits, and the full head's cost
is the vocabulary's). Bin 255 (HF id ``vocab_size - 256``, OpenVLA's token of a value at q99) is
a real output here, unlike our own policy's: it is scored and fed as itself and decodes as bin
254, as in OpenVLA. A draft head is optional: an EAGLE-style head on the model's hidden states
(:mod:`vla_accel_ros.models.hf.hf_draft`, ``vla-accel train-draft``), loaded when its files lie beside
the weights; there is no parallel draft, contact or flow head (:meth:`HFTokenVLA.capabilities`).
:meth:`HFTokenVLA.incremental_prefill` gives the VLA-Cache-style prefill that reuses the keys and
values of unchanged image tokens between frames (:mod:`vla_accel_ros.models.hf.hf_incremental`).

Prefixes are immutable while the model's KV cache is mutated in place: every prefix made from one
prefill shares one cache, and each use of a prefix first crops the cache back to its own length
(re-feeding, in the same pass, any of its tokens that a use of another prefix overwrote), so
decoders may extend, truncate and extend again in any order.

Weights load from safetensors only; a directory with only pickle weights (``*.bin``, ``*.pt``) is
refused. transformers is imported when a model is loaded, not with this module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.capabilities import PolicyCapabilities
from vla_accel_ros.models.configuration import checkpoint_directory
from vla_accel_ros.models.hf.hf_direct import DirectLlavaForward, unsupported_reason
from vla_accel_ros.models.hf.hf_draft import HFDraftHead, load_hf_draft
from vla_accel_ros.models.hf.vla_spec import (
    CONFIG_FILE,
    ActionStatistics,
    OpenVLAActionTokenizer,
    VLASpec,
    load_action_statistics,
    load_spec,
    read_json_object,
    with_overrides,
)
from vla_accel_ros.models.tokenizer import BOS, N_BINS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from vla_accel_ros.models.configuration import VisionReuseConfig
    from vla_accel_ros.models.hf.hf_incremental import HFIncrementalPrefill

N_ACTION_TOKENS = 7
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    n_action_tokens: int = N_ACTION_TOKENS


class CacheSlot:
    """The one KV cache that a prefill and every prefix made from it share, and the action tokens
    it holds after the observation prefix (those of its latest use)."""

    __slots__ = ("cache", "tokens")

    def __init__(self, cache: Any, tokens: list[int]) -> None:
        self.cache = cache
        self.tokens = tokens


@dataclass(frozen=True, eq=False)
class HFPrefix:
    """Decoder state after the observation prefix and the action tokens consumed, as
    :class:`vla_accel_ros.models.own.policy.Prefix`: action_hidden (1, n+1, d) final hidden states at
    the prompt's end and after each of the n consumed tokens, tokens (1, n), pooled (1, d) the mean
    of the observation prefix's hidden states, prefix_len its positions, base the tokens consumed
    before the latest extension (``truncate`` counts from there). ``slot`` is the shared cache."""

    slot: CacheSlot
    action_hidden: torch.Tensor
    tokens: torch.Tensor
    pooled: torch.Tensor
    prefix_len: int
    base: int = 0

    @property
    def hidden_last(self) -> torch.Tensor:
        """(1, d) hidden state at the current end; the LM head of it gives the next token."""
        return self.action_hidden[:, -1]

    @property
    def length(self) -> int:
        return self.prefix_len + self.n_tokens

    @property
    def n_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def truncate(self, m: int) -> HFPrefix:
        """Keep the prefix as it was before the latest extension plus its first m new tokens."""
        added = self.n_tokens - self.base
        if not 0 <= m <= added:
            raise ValueError(f"truncate({m}): the latest extension added {added} tokens")
        keep = self.base + m
        return replace(self, action_hidden=self.action_hidden[:, : keep + 1], tokens=self.tokens[:, :keep])


@dataclass(frozen=True, eq=False)
class HFScoreOutput:
    """logits (1, k+1, 256) over our bins: logits[:, i] is the next-token distribution after
    tokens[:, :i]; prefix: the prefix extended by the k tokens."""

    logits: torch.Tensor
    prefix: HFPrefix


def _crop_to(cache: Any, length: int) -> None:
    """Drop the cache's positions from ``length`` on (``crop`` takes how many to remove, negated)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class HFTokenVLA:
    """A Hugging Face VLA whose actions are 7 tokens of its text vocabulary, as a
    :class:`vla_accel_ros.decoding.protocol.PolicyLike` (module docstring). Build one with
    :func:`load_hf_vla`; the constructor takes a loaded model, its text tokenizer, the spec and
    the action tokenizer (``source`` names the model in error messages). ``draft``: the optional
    draft head (:meth:`attach_draft`)."""

    flow: Any = None  # no continuous action head
    parallel_draft: Any = None  # no parallel draft head

    def __init__(self, model: PreTrainedModel, text_tokenizer: PreTrainedTokenizerBase, spec: VLASpec,
                 tokenizer: OpenVLAActionTokenizer, *, source: str = "<in-memory model>",
                 statistics: ActionStatistics | None = None) -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.text_tokenizer = text_tokenizer
        self.spec = spec
        self.tokenizer = tokenizer
        self.source = source
        self.statistics = statistics
        if spec.reads_proprio and (statistics is None or statistics.proprio_q01 is None):
            raise ValueError(f"{source}: the prompt reads the proprioception ('{{proprio}}'), but the statistics "
                             "have no proprio q01/q99 to bin it with")
        self._cache_type = DynamicCache
        config = model.config
        text_config = config.get_text_config()
        vocab_size = int(text_tokenizer.vocab_size)
        head = model.get_output_embeddings()
        if head is None or not hasattr(model, "model"):
            raise ValueError(f"{source}: {type(model).__name__} has no language-model head to read action logits from")
        try:
            action_ids = spec.action_ids(vocab_size)
        except ValueError as error:
            raise ValueError(f"{source}: not an OpenVLA-style VLA: {error}") from None
        if int(action_ids.max()) >= head.weight.shape[0]:
            raise ValueError(f"{source}: action ids up to {int(action_ids.max())} leave the model's "
                             f"{head.weight.shape[0]} output rows")
        image_token = getattr(config, "image_token_id", None)
        if image_token is None:
            image_token = getattr(config, "image_token_index", None)
        if image_token is None:
            raise ValueError(f"{source}/{CONFIG_FILE}: not a VLA: the model has no image token (image_token_id)")
        bos = text_tokenizer.bos_token_id if text_tokenizer.bos_token_id is not None else text_config.bos_token_id
        if bos is None:
            raise ValueError(f"{source}: the tokenizer has no BOS token")
        self.appended_ids = spec.resolved_appended_ids(vocab_size)
        specials = {"BOS": bos, "image token": image_token, "EOS": text_tokenizer.eos_token_id,
                    "pad": text_tokenizer.pad_token_id, "unk": text_tokenizer.unk_token_id}
        specials |= {f"appended id {i}": i for i in self.appended_ids}
        in_range = set(action_ids.tolist())
        clashes = [f"{name} ({i})" for name, i in specials.items() if i is not None and i in in_range]
        if clashes:
            raise ValueError(f"{source}: not an OpenVLA-style VLA: the action ids "
                             f"{int(action_ids.min())}..{int(action_ids.max())} include {', '.join(clashes)}")
        vision_size = getattr(getattr(config, "vision_config", None), "image_size", None)
        if vision_size is not None and int(vision_size) != spec.image_size:
            raise ValueError(f"{source}: image_size {spec.image_size} (processor config or vla_spec.json) differs "
                             f"from the vision tower's {vision_size} ({CONFIG_FILE})")
        self.bos_id, self.image_token_id = int(bos), int(image_token)
        weight = head.weight.detach()
        self.device, self.dtype = weight.device, weight.dtype
        self.action_ids = action_ids  # (256,) our bin -> HF id
        self._hf_ids = torch.from_numpy(action_ids).to(self.device)
        # The LM head's 256 action rows, gathered once; logits in float32 whatever the weights' dtype.
        self._head_weight = weight[self._hf_ids].float()
        bias = getattr(head, "bias", None)
        self._head_bias = None if bias is None else bias.detach()[self._hf_ids].float()
        self._softcap = getattr(text_config, "final_logit_softcapping", None)
        embeddings = model.get_input_embeddings()
        if embeddings is None or embeddings.weight.shape[1] != int(text_config.hidden_size):
            raise ValueError(f"{source}: {type(model).__name__} has no input embeddings of its hidden size")
        # The input embeddings of our 256 bins, gathered once: what the draft head reads of a token.
        self.action_embeddings = embeddings.weight.detach()[self._hf_ids].float()
        self.draft: HFDraftHead | None = None
        mean = torch.tensor(spec.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(spec.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        # (x / 255 - mean) / std as one multiply-add on 0..255 values
        self._pixel_scale, self._pixel_shift = 1.0 / (255.0 * std), -mean / std
        self._prompt_cache: tuple[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        # The direct forward where the spec asks for it and the model allows it (hf_direct.py).
        self.direct: DirectLlavaForward | None = None
        if not spec.direct_forward:
            forward = "transformers (direct_forward off)"
        elif unsupported := unsupported_reason(model):
            forward = f"transformers (no direct forward: {unsupported})"
        else:
            self.direct, forward = DirectLlavaForward(model), "direct"
        max_positions = getattr(text_config, "max_position_embeddings", None)
        self.config = HFVLAConfig(d_model=int(text_config.hidden_size), image_size=spec.image_size,
                                  vocab_size=vocab_size, n_image_tokens=self._count_image_tokens(),
                                  max_position_embeddings=None if max_positions is None else int(max_positions))
        self.info: dict[str, Any] = {"source": source, "unnorm_key": None if statistics is None else statistics.key,
                                     "forward": forward}

    # --- what the policy offers ---------------------------------------------------------------
    def n_parameters(self) -> dict[str, int]:
        """Parameter counts by component, as ``Policy.n_parameters`` reports them."""
        counts = {"target": sum(p.numel() for p in self.model.parameters())}
        if self.draft is not None:
            counts["draft"] = sum(p.numel() for p in self.draft.parameters())
        return counts

    def capabilities(self) -> PolicyCapabilities:
        """A draft head when one is attached; no parallel draft, contact or flow head; its own
        incremental prefill (:mod:`vla_accel_ros.models.hf.hf_incremental`)."""
        return PolicyCapabilities(draft_head=self.draft is not None, own_incremental_prefill=True)

    def incremental_prefill(self, config: VisionReuseConfig) -> HFIncrementalPrefill:
        """This VLA's own incremental prefill: what serves a runner's ``vision`` settings in place of
        the package policy's incremental vision encoder (reused keys/values only: ``config.reuse_kv``
        must be true; :mod:`vla_accel_ros.models.hf.hf_incremental`)."""
        from vla_accel_ros.models.hf.hf_incremental import HFIncrementalPrefill

        return HFIncrementalPrefill(self, config)

    def attach_draft(self, head: HFDraftHead | None) -> None:
        """Draft with ``head`` (moved to the model's device), or with none; ValueError when it
        was made for a model of another hidden size or text vocabulary."""
        if head is not None:
            config = head.config
            if config.hidden_size != self.config.d_model:
                raise ValueError(f"{self.source}: the draft head reads hidden states of size {config.hidden_size}, "
                                 f"the model's are {self.config.d_model}")
            if config.vocab_size != self.config.vocab_size:
                raise ValueError(f"{self.source}: the draft head was made for a text vocabulary of "
                                 f"{config.vocab_size} tokens, the model's has {self.config.vocab_size}")
            head = head.to(self.device)
        self.draft = head

    @property
    def n_action_tokens(self) -> int:
        return N_ACTION_TOKENS

    @property
    def image_size(self) -> int:
        return self.config.image_size

    def draft_tokens(
        self, prefix: HFPrefix, n: int, last_token: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Propose n tokens after the prefix with the draft head: (tokens (1, n), logits (1, n, 256)),
        as ``Policy.draft_tokens``. ``last_token`` (1,) is the token the prefix consumed last; None
        (or our BOS) means the start of the action. The first proposal is the LM head of
        ``prefix.hidden_last``, the target's own token; the others come from the head
        (:meth:`HFDraftHead.propose`). No target pass is run. ``noise``: the step's sampling noise
        (7, 256), each proposal then the argmax of its logits plus its dimension's noise."""
        if self.draft is None:
            raise ValueError(f"{self.source}: this Hugging Face VLA has no draft head (capabilities().draft_head "
                             "is False): train one (vla-accel train-draft), or use a decoder that proposes "
                             "without one (ar, kerv, world_aware)")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._check_last_token(prefix, last_token)
        with torch.inference_mode():
            return self.draft.propose(prefix.hidden_last, prefix.n_tokens, n, self.action_embeddings,
                                      self.action_logits, noise)

    def draft_tokens_parallel(
        self, prefix: HFPrefix, n: int, last_token: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(f"{self.source}: a Hugging Face VLA has no parallel draft head")

    def contact_probability(self, prefix: HFPrefix) -> float:
        raise ValueError(f"{self.source}: a Hugging Face VLA has no contact head")

    def tokens_to_action(self, tokens: torch.Tensor | np.ndarray) -> np.ndarray:
        """Action (7,) float64 of 7 of our tokens: OpenVLA's ``predict_action`` decoding (bin
        centre, unnormalised where the mask is true), then the spec's gripper convention."""
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.detach().cpu().numpy()
        tokens = np.asarray(tokens).reshape(-1)
        if tokens.shape != (N_ACTION_TOKENS,):
            raise ValueError(f"expected {N_ACTION_TOKENS} tokens, got shape {tokens.shape}")
        return self.tokenizer.decode(tokens)

    # --- inputs -------------------------------------------------------------------------------
    def prompt_ids(self, instruction: str, proprio: np.ndarray | None = None) -> torch.Tensor:
        """(1, L) ids of one instruction's prompt: BOS, the prompt text before the image (none in
        OpenVLA's layout), the image tokens, the prompt text after it with the proprioception
        tokens (joints then gripper, ``proprio``) where the prompt has a ``{proprio}`` field, the
        appended ids. ValueError when the prompt and an action do not fit in the context, or the
        prompt reads the proprioception and ``proprio`` is missing or bad."""
        cached = self._prompt_cache
        if cached is None or cached[0] != instruction:
            cached = (instruction, self._prompt_parts(instruction))
            self._prompt_cache = cached
        head, tail = cached[1]
        if not self.spec.reads_proprio:
            return head
        if proprio is None:
            raise ValueError(f"{self.source}: the prompt reads the proprioception (its '{{proprio}}' field); "
                             "give the joints and the gripper")
        assert self.statistics is not None  # load_hf_vla checks a proprio prompt has them
        bins = self.spec.proprio_bins(proprio, self.statistics)
        return torch.cat([head, self._hf_ids[torch.from_numpy(bins).to(self.device)][None], tail], dim=1)

    def _prompt_parts(self, instruction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids (1, n) of one instruction's prompt before and after its proprioception tokens
        (the whole prompt and nothing without a ``{proprio}`` field)."""
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
        n_proprio = 0 if self.statistics is None or self.statistics.proprio_q01 is None else self.statistics.proprio_q01.size
        limit = self.config.max_position_embeddings
        if limit is not None and len(ids) + n_proprio + len(tail) + N_ACTION_TOKENS > limit:
            raise ValueError(f"instruction too long: its prompt takes {len(ids) + n_proprio + len(tail)} positions and "
                             f"the action {N_ACTION_TOKENS} more, beyond max_position_embeddings={limit} "
                             f"({self.source}/{CONFIG_FILE}): {instruction[:80]!r}")
        return (torch.tensor([ids], dtype=torch.long, device=self.device),
                torch.tensor([tail], dtype=torch.long, device=self.device))

    def pixel_values(self, image: np.ndarray) -> torch.Tensor:
        """(1, 3, S, S) model input of one RGB uint8 image (H, W, 3): resized to the spec's size,
        scaled to [0, 1] and normalised with its mean/std."""
        return self.normalised_pixels(self.resized_image(image))

    def normalised_pixels(self, resized: torch.Tensor) -> torch.Tensor:
        """The model input (1, 3, S, S) of a :meth:`resized_image`."""
        return (resized * self._pixel_scale + self._pixel_shift).to(self.device, self.dtype)

    def resized_image(self, image: np.ndarray) -> torch.Tensor:
        """(1, 3, S, S) float32 on the 0..255 scale, on the CPU: one RGB uint8 image (H, W, 3)
        resized to the spec's size, before normalisation."""
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3
                and image.shape[2] == 3 and image.shape[0] > 0 and image.shape[1] > 0):
            shape, dtype = getattr(image, "shape", None), getattr(image, "dtype", type(image).__name__)
            raise ValueError(f"the observation image must be an (H, W, 3) uint8 array, got shape {shape}, dtype {dtype}")
        x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).unsqueeze(0).float()
        size = self.config.image_size
        if x.shape[-2:] != (size, size):
            mode = self.spec.resample
            x = torch.nn.functional.interpolate(x, size=(size, size), mode=mode, antialias=mode != "nearest",
                                                **({} if mode == "nearest" else {"align_corners": False}))
            x = x.clamp_(0.0, 255.0)  # bicubic overshoots; a uint8 resize would saturate
        return x

    # --- passes -------------------------------------------------------------------------------
    def prefill(self, obs: Observation) -> HFPrefix:
        """ONE forward over one observation's prompt (the image in place of its image tokens)."""
        with torch.inference_mode():
            hidden, slot = self.prompt_pass(obs, None)
            return HFPrefix(slot=slot, action_hidden=hidden[:, -1:], tokens=self._no_tokens(),
                            pooled=hidden.float().mean(dim=1), prefix_len=hidden.shape[1])

    def prefill_scored(self, obs: Observation, tokens: torch.Tensor) -> HFScoreOutput:
        """``score(prefill(obs), tokens)`` in ONE pass: the k action tokens (1, k) ride along with
        the prompt (causal, so the prompt's rows are the prefill's)."""
        with torch.inference_mode():
            tokens = self.check_tokens(tokens)
            hidden, slot = self.prompt_pass(obs, tokens)
            n = hidden.shape[1] - tokens.shape[1]
            prefix = HFPrefix(slot=slot, action_hidden=hidden[:, n - 1:], tokens=tokens,
                              pooled=hidden[:, :n].float().mean(dim=1), prefix_len=n)
            return HFScoreOutput(self.action_logits(prefix.action_hidden), prefix)

    def score(self, prefix: HFPrefix, tokens: torch.Tensor) -> HFScoreOutput:
        """ONE forward over k new tokens (1, k) after the prefix; logits (1, k+1, 256)."""
        with torch.inference_mode():
            tokens = self.check_tokens(tokens)
            k = tokens.shape[1]
            if k == 0:  # nothing to run: the prefix's last hidden state already predicts the next token
                return HFScoreOutput(self.action_logits(prefix.action_hidden[:, -1:]), replace(prefix, base=prefix.n_tokens))
            slot, mine, new = prefix.slot, prefix.tokens[0].tolist(), tokens[0].tolist()
            # The cache holds the tokens of its latest use; keep what this prefix shares with them
            # and re-feed the rest of the prefix's own before the new ones.
            common, held = 0, slot.tokens
            while common < min(len(mine), len(held)) and mine[common] == held[common]:
                common += 1
            _crop_to(slot.cache, prefix.prefix_len + common)
            feed = self._hf_ids[torch.tensor(mine[common:] + new, dtype=torch.long, device=self.device)]
            slot.tokens = mine + new
            hidden = self._forward(feed.unsqueeze(0), None, slot.cache)[:, -k:]
            extended = HFPrefix(slot=slot, action_hidden=torch.cat([prefix.action_hidden, hidden], dim=1),
                                tokens=torch.cat([prefix.tokens, tokens], dim=1), pooled=prefix.pooled,
                                prefix_len=prefix.prefix_len, base=prefix.n_tokens)
            return HFScoreOutput(self.action_logits(extended.action_hidden[:, -(k + 1):]), extended)

    def prompt_pass(self, obs: Observation, tokens: torch.Tensor | None,
                    features: torch.Tensor | None = None) -> tuple[torch.Tensor, CacheSlot]:
        """Final hidden states (1, L [+ k], d) of the prompt [and the checked action tokens (1, k)],
        and their cache: the forward that :meth:`prefill` and :meth:`prefill_scored` run.
        ``features`` (1, n_image_tokens, d), :meth:`image_features` of this image already computed,
        take the image tokens' places instead of running the tower again."""
        ids = self.prompt_ids(obs.instruction, obs.proprio)
        if tokens is not None and tokens.shape[1]:
            ids = torch.cat([ids, self.hf_action_ids(tokens)], dim=1)
        cache = self.new_cache()
        if features is None:
            hidden = self._forward(ids, self.pixel_values(obs.image), cache)
        else:
            hidden = self._text_after_cache(self._embeddings_with_image(ids, features), cache)
        return hidden, CacheSlot(cache, [] if tokens is None else tokens[0].tolist())

    def new_cache(self) -> Any:
        """An empty KV cache for the text model."""
        return self._cache_type(config=self.model.config.get_text_config())

    def hf_action_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """The HF ids (1, k) of our action tokens (1, k)."""
        return self._hf_ids[tokens.to(self.device)]

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (1, n, d) of text ids (1, n)."""
        return self.model.get_input_embeddings()(ids)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(1, n_image_tokens, d): what the model puts in place of the image tokens for the model
        input ``pixels`` (1, 3, S, S): the vision tower, feature selection and projector."""
        if self.direct is not None:
            return self.direct.image_features(pixels)
        out = self.model.get_image_features(pixel_values=pixels)
        features = getattr(out, "pooler_output", out)
        if isinstance(features, (list, tuple)):  # one (n, d) per image
            features = torch.stack(list(features))
        return features

    def forward_embeddings(self, embeddings: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                           attention_mask: torch.Tensor) -> torch.Tensor:
        """The model's base over input embeddings (1, q, d) at ``position_ids`` (1, q), after the
        cache's rows, under a 4D additive ``attention_mask`` (1, 1, q, cached + q) that replaces
        the causal one: final hidden states (1, q, d)."""
        if self.direct is not None:
            return self.direct.text_forward(embeddings, cache, position_ids[0], attention_mask)
        return self.model.model(inputs_embeds=embeddings, position_ids=position_ids, attention_mask=attention_mask,
                                cache=cache, use_cache=True).last_hidden_state

    def _forward(self, ids: torch.Tensor, pixels: torch.Tensor | None, cache: Any) -> torch.Tensor:
        """The model's base (everything but the LM head) over ``ids`` after the cache's positions."""
        if self.direct is not None:
            embeddings = self.embed_ids(ids) if pixels is None else self._embeddings_with_image(
                ids, self.image_features(pixels))
            return self._text_after_cache(embeddings, cache)
        inputs: dict[str, Any] = {"input_ids": ids, "cache": cache, "use_cache": True}
        if pixels is not None:
            inputs["pixel_values"] = pixels
        return self.model.model(**inputs).last_hidden_state

    def _embeddings_with_image(self, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Input embeddings (1, n, d) of ``ids`` (1, n) with the image features (1, n_image_tokens, d)
        in the image tokens' places."""
        embeddings = self.embed_ids(ids)
        embeddings[ids == self.image_token_id] = features.reshape(-1, embeddings.shape[-1]).to(embeddings.dtype)
        return embeddings

    def _text_after_cache(self, embeddings: torch.Tensor, cache: Any) -> torch.Tensor:
        """Final hidden states (1, q, d) of the text model over embeddings (1, q, d), causal, after
        the cache's rows."""
        if self.direct is None:
            return self.model.model(inputs_embeds=embeddings, cache=cache, use_cache=True).last_hidden_state
        past = cache.get_seq_length()
        return self.direct.text_forward(embeddings, cache,
                                        torch.arange(past, past + embeddings.shape[1], device=self.device))

    def action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., 256) float32 logits of our bins from final hidden states (..., d): the LM head's
        action rows (exact for those logits; the draft head reads its predictions with it too)."""
        logits = hidden.float() @ self._head_weight.T
        if self._head_bias is not None:
            logits = logits + self._head_bias
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    @staticmethod
    def _check_last_token(prefix: HFPrefix, last_token: torch.Tensor | None) -> None:
        """``last_token`` must be the prefix's last consumed token (None or BOS at the start)."""
        if last_token is None:
            if prefix.n_tokens:
                raise ValueError(f"last_token=None means the start of the action, but the prefix holds "
                                 f"{prefix.n_tokens} tokens")
            return
        if tuple(last_token.shape) != (prefix.batch_size,):
            raise ValueError(f"last_token must be (B={prefix.batch_size},), got {tuple(last_token.shape)}")
        expected = prefix.tokens[:, -1].tolist() if prefix.n_tokens else [BOS] * prefix.batch_size
        if last_token.tolist() != expected:
            raise ValueError("last_token must be the token the prefix consumed last (BOS at the start of the "
                             f"action): got {last_token.tolist()}, the prefix ends with {expected}")

    def check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` on the model's device; ValueError unless they are (1, k) int64 bins."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens must be a (1, k) tensor, got {tuple(getattr(tokens, 'shape', ()))}")
        if tokens.dtype != torch.long:
            raise ValueError(f"tokens must be int64, got {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= N_BINS):
            raise ValueError(f"action tokens must lie in [0, {N_BINS})")
        return tokens.to(self.device)

    def _no_tokens(self) -> torch.Tensor:
        return torch.empty(1, 0, dtype=torch.long, device=self.device)

    def _count_image_tokens(self) -> int:
        """Image positions per prompt: the vision features one image makes (one pass on a blank
        image; their number depends on the tower, the feature layer and the selection strategy)."""
        blank = torch.zeros(1, 3, self.spec.image_size, self.spec.image_size, device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            return int(self.image_features(blank).shape[-2])


# --- loading ----------------------------------------------------------------------------------
def check_weights(directory: Path) -> None:
    """Raise ValueError unless ``directory`` holds safetensors weights; pickle weights are never
    loaded (unpickling runs code)."""
    if any(directory.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(f"{directory}: holds only pickle weights ({', '.join(pickles)}), which are never "
                         "loaded (unpickling runs code); convert them to safetensors")
    raise ValueError(f"{directory}: no weights (*.safetensors)")


def load_hf_vla(path: Path | str, *, unnorm_key: str | None = None, device: str | None = None,
                dtype: str | None = None, draft: bool = True) -> HFTokenVLA:
    """Load the Hugging Face VLA in ``path`` (``hf:/path`` or a path): its spec
    (:func:`vla_accel_ros.models.hf.vla_spec.load_spec`), action statistics, text tokenizer and
    safetensors weights. ``unnorm_key``, ``device`` ("cpu", "cuda", ...) and ``dtype`` ("float32",
    "bfloat16", "float16") override the spec's when given (its defaults: the file's only key,
    cpu, float32). A draft head saved beside the weights (``draft_head.safetensors`` + ``.json``,
    ``vla-accel train-draft``) is attached unless ``draft`` is False (a trainer replacing it).
    Every problem is a ValueError naming the file or key at fault."""
    directory = checkpoint_directory(path)
    if not directory.is_dir():
        raise ValueError(f"{directory}: not a directory")
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"{config_path}: missing; not a Hugging Face model directory")
    config = read_json_object(config_path)
    if not isinstance(config.get("vision_config"), dict) or (
            config.get("image_token_id") is None and config.get("image_token_index") is None):
        raise ValueError(f"{config_path}: not a VLA this loader runs: no vision_config and image token "
                         "(image_token_index); the model must load as AutoModelForImageTextToText (e.g. Llava) "
                         "without remote code")
    check_weights(directory)
    spec = with_overrides(load_spec(directory), unnorm_key=unnorm_key, device=device, dtype=dtype)
    statistics = load_action_statistics(directory, spec)
    tokenizer = OpenVLAActionTokenizer.from_statistics(statistics, spec.gripper)
    try:
        torch_device = torch.device(spec.device)
    except RuntimeError as error:
        raise ValueError(f"device {spec.device!r}: {error}") from None

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    try:
        text_tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"{directory}: no usable tokenizer ({error})") from None
    try:
        model = AutoModelForImageTextToText.from_pretrained(
            directory, local_files_only=True, use_safetensors=True, dtype=TORCH_DTYPES[spec.dtype])
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ValueError(f"{directory}: the model cannot be loaded as an image-text-to-text model ({error})") from None
    policy = HFTokenVLA(model.to(torch_device), text_tokenizer, spec, tokenizer, source=str(directory),
                        statistics=statistics)
    if not draft:
        return policy
    ids = policy.action_ids
    policy.attach_draft(load_hf_draft(directory, hidden_size=policy.config.d_model, vocab_size=policy.config.vocab_size,
                                      action_ids=(int(ids[0]), int(ids[-1])), device=torch_device))
    return policy
