"""A continuous action head on the target's prefix features: rectified flow, Euler sampling.

The head reads the target's prefix state (the final-norm hidden state at BOS, which already
predicts the first action token, and the mean over the prefix) and turns Gaussian noise into a
7-D action (with ``horizon`` H > 1: a chunk of H actions for consecutive action steps, a chunked
policy) in the tokenizer's normalised space ([-1, 1] between each dimension's q01 and q99) by
integrating a learned velocity field from t = 0 (noise) to t = 1 (action).

- teacher: trained by flow matching (x_t = (1 - t) x0 + t x1, target velocity x1 - x0), sampled
  with ``teacher_steps`` (10) Euler steps;
- student: distilled to reproduce the teacher's 10-step sample from the same noise in
  ``student_steps`` (2) Euler steps; the same network initialised from the teacher, or a narrower
  one (``student_hidden``), whose weights stay in cache after the prefill has run.

Sampling folds the constant parts of the first layer out of the Euler loop: the condition's
projection is computed once per sample and the time features' projection once per step count, so
a step is the action's projection plus the MLP (the same arithmetic as ``forward``).

Samples are clipped to [-1, 1], so an action never leaves the tokenizer's range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.core.json_config import JsonConfig
from vla_accel_ros.models.realtime_chunking import ChunkGuide, guided_euler
from vla_accel_ros.models.tokenizer import ACTION_DIM


@dataclass(frozen=True)
class FlowHeadConfig(JsonConfig):
    d_model: int = 128  # the target's width; the condition is 2 * d_model wide
    hidden: int = 256
    layers: int = 3
    time_features: int = 32
    teacher_steps: int = 10
    student_steps: int = 2
    student_hidden: int = 0  # the student's MLP width; 0 = the teacher's
    horizon: int = 1  # actions per sample: a chunk for this many consecutive action steps
    cameras: int = 1  # image slots: the condition holds the target's prefix features of each camera's image

    @property
    def condition_width(self) -> int:
        """Width of the condition: 2 * d_model per image slot."""
        return 2 * self.d_model * self.cameras

    @property
    def action_width(self) -> int:
        """The flow's sample width: ``horizon`` 7-D actions, flattened."""
        return self.horizon * ACTION_DIM

    def __post_init__(self) -> None:
        if not isinstance(self.student_hidden, int) or self.student_hidden < 0:
            raise ValueError(f"FlowHeadConfig.student_hidden must be an int >= 0, got {self.student_hidden!r}")
        for name in ("d_model", "hidden", "layers", "time_features", "teacher_steps", "student_steps", "horizon",
                     "cameras"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"FlowHeadConfig.{name} must be a positive int, got {value!r}")
        if self.time_features % 2:
            raise ValueError(f"FlowHeadConfig.time_features must be even, got {self.time_features}")


