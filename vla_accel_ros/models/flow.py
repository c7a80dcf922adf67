"""A continuous action head on the target's prefix features: rectified flow, Euler sampling.

The head reads the target's prefix state (the final-norm hidden state at BOS, which already
predicts the first action token, and the mean over the prefix) and turns Gaussian noise into a
7-D action in the tokenizer's normalised space ([-1, 1] between each dimension's q01 and q99) by
integrating a learned velocity field from t = 0 (noise) to t = 1 (action).

- teacher: trained by flow matching (x_t = (1 - t) x0 + t x1, target velocity x1 - x0), sampled
  with ``teacher_steps`` (10) Euler steps;
- student: the same network, initialised from the teacher and distilled to reproduce the
  teacher's 10-step sample from the same noise in ``student_steps`` (2) Euler steps.

Samples are clipped to [-1, 1], so an action never leaves the tokenizer's range.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.tokenizer import ACTION_DIM


@dataclass(frozen=True)
class FlowHeadConfig:
    d_model: int = 128  # the target's width; the condition is 2 * d_model wide
    hidden: int = 256
    layers: int = 3
    time_features: int = 32
    teacher_steps: int = 10
    student_steps: int = 2

    def __post_init__(self) -> None:
        for name in ("d_model", "hidden", "layers", "time_features", "teacher_steps", "student_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"FlowHeadConfig.{name} must be a positive int, got {value!r}")
        if self.time_features % 2:
            raise ValueError(f"FlowHeadConfig.time_features must be even, got {self.time_features}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlowHeadConfig:
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown FlowHeadConfig fields: {unknown}")
        return cls(**data)


class VelocityField(nn.Module):
    """v(x_t, t | condition): an MLP over [x_t ; sinusoidal features of t ; condition]."""

    def __init__(self, config: FlowHeadConfig) -> None:
        super().__init__()
        self.config = config
        width = ACTION_DIM + config.time_features + 2 * config.d_model
        layers: list[nn.Module] = []
        for _ in range(config.layers):
            layers += [nn.Linear(width, config.hidden), nn.GELU()]
            width = config.hidden
        layers.append(nn.Linear(width, ACTION_DIM))
        self.net = nn.Sequential(*layers)
        half = config.time_features // 2
        self.register_buffer("frequencies", torch.exp(torch.arange(half) * (-math.log(1000.0) / half)), persistent=False)

    def forward(self, x: torch.Tensor, t: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        """x (B, 7), t (B,), condition (B, 2d) -> velocity (B, 7)."""
        angles = t[:, None] * 1000.0 * self.frequencies
        return self.net(torch.cat([x, angles.sin(), angles.cos(), condition], dim=-1))


def euler_sample(field: VelocityField, condition: torch.Tensor, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """Integrate dx/dt = v from the noise (t = 0) to t = 1 in ``steps`` Euler steps, clipped to [-1, 1]."""
    x, dt = noise, 1.0 / steps
    for i in range(steps):
        t = torch.full((x.shape[0],), i * dt, dtype=x.dtype, device=x.device)
        x = x + dt * field(x, t, condition)
    return x.clamp(-1.0, 1.0)


def flow_matching_loss(field: VelocityField, condition: torch.Tensor, actions: torch.Tensor,
                       generator: torch.Generator) -> torch.Tensor:
    """Rectified-flow loss for normalised actions (B, 7)."""
    noise = torch.randn(actions.shape, generator=generator).to(actions)
    t = torch.rand(actions.shape[0], generator=generator).to(actions)
    x_t = (1.0 - t[:, None]) * noise + t[:, None] * actions
    return F.mse_loss(field(x_t, t, condition), actions - noise)


class FlowHeads(nn.Module):
    """The teacher and the distilled student, sharing one config."""

    def __init__(self, config: FlowHeadConfig) -> None:
        super().__init__()
        self.config = config
        self.teacher = VelocityField(config)
        self.student = VelocityField(config)

    def sample(self, condition: torch.Tensor, noise: torch.Tensor, student: bool) -> torch.Tensor:
        """Normalised actions (B, 7) in [-1, 1] from the condition (B, 2d) and noise (B, 7)."""
        if student:
            return euler_sample(self.student, condition, noise, self.config.student_steps)
        return euler_sample(self.teacher, condition, noise, self.config.teacher_steps)


def prefix_condition(hidden_last: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """The head's condition from a prefix: BOS hidden state and prefix mean, (B, 2d)."""
    return torch.cat([hidden_last, pooled], dim=-1)
