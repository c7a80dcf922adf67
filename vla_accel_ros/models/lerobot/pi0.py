"""π0 natively: transformers' PaliGemma (SigLIP tower, projector, Gemma language model) and a Gemma
action expert, joined as LeRobot (after openpi) joins them.

- Prefix: each camera's image (resized with centred padding, mapped to [-1, 1]) through the
  tower and the projector, unscaled; the language tokens through Gemma's scaled embedding. The
  prefix attends bidirectionally; padding does not advance positions. It runs once per chunk and
  leaves a Gemma key/value cache.
- A flow step runs the expert alone over [state token, the chunk's action tokens]: the state is
  its own block, the actions one bidirectional block that also sees the state and the prefix.
  The step's keys and values are dropped from the cache afterwards, so the prefix's serve every
  step.
- Eager attention with an additive mask (0 / -2.3819763e38); Gemma's RoPE (base 10000); RMSNorm
  (1 + w) in float32. A bfloat16 checkpoint keeps the tower, the projector and every norm in
  float32, as LeRobot does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.models.lerobot.config import GEMMA_VARIANTS, LeRobotConfig
from vla_accel_ros.models.lerobot.smolvla import make_att_2d_masks, sinusoidal_time

MASK_VALUE = -2.3819763e38  # openpi's additive mask value


@dataclass(frozen=True)
class VisionShape:
    """The SigLIP tower's sizes, read from the weights' shapes (LeRobot fixes them in code)."""

    hidden: int
    layers: int
    intermediate: int
    patch: int
    image_size: int
    projection: int
    heads: int = 16  # SigLIP so400m's; not visible in the shapes


def additive_mask(allowed: torch.Tensor) -> torch.Tensor:
    return torch.where(allowed[:, None], 0.0, MASK_VALUE)


def build_configs(config: LeRobotConfig, vision: VisionShape, vocab_size: int, depth: int = 0) -> tuple[Any, Any]:
    """(PaliGemmaConfig, the expert's GemmaConfig) for the variants the config names (``depth`` > 0:
    that many layers instead of the variants', for timing a real width with fewer layers)."""
    from transformers import GemmaConfig, PaliGemmaConfig, SiglipVisionConfig

    vlm, expert = GEMMA_VARIANTS[config.paligemma_variant], GEMMA_VARIANTS[config.action_expert_variant]
    if depth > 0:
        vlm, expert = replace(vlm, depth=depth), replace(expert, depth=depth)

    def gemma(variant: Any, vocab: int) -> Any:
        return GemmaConfig(hidden_size=variant.width, intermediate_size=variant.mlp_dim,
                           num_attention_heads=variant.num_heads, num_key_value_heads=variant.num_kv_heads,
                           head_dim=variant.head_dim, num_hidden_layers=variant.depth, vocab_size=vocab,
                           hidden_activation="gelu_pytorch_tanh", pad_token_id=None, bos_token_id=None,
                           eos_token_id=None, attn_implementation="eager")

    tower = SiglipVisionConfig(hidden_size=vision.hidden, intermediate_size=vision.intermediate,
                               num_hidden_layers=vision.layers, num_attention_heads=vision.heads,
                               patch_size=vision.patch, image_size=vision.image_size,
                               projection_dim=vision.projection, vision_use_head=False,
                               attn_implementation="sdpa")  # as LeRobot leaves the tower
    text = gemma(vlm, vocab_size)
    paligemma = PaliGemmaConfig(vision_config=tower.to_dict(), text_config=text.to_dict(),
                                projection_dim=vision.projection, image_token_index=vocab_size)
    paligemma.vision_config.projection_dim = vision.projection
    paligemma._attn_implementation = "eager"
    paligemma.text_config._attn_implementation = "eager"
    paligemma.vision_config._attn_implementation = "sdpa"
    return paligemma, gemma(expert, 1)


class Pi0Model(nn.Module):
    """π0's networks, named as LeRobot's ``model.`` prefix names them (the module docstring)."""

    def __init__(self, config: LeRobotConfig, paligemma_config: Any, expert_config: Any) -> None:
        from transformers import GemmaModel, PaliGemmaModel

        super().__init__()
        self.config = config
        self.paligemma = PaliGemmaModel(paligemma_config)
        self.expert = GemmaModel(expert_config)
        self.expert.embed_tokens = None
        width = expert_config.hidden_size
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)
        self.expert_width = width
        self.add_suffix_modules(width)

    def add_suffix_modules(self, width: int) -> None:
        """π0's state projection and the MLP that joins each action token with the flow time."""
        self.state_proj = nn.Linear(self.config.max_state_dim, width)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)

    def round_rope_like_lerobot(self) -> None:
        """A bfloat16 π0 in LeRobot casts the whole model, RoPE's inverse frequencies included, to
        bfloat16: its rotations use those rounded frequencies, and so do ours."""
        for stack in (self.language_model, self.expert):
            if stack.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16:
                rotary = stack.rotary_emb
                rotary.inv_freq = rotary.inv_freq.to(torch.bfloat16).to(torch.float32)

    @property
    def language_model(self) -> Any:
        return self.paligemma.language_model

    def embed_images(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each camera's (B, 3, S, S) pixels in [-1, 1] -> its image tokens (B, N, width). The
        cameras go through the tower as one batch (one pass instead of one per camera)."""
        features = self.paligemma.get_image_features(torch.cat(images).to(torch.float32)).pooler_output
        return list(features.split(images[0].shape[0]))

    def embed_prefix(self, image_tokens: list[torch.Tensor], image_masks: list[torch.Tensor], lang_tokens: torch.Tensor,
                     lang_masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings, pad masks) of [images, language]; every prefix token is one block."""
        embs, pads = [], []
        for tokens, mask in zip(image_tokens, image_masks, strict=True):
            embs.append(tokens)
            pads.append(mask[:, None].expand(tokens.shape[0], tokens.shape[1]))
        embs.append(self.language_model.get_input_embeddings()(lang_tokens))
        pads.append(lang_masks)
        return torch.cat(embs, dim=1), torch.cat(pads, dim=1)

    def embed_inputs(self, image_tokens: list[torch.Tensor], image_masks: list[torch.Tensor], lang_tokens: torch.Tensor,
                     lang_masks: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The prefix's embeddings and masks, :meth:`run_prefix`'s arguments (the state is the suffix's)."""
        return self.embed_prefix(image_tokens, image_masks, lang_tokens, lang_masks)

    @property
    def image_token_width(self) -> int:
        return int(self.language_model.config.hidden_size)

    @property
    def image_token_dtype(self) -> torch.dtype:
        return next(self.paligemma.multi_modal_projector.parameters()).dtype

    def token_grid(self) -> tuple[int, int]:
        """(tokens per image side, pixels per token side) of the image tokens."""
        vision = self.paligemma.config.vision_config
        return vision.image_size // vision.patch_size, vision.patch_size

    def _run(self, model: Any, hidden: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
             cache: Any, cond: torch.Tensor | None = None) -> torch.Tensor:
        """A Gemma stack's layers and final norm over ``hidden``, appending to ``cache``; ``cond``:
        the condition of an adaptive stack's norms (π0.5's expert)."""
        if model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16:
            hidden = hidden.to(torch.bfloat16)
        rotary = model.rotary_emb(hidden, position_ids=positions)
        adaptive = {} if cond is None else {"cond": cond}
        for layer in model.layers:
            hidden = layer(hidden, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                           position_embeddings=rotary, **adaptive)
        return model.norm(hidden, **adaptive)  # type: ignore[no-any-return]

    def run_prefix(self, emb: torch.Tensor, pad: torch.Tensor) -> PrefixCache:
        from transformers import DynamicCache

        allowed = make_att_2d_masks(pad, torch.zeros_like(pad))
        cache = DynamicCache(config=self.language_model.config)
        self._run(self.language_model, emb, additive_mask(allowed), torch.cumsum(pad, dim=1) - 1, cache)
        return PrefixCache(cache, pad, pad.sum(dim=-1, keepdim=True))

    def run_prefix_rows(self, rows: torch.Tensor, emb_rows: torch.Tensor, pad: torch.Tensor,
                        cached: PrefixCache) -> PrefixCache:
        """The language model over the prefix rows ``rows`` (their embeddings ``emb_rows``) alone,
        every other row's keys and values taken from ``cached`` (incremental vision's reuse); with
        every row recomputed it is :meth:`run_prefix`."""
        from transformers import DynamicCache

        allowed = make_att_2d_masks(pad, torch.zeros_like(pad))[:, rows]
        scatter = _RowScatter(cached.cache, rows)
        self._run(self.language_model, emb_rows, additive_mask(allowed), (torch.cumsum(pad, dim=1) - 1)[:, rows],
                  scatter)
        cache = DynamicCache(config=self.language_model.config)
        for index, (keys, values) in enumerate(scatter.layers):
            cache.update(keys, values, index)
        return PrefixCache(cache, pad, pad.sum(dim=-1, keepdim=True))

    def embed_suffix(self, state: torch.Tensor, x_t: torch.Tensor,
                     t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[state token, the chunk's action tokens] (B, 1 + H, expert width) at flow time t, and the
        expert's norm condition (π0: none)."""
        state_token = self.state_proj(state.to(torch.float32))[:, None, :]
        time = sinusoidal_time(t, self.expert_width, self.config.min_period, self.config.max_period).to(t.dtype)
        action = self.action_in_proj(x_t)
        joined = torch.cat([action, time[:, None, :].expand_as(action)], dim=2)
        actions = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(joined)))
        return torch.cat([state_token, actions], dim=1), None

    def velocity(self, prefix: PrefixCache, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v(x_t, t) (B, H, max_action_dim) float32: the expert alone, over the cached prefix."""
        suffix, cond = self.embed_suffix(state, x_t, t)
        batch, length = suffix.shape[:2]
        valid = torch.ones(batch, length, dtype=torch.bool, device=suffix.device)
        blocks = torch.zeros(batch, length, dtype=torch.bool, device=suffix.device)
        # every token before the actions (π0's state) its own block, the actions one block after them
        blocks[:, : length - self.config.chunk_size + 1] = True
        allowed = torch.cat([prefix.pad_masks[:, None, :].expand(batch, length, prefix.length),
                             make_att_2d_masks(valid, blocks)], dim=2)
        positions = prefix.n_valid + torch.cumsum(valid, dim=1) - 1
        try:
            out = self._run(self.expert, suffix, additive_mask(allowed), positions, prefix.cache, cond)
        finally:
            added = prefix.cache.get_seq_length() - prefix.length
            if added > 0:  # the prefix's keys and values serve the next step
                prefix.cache.crop(-added)
        return self.action_out_proj(out[:, -self.config.chunk_size:].to(torch.float32))


class _RowScatter:
    """A key/value cache for a pass over some prefix rows: each layer's new keys and values are
    written into those rows of the cached prefix's, and attention reads the whole prefix."""

    def __init__(self, cached: Any, rows: torch.Tensor) -> None:
        self.cached, self.rows = cached, rows
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.cached.layers[layer_idx]
        full = (layer.keys.index_copy(2, self.rows, keys.to(layer.keys.dtype)),
                layer.values.index_copy(2, self.rows, values.to(layer.values.dtype)))
        self.layers.append(full)
        return full


@dataclass(frozen=True, eq=False)
class PrefixCache:
    """A π0 prefix computed once per chunk: its Gemma cache, validity mask (B, P) and number of
    valid tokens (B, 1)."""

    cache: Any
    pad_masks: torch.Tensor
    n_valid: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.pad_masks.shape[1])
