"""SmolVLA natively: transformers' SmolVLM (vision tower, connector, the first ``num_vlm_layers``
Llama text layers) and an action expert of Llama layers, run as LeRobot runs them.

- Prefix: each camera's image (resized with padding on the left and top, mapped to [-1, 1])
  through the vision tower and the connector, x sqrt(width); the language tokens' embeddings x
  sqrt(width); one state token ``state_proj(state)``. Images and language attend to each other
  bidirectionally, the state sees them, nothing in the prefix sees the state. Padding does not
  advance positions.
- RoPE with base 10000 on split halves, computed in float32, whatever the VLM's rope_theta; the
  attention's scores and softmax in float32 (eager, never a fused kernel), masked scores at
  float32's minimum.
- The prefix runs once per chunk and leaves each layer's post-RoPE keys and values
  (:class:`PrefixKV`). A flow step runs only the expert over the chunk's action tokens: in a
  self-attention layer (every ``self_attn_every_n_layers``-th) the expert's own keys and values
  join the prefix's and the actions attend causally; in a cross-attention layer the expert's
  ``k_proj``/``v_proj`` map the VLM's cached keys and values (already rotated, not rotated again)
  and the action queries are rotated with positions counted from 0.

Every op keeps LeRobot's order and dtypes, so a checkpoint saved with a bfloat16 VLM and expert
and float32 projections computes as LeRobot computes it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.models.lerobot.config import LeRobotConfig, intermediate_size


def apply_rope(x: torch.Tensor, positions: torch.Tensor, max_wavelength: float = 10_000.0) -> torch.Tensor:
    """RoPE on split halves of x (B, L, H, D) at positions (B, L), in float32, back in x's dtype."""
    half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.to(torch.float32)
    exponents = (2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32, device=x.device)
    radians = positions[..., None].to(torch.float32) / (max_wavelength ** exponents)[None, None, :]
    sin, cos = torch.sin(radians)[..., None, :], torch.cos(radians)[..., None, :]
    x1, x2 = x.split(half, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype)


