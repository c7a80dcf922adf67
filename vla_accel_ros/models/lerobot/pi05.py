"""π0.5 natively: π0's networks (:mod:`.pi0`) with two changes, as LeRobot (after openpi) makes them.

- The state is not a token: it reaches the model as text, binned into the prompt by the
  processor (:func:`~vla_accel_ros.models.lerobot.processor.state_prompt`). The prefix is π0's
  (images and language, one bidirectional block), computed once per chunk.
- A flow step runs the expert over the chunk's action tokens ``action_in_proj(x_t)`` alone, one
  bidirectional block that sees the prefix. The flow time conditions the expert instead: its
  sinusoidal features through ``time_mlp_in``, SiLU, ``time_mlp_out``, SiLU give a condition from
  which every norm of the expert (both of each layer, and the final one) computes a scale, a shift
  and a gate (adaRMS): ``x / rms(x) * (1 + scale) + shift`` in float32, and each residual branch
  adds ``gate`` x its output. These norms have no weight of their own, only that projection
  (``dense``, kept in float32 in a bfloat16 model like every norm).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.models.lerobot.pi0 import Pi0Model
from vla_accel_ros.models.lerobot.smolvla import sinusoidal_time


class AdaptiveRMSNorm(nn.Module):
    """An RMSNorm whose scale, shift and gate are projected from a condition (module docstring)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(width, 3 * width)

    def modulate(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x normalised, scaled and shifted, in x's dtype; the gate of the branch it feeds), for x
        (B, L, width) and the condition (B, cond width)."""
        rms = torch.rsqrt(x.to(torch.float32).square().mean(dim=-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond)[:, None, :].chunk(3, dim=-1)
        out = (x * rms) * (1.0 + scale.to(torch.float32)) + shift.to(torch.float32)
        return out.to(x.dtype), gate.to(x.dtype)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.modulate(x, cond)[0]


class AdaptiveLayer(nn.Module):
    """A Gemma decoder layer (its attention and MLP) whose two norms are adaptive and whose
    residual branches are gated."""

    def __init__(self, layer: Any, width: int, eps: float) -> None:
        super().__init__()
        self.self_attn = layer.self_attn
        self.mlp = layer.mlp
        self.input_layernorm = AdaptiveRMSNorm(width, eps)
        self.post_attention_layernorm = AdaptiveRMSNorm(width, eps)

    def forward(self, hidden: torch.Tensor, *, cond: torch.Tensor, **attention: Any) -> torch.Tensor:
        normed, gate = self.input_layernorm.modulate(hidden, cond)
        attended, _ = self.self_attn(hidden_states=normed, **attention)
        hidden = hidden + attended * gate
        normed, gate = self.post_attention_layernorm.modulate(hidden, cond)
        return hidden + self.mlp(normed) * gate


class Pi05Model(Pi0Model):
    """π0.5's networks, named as LeRobot's ``model.`` prefix names them (the module docstring)."""

    def add_suffix_modules(self, width: int) -> None:
        """The time MLP, and the expert's norms made adaptive."""
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        expert: Any = self.expert
        eps = float(expert.config.rms_norm_eps)
        expert.layers = nn.ModuleList(AdaptiveLayer(layer, width, eps) for layer in expert.layers)
        expert.norm = AdaptiveRMSNorm(width, eps)

    def embed_suffix(self, state: torch.Tensor, x_t: torch.Tensor,
                     t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The chunk's action tokens (B, H, expert width) and the expert's norm condition (B, expert
        width) at flow time t; the state is in the prompt, not read here."""
        time = sinusoidal_time(t, self.expert_width, self.config.min_period, self.config.max_period).to(t.dtype)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
        return self.action_in_proj(x_t), cond