class VelocityField(nn.Module):
    """v(x_t, t | condition): an MLP over [x_t ; sinusoidal features of t ; condition]."""

    def __init__(self, config: FlowHeadConfig, hidden: int | None = None) -> None:
        super().__init__()
        self.config = config
        hidden = hidden or config.hidden
        width = config.action_width + config.time_features + config.condition_width
        layers: list[nn.Module] = []
        for _ in range(config.layers):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, config.action_width))
        self.net = nn.Sequential(*layers)
        half = config.time_features // 2
        self.register_buffer("frequencies", torch.exp(torch.arange(half) * (-math.log(1000.0) / half)),
                             persistent=False)
        self._folded_cache: tuple[tuple[int, int, int], tuple[torch.Tensor, ...]] | None = None

    def time_features(self, t: torch.Tensor) -> torch.Tensor:
        angles = t[:, None] * 1000.0 * self.frequencies
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        """x (B, 7H), t (B,), condition (B, 2d * cameras) -> velocity (B, 7H)."""
        return self.net(torch.cat([x, self.time_features(t), condition], dim=-1))

    def _folded(self, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Wx^T, Wc^T, per-step bias (steps, hidden)) of the first layer split by input:
        [x ; time ; condition] W^T + b = x Wx^T + condition Wc^T + (time Wt^T + b). Kept while the
        weights are unchanged and no gradient is wanted (their version counters tell)."""
        first = self.net[0]
        key = (steps, _version(first.weight), _version(first.bias))
        if not torch.is_grad_enabled() and self._folded_cache is not None and self._folded_cache[0] == key:
            return self._folded_cache[1]
        a, tf = self.config.action_width, self.config.time_features
        times = torch.arange(steps, dtype=first.weight.dtype, device=first.weight.device) / steps
        folded = (first.weight[:, :a].T, first.weight[:, a + tf :].T,
                  F.linear(self.time_features(times), first.weight[:, a : a + tf], first.bias))
        if not torch.is_grad_enabled():
            self._folded_cache = (key, tuple(t.detach().clone() for t in folded))
            return self._folded_cache[1]
        return folded

    def euler(self, condition: torch.Tensor, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """``steps`` Euler steps from the noise at t = 0 to t = 1 (unclipped): ``forward`` with the
        constant parts of the first layer computed once, outside the loop."""
        weight_x, weight_c, per_step = self._folded(steps)
        hidden, last = list(self.net)[2:-1], self.net[-1]
        constant = condition @ weight_c  # (B, hidden)
        x, dt = noise, 1.0 / steps
        for i in range(steps):
            h = F.gelu(torch.addmm(constant + per_step[i], x, weight_x))
            for layer in hidden:
                h = layer(h)
            x = x + dt * last(h)
        return x


def _version(tensor: torch.Tensor) -> int:
    """In-place update counter (tensors made under inference mode keep none: -1)."""
    return -1 if tensor.is_inference() else tensor._version


def euler_sample(field: VelocityField, condition: torch.Tensor, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """Integrate dx/dt = v from the noise (t = 0) to t = 1 in ``steps`` Euler steps, clipped to [-1, 1]."""
    return field.euler(condition, noise, steps).clamp(-1.0, 1.0)


def flow_matching_loss(field: VelocityField, condition: torch.Tensor, actions: torch.Tensor,
                       generator: torch.Generator) -> torch.Tensor:
    """Rectified-flow loss for normalised actions (B, 7H)."""
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
        self.student = VelocityField(config, config.student_hidden or config.hidden)

    def sample(self, condition: torch.Tensor, noise: torch.Tensor, student: bool,
               guide: ChunkGuide | None = None) -> torch.Tensor:
        """Normalised actions (B, 7H) in [-1, 1] from the condition (B, 2d) and noise (B, 7H);
        with ``guide`` (its target (B, H, 7)), real-time chunking's guided sampler."""
        field = self.student if student else self.teacher
        steps = self.config.student_steps if student else self.config.teacher_steps
        if guide is None:
            return euler_sample(field, condition, noise, steps)
        batch, width = noise.shape

        def velocity(x: torch.Tensor, tau: float) -> torch.Tensor:  # the condition cloned: no inference tensor
            t = torch.full((batch,), tau, dtype=x.dtype)
            return field(x.reshape(batch, width), t, condition.clone()).reshape(x.shape)

        shaped = noise.reshape(batch, width // ACTION_DIM, ACTION_DIM)
        return guided_euler(velocity, shaped, steps, guide).reshape(batch, width).clamp(-1.0, 1.0)


def prefix_condition(hidden_last: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """The head's condition from a prefix: BOS hidden state and prefix mean, (B, 2d)."""
    return torch.cat([hidden_last, pooled], dim=-1)


def camera_condition(condition: torch.Tensor, cameras: int) -> torch.Tensor:
    """Rows of per-image conditions (B * cameras, 2d), each observation's cameras consecutive,
    as one condition per observation (B, 2d * cameras), the cameras in slot order."""
    return condition.reshape(condition.shape[0] // cameras, cameras * condition.shape[1])