def attention(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Eager GQA attention as LeRobot's SmolVLA computes it: q, k (B, L, H, D) in float32, masked
    scores at float32's minimum, softmax in float32, probabilities in v's dtype; (B, Lq, H*D)."""
    batch, _, heads, head_dim = q.shape
    groups = heads // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    scores = torch.matmul(q.to(torch.float32).transpose(1, 2), k.to(torch.float32).permute(0, 2, 3, 1))
    scores = scores * head_dim ** -0.5
    scores = torch.where(mask[:, None], scores, torch.finfo(torch.float32).min)
    probs = F.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3).reshape(batch, -1, heads * head_dim)


def make_att_2d_masks(pad_masks: torch.Tensor, att_masks: torch.Tensor) -> torch.Tensor:
    """allowed[b, i, j]: token j is valid and its block (cumulative ``att_masks``) is not after i's."""
    cumsum = torch.cumsum(att_masks.to(torch.long), dim=1)
    return (cumsum[:, None, :] <= cumsum[:, :, None]) & (pad_masks[:, None, :] & pad_masks[:, :, None])


def sinusoidal_time(t: torch.Tensor, dimension: int, min_period: float, max_period: float) -> torch.Tensor:
    """[sin, cos] features (B, dimension) of the flow time t (B,), computed in float64."""
    fraction = torch.linspace(0.0, 1.0, dimension // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angles = (1.0 / period * 2 * math.pi)[None, :] * t[:, None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


@dataclass(frozen=True, eq=False)
class PrefixKV:
    """A prefix computed once per chunk: every VLM layer's post-RoPE keys and values (B, P, Hkv, D),
    the prefix's validity mask (B, P) and the number of valid tokens (B, 1): the first action's
    position; and the last layer's output (a trainer's auxiliary probe reads it)."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    pad_masks: torch.Tensor
    n_valid: torch.Tensor
    last_input: torch.Tensor | None = None  # the last VLM layer's input (B, P, width): behind its keys and values

    @property
    def length(self) -> int:
        return int(self.pad_masks.shape[1])


def _layer_block(layer: Any, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """o_proj, residual, post-attention norm, MLP, residual: the rest of a decoder layer."""
    attended = attended.to(layer.self_attn.o_proj.weight.dtype)
    out = layer.self_attn.o_proj(attended)
    out += hidden
    residual = out.clone()
    out = layer.mlp(layer.post_attention_layernorm(out))
    out += residual
    return out


def _qkv(layer: Any, hidden: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = layer.input_layernorm(hidden)
    shape = (*x.shape[:-1], -1, head_dim)
    x = x.to(dtype=layer.self_attn.q_proj.weight.dtype)
    return (layer.self_attn.q_proj(x).view(shape), layer.self_attn.k_proj(x).view(shape),
            layer.self_attn.v_proj(x).view(shape))


class SmolVLAModel(nn.Module):
    """SmolVLA's networks, named as LeRobot's ``model.`` prefix names them (the module docstring)."""

    def __init__(self, config: LeRobotConfig, vlm_config: Any) -> None:
        from transformers import AutoModel, SmolVLMModel

        super().__init__()
        self.config = config
        vlm_config = copy.deepcopy(vlm_config)
        text = vlm_config.text_config
        if config.num_vlm_layers > 0:
            text.num_hidden_layers = config.num_vlm_layers
        self.vlm = SmolVLMModel(vlm_config)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        expert_config = copy.deepcopy(text)
        expert_width = int(text.hidden_size * config.expert_width_multiplier)
        expert_config.hidden_size = expert_width
        expert_config.intermediate_size = intermediate_size(expert_width)
        expert_config.head_dim = self.head_dim
        n_layers = text.num_hidden_layers
        expert_config.num_hidden_layers = config.num_expert_layers if config.num_expert_layers > 0 else n_layers
        if n_layers % expert_config.num_hidden_layers:
            raise ValueError(f"{config.path}: num_expert_layers {config.num_expert_layers} does not divide the "
                             f"VLM's {n_layers} layers")
        expert_config.vocab_size, expert_config.pad_token_id = 1, None  # the expert has no embedding
        self.expert = AutoModel.from_config(expert_config)
        self.expert.embed_tokens = None
        kv_width = text.num_key_value_heads * self.head_dim
        for index in self.cross_layers():
            attn = self.expert.layers[index].self_attn
            bias = bool(getattr(expert_config, "attention_bias", False))
            attn.k_proj = nn.Linear(kv_width, kv_width, bias=bias)
            attn.v_proj = nn.Linear(kv_width, kv_width, bias=bias)
        width = text.hidden_size
        self.state_proj = nn.Linear(config.max_state_dim, width)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert_width)
        self.action_out_proj = nn.Linear(expert_width, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * expert_width, expert_width)
        self.action_time_mlp_out = nn.Linear(expert_width, expert_width)
        self.expert_width = expert_width

    # --- structure ------------------------------------------------------------------------
    def expert_layer(self, index: int) -> Any:
        """The expert layer paired with VLM layer ``index`` (None where a shallower expert skips it)."""
        every = len(self.vlm.text_model.layers) // len(self.expert.layers)
        if every > 1 and index % every:
            return None
        return self.expert.layers[index // every]

    def is_cross_layer(self, index: int) -> bool:
        n = self.config.self_attn_every_n_layers
        return "cross" in self.config.attention_mode and not (n > 0 and index % n == 0)

    def cross_layers(self) -> list[int]:
        """Expert layer indices whose k_proj/v_proj read the VLM's keys and values."""
        n = self.config.self_attn_every_n_layers
        if "cross" not in self.config.attention_mode:
            return []
        return [i for i in range(len(self.expert.layers)) if not (n > 0 and i % n == 0)]

    # --- prefix ---------------------------------------------------------------------------
    def embed_images(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each camera's (B, 3, S, S) pixels in [-1, 1] -> its image tokens (B, N, width), scaled.
        The cameras go through the tower as one batch (one pass instead of one per camera)."""
        pixels = torch.cat(images)
        patch = self.vlm.config.vision_config.patch_size
        # every patch is real; made on the device (the tower's own default is made on the host)
        patches = torch.ones(pixels.shape[0], pixels.shape[-2] // patch, pixels.shape[-1] // patch, dtype=torch.bool,
                             device=pixels.device)
        hidden = self.vlm.vision_model(pixel_values=pixels.to(self.vlm.vision_model.dtype),
                                       patch_attention_mask=patches).last_hidden_state
        embedded = self.vlm.connector(hidden)
        # LeRobot scales by sqrt(width) held in the tokens' dtype; a host number, so that a CUDA graph records it
        embedded = embedded * float(torch.tensor(embedded.shape[-1] ** 0.5, dtype=embedded.dtype))
        return list(embedded.split(images[0].shape[0]))

    def embed_prefix(self, image_tokens: list[torch.Tensor], image_masks: list[torch.Tensor], lang_tokens: torch.Tensor,
                     lang_masks: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(embeddings, pad masks, block marks) of [images, language, state]: the state token alone
        starts a block (marked on the device, so that a CUDA graph can record it)."""
        embs, pads = [], []
        for tokens, mask in zip(image_tokens, image_masks, strict=True):
            embs.append(tokens)
            pads.append(mask[:, None].expand(tokens.shape[0], tokens.shape[1]))
        lang = self.vlm.text_model.get_input_embeddings()(lang_tokens)
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(lang_masks)
        embs.append(self.state_proj(state)[:, None, :])
        pads.append(torch.ones(state.shape[0], 1, dtype=torch.bool, device=state.device))
        emb, pad = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        att = torch.zeros_like(pad)
        att[:, -1] = True
        if pad.shape[1] < self.config.prefix_length:  # a fixed prefix length: zero tokens, masked
            extra = self.config.prefix_length - pad.shape[1]
            emb = F.pad(emb, (0, 0, 0, extra))
            pad, att = F.pad(pad, (0, extra)), F.pad(att, (0, extra))
        return emb, pad, att

    def embed_inputs(self, image_tokens: list[torch.Tensor], image_masks: list[torch.Tensor], lang_tokens: torch.Tensor,
                     lang_masks: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The prefix's embeddings and masks, :meth:`run_prefix`'s arguments."""
        return self.embed_prefix(image_tokens, image_masks, lang_tokens, lang_masks, state)

    @property
    def image_token_width(self) -> int:
        return int(self.vlm.text_model.config.hidden_size)

    @property
    def image_token_dtype(self) -> torch.dtype:
        return next(self.vlm.connector.parameters()).dtype

    def run_prefix(self, emb: torch.Tensor, pad: torch.Tensor, att: torch.Tensor) -> PrefixKV:
        """The VLM over the prefix: each layer's post-RoPE keys and values."""
        mask = make_att_2d_masks(pad, att)
        positions = torch.cumsum(pad, dim=1) - 1
        keys, values = [], []
        hidden = emb
        for layer in self.vlm.text_model.layers:
            q, k, v = _qkv(layer, hidden, self.head_dim)
            q, k = apply_rope(q, positions), apply_rope(k, positions)
            keys.append(k)
            values.append(v)
            last_input = hidden
            hidden = _layer_block(layer, hidden, attention(mask, q, k, v))
        # the last layer's output feeds nothing the expert reads: a training aid reads its input
        return PrefixKV(tuple(keys), tuple(values), pad, pad.sum(dim=-1, keepdim=True), last_input)

    # --- flow step ------------------------------------------------------------------------
    def embed_suffix(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The chunk's action tokens (B, H, expert width) at flow time t."""
        action = self.action_in_proj(x_t)
        time = sinusoidal_time(t, self.expert_width, self.config.min_period, self.config.max_period).to(action.dtype)
        joined = torch.cat([action, time[:, None, :].expand_as(action)], dim=2)
        return self.action_time_mlp_out(F.silu(self.action_time_mlp_in(joined)))

    def velocity(self, prefix: PrefixKV, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v(x_t, t) (B, H, max_action_dim) float32: the expert alone, over the cached prefix."""
        hidden = self.embed_suffix(x_t, t)
        batch, length = hidden.shape[:2]
        causal = torch.ones(batch, length, dtype=torch.bool, device=hidden.device)
        mask = torch.cat([prefix.pad_masks[:, None, :].expand(batch, length, prefix.length),
                          make_att_2d_masks(causal, causal)], dim=2)
        positions = prefix.n_valid + torch.cumsum(causal, dim=1) - 1
        for index in range(len(self.vlm.text_model.layers)):
            layer = self.expert_layer(index)
            if layer is None:
                continue
            if self.is_cross_layer(index):
                attended = self._cross(layer, hidden, prefix.keys[index], prefix.values[index], positions,
                                       mask[:, :, : prefix.length])
            else:
                q, k, v = _qkv(layer, hidden, self.head_dim)
                q, k = apply_rope(q, positions), apply_rope(k, positions)
                keys = torch.cat([prefix.keys[index], k.to(prefix.keys[index].dtype)], dim=1)
                values = torch.cat([prefix.values[index], v.to(prefix.values[index].dtype)], dim=1)
                attended = attention(mask, q, keys, values)
            hidden = _layer_block(layer, hidden, attended)
        out = self.expert.norm(hidden)[:, -self.config.chunk_size:]
        return self.action_out_proj(out.to(torch.float32))

    def _cross(self, layer: Any, hidden: torch.Tensor, vlm_keys: torch.Tensor, vlm_values: torch.Tensor,
               positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Cross-attention of the action tokens to the VLM's cached (rotated) keys and values."""
        attn = layer.self_attn
        x = layer.input_layernorm(hidden).to(dtype=attn.q_proj.weight.dtype)
        q = attn.q_proj(x).view(*x.shape[:-1], -1, self.head_dim)
        batch, length = vlm_keys.shape[:2]
        k = attn.k_proj(vlm_keys.to(attn.k_proj.weight.dtype).reshape(batch, length, -1))
        v = attn.v_proj(vlm_values.to(attn.v_proj.weight.dtype).reshape(batch, length, -1))
        q = apply_rope(q, positions - positions.min(dim=1, keepdim=True).values)
        return attention(mask, q, k.view(batch, length, -1, self.head_dim), v.view(batch, length, -1, self.head_dim))

    def float32_names(self) -> set[str]:
        """Parameters LeRobot keeps in float32 in a bfloat16 model: the cross-attention layers'
        fresh k/v projections (the policy's own projections are float32 anyway)."""
        return {f"expert.layers.{i}.self_attn.{p}_proj.{w}" for i in self.cross_layers() for p in "kv"
                for w in ("weight", "bias")}

    def run_prefix_rows(self, rows: torch.Tensor, emb_rows: torch.Tensor, pad: torch.Tensor, att: torch.Tensor,
                        cached: PrefixKV) -> PrefixKV:
        """The VLM over the prefix rows ``rows`` (their embeddings ``emb_rows``) alone, every other
        row's keys and values taken from ``cached`` (incremental vision's reuse); with every row
        recomputed it is :meth:`run_prefix`."""
        mask = make_att_2d_masks(pad, att)[:, rows]
        positions = (torch.cumsum(pad, dim=1) - 1)[:, rows]
        keys, values = [], []
        hidden = emb_rows
        for index, layer in enumerate(self.vlm.text_model.layers):
            q, k, v = _qkv(layer, hidden, self.head_dim)
            q, k = apply_rope(q, positions), apply_rope(k, positions)
            all_keys = cached.keys[index].index_copy(1, rows, k.to(cached.keys[index].dtype))
            all_values = cached.values[index].index_copy(1, rows, v.to(cached.values[index].dtype))
            keys.append(all_keys)
            values.append(all_values)
            hidden = _layer_block(layer, hidden, attention(mask, q, all_keys, all_values))
        return PrefixKV(tuple(keys), tuple(values), pad, pad.sum(dim=-1, keepdim=True))

    def token_grid(self) -> tuple[int, int]:
        """(tokens per image side, pixels per token side) of the image tokens."""
        vision = self.vlm.config.vision_config
        side = vision.image_size // vision.patch_size // self.vlm.config.scale_factor
        return side, vision.patch_size * self.vlm.config.scale_factor
