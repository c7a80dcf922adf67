"""The passes of a Hugging Face VLA over its prompts and images (:class:`HFPasses`): the prompt
``[BOS] + [image token] * n_image_tokens + prompt + appended ids``, the image resized and
normalised as the spec says, the vision tower and projector, the text model over embeddings after a
KV cache, and the LM head's 256 action rows. It runs transformers' modules, or the direct forward
(:mod:`.hf_direct`) where the spec asks for it and the model allows it.

:class:`~vla_accel_ros.models.hf.hf_vla.HFTokenVLA` is the policy made of these passes, and
:mod:`.hf_incremental` recomputes part of them from frame to frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.hf.cache import CacheSlot
from vla_accel_ros.models.hf.hf_direct import DirectLlavaForward, unsupported_reason
from vla_accel_ros.models.hf.vla_spec import CONFIG_FILE, ActionStatistics, VLASpec
from vla_accel_ros.models.tokenizer import N_BINS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

N_ACTION_TOKENS = 7


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
    n_bins: int = N_BINS


class HFPasses:
    """A loaded image-text-to-text model, its text tokenizer and its spec, checked to be an
    OpenVLA-style VLA, and the passes over its prompts (module docstring); ``source`` names the
    model in error messages, ``statistics`` bin the proprioception a prompt may read."""

    def __init__(self, model: PreTrainedModel, text_tokenizer: PreTrainedTokenizerBase, spec: VLASpec, *,
                 source: str = "<in-memory model>", statistics: ActionStatistics | None = None) -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.text_tokenizer = text_tokenizer
        self.spec = spec
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
        n_proprio = (0 if self.statistics is None or self.statistics.proprio_q01 is None
                     else self.statistics.proprio_q01.size)
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
            raise ValueError(f"the observation image must be an (H, W, 3) uint8 array, "
                             f"got shape {shape}, dtype {dtype}")
        # a read-only frame (decoded from a message) is copied: torch warns on sharing its memory
        x = torch.from_numpy(np.require(image, requirements=("C", "W"))).permute(2, 0, 1).unsqueeze(0).float()
        size = self.config.image_size
        if x.shape[-2:] != (size, size):
            mode = self.spec.resample
            x = torch.nn.functional.interpolate(x, size=(size, size), mode=mode, antialias=mode != "nearest",
                                                **({} if mode == "nearest" else {"align_corners": False}))
            x = x.clamp_(0.0, 255.0)  # bicubic overshoots; a uint8 resize would saturate
        return x

    def prompt_pass(self, obs: Observation, tokens: torch.Tensor | None,
                    features: torch.Tensor | None = None) -> tuple[torch.Tensor, CacheSlot]:
        """Final hidden states (1, L [+ k], d) of the prompt [and the checked action tokens (1, k)],
        and their cache: the forward that :meth:`prefill_batch` runs.
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


