"""Real-time chunking for flow policies (after Black et al., 2025, "Real-time execution of action
chunking flow policies").

A chunk is sampled while the previous one still executes. By the time it arrives, its first
``frozen`` steps have run from the previous chunk, and the steps after those should continue the
previous chunk's plan rather than jump to a new one. The sampler is therefore guided:

- **frozen prefix**: the first ``frozen`` steps are the previous chunk's own, set after sampling
  (and weighted fully while sampling, so that the steps after them fit on);
- **guided inpainting**: the steps up to ``guided`` are pulled towards the previous chunk's plan
  for the same times, with a weight that decays from 1 to 0 (:func:`guidance_weights`); the steps
  after them are free. At each Euler step the predicted end point ``x + (1 - tau) v`` is compared
  with the target, and the velocity is corrected by the weighted error pulled back through the
  velocity field (a vector-Jacobian product), its gain capped at ``max_guidance``.

Time runs from the noise (tau = 0) to the actions (tau = 1). Torch only; no robot here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ChunkGuide:
    """What the next chunk is guided towards, in the sampler's own space (normalised actions).

    ``target`` and ``weights`` have the sample's shape (B, H, D) or broadcast to it; ``frozen``
    is the count of leading steps (axis -2) replaced by the target's after sampling."""

    target: torch.Tensor
    weights: torch.Tensor
    frozen: int
    max_guidance: float

    def __post_init__(self) -> None:
        if self.frozen < 0:
            raise ValueError(f"frozen steps must be >= 0, got {self.frozen}")
        if not self.max_guidance >= 0.0:
            raise ValueError(f"max_guidance must be >= 0, got {self.max_guidance}")


def guidance_weights(horizon: int, frozen: int, guided: int) -> np.ndarray:
    """The weight of each of ``horizon`` steps: 1 for the first ``frozen``, then decaying
    exponentially to 0 up to step ``guided``, 0 from there on."""
    if not 0 <= frozen <= guided <= horizon:
        raise ValueError(f"need 0 <= frozen ({frozen}) <= guided ({guided}) <= horizon ({horizon})")
    weights = np.zeros(horizon)
    weights[:frozen] = 1.0
    for i in range(frozen, guided):
        c = (guided - i) / (guided - frozen + 1)
        weights[i] = c * math.expm1(c) / math.expm1(1.0)
    return weights


def guided_euler(velocity: Callable[[torch.Tensor, float], torch.Tensor], noise: torch.Tensor, steps: int,
                 guide: ChunkGuide, differentiable: bool = True) -> torch.Tensor:
    """``steps`` Euler steps of dx/dtau = ``velocity(x, tau)`` from ``noise`` (tau = 0), each
    corrected towards ``guide``; the frozen steps are then the target's (module docstring).

    ``differentiable``: the error is pulled back through the velocity field (a vector-Jacobian
    product; ``velocity`` must build a graph in x). Otherwise the end point's Jacobian is taken as
    the identity: the weighted error itself corrects the velocity (for a model whose cached prefix
    cannot take part in a backward pass). Runs outside inference mode whatever the caller's."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    dt = 1.0 / steps
    with torch.inference_mode(False):
        x = noise.clone()  # a normal tensor, even from inference mode
        for i in range(steps):
            tau = i * dt
            if differentiable:
                with torch.enable_grad():
                    x_in = x.detach().requires_grad_(True)
                    v = velocity(x_in, tau)
                    end = x_in + (1.0 - tau) * v
                    with torch.no_grad():
                        error = (guide.target - end) * guide.weights
                    (pull,) = torch.autograd.grad(end, x_in, grad_outputs=error)
                v = v.detach()
            else:
                with torch.no_grad():
                    v = velocity(x, tau)
                    pull = (guide.target - (x + (1.0 - tau) * v)) * guide.weights
            # the gain's cap: 1 / r^2 scaled by the remaining time, r^2 the variance of the end point's estimate
            r2 = (1.0 - tau) ** 2 / (tau**2 + (1.0 - tau) ** 2)
            gain = guide.max_guidance if tau == 0.0 else min(guide.max_guidance, (1.0 - tau) / (tau * r2))
            x = (x + dt * (v + gain * pull)).detach()
        if guide.frozen:
            x[..., : guide.frozen, :] = torch.broadcast_to(guide.target, x.shape)[..., : guide.frozen, :]
    return x


def guide_tensors(guide: ChunkGuide, shape: torch.Size | tuple[int, ...],
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``guide`` as the tensors :func:`guided_euler_static` takes for a sample of ``shape`` (B, H, D)
    on ``device``: the target and the weights broadcast to the shape, the frozen steps' mask
    (H, 1) and the guidance cap (a 0-d float32 tensor)."""
    horizon = shape[-2]
    target = torch.broadcast_to(guide.target.to(device=device, dtype=torch.float32), shape).contiguous()
    weights = torch.broadcast_to(guide.weights.to(device=device, dtype=torch.float32), shape).contiguous()
    frozen = (torch.arange(horizon, device=device) < guide.frozen)[:, None]
    return target, weights, frozen, torch.tensor(guide.max_guidance, dtype=torch.float32, device=device)


def guided_euler_static(velocity: Callable[[torch.Tensor, float], torch.Tensor], noise: torch.Tensor, steps: int,
                        target: torch.Tensor, weights: torch.Tensor, frozen: torch.Tensor,
                        max_guidance: torch.Tensor) -> torch.Tensor:
    """:func:`guided_euler` without the vector-Jacobian product (``differentiable=False``) with
    every value of the guide a tensor (:func:`guide_tensors`): the same kernels whatever the guide,
    so that a CUDA graph records it once per shape and replays it for any target, weights, frozen
    count and cap. The gain's cap is a device clamp, the frozen steps a device select."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    dt = 1.0 / steps
    x = noise
    for i in range(steps):
        tau = i * dt
        v = velocity(x, tau)
        pull = (target - (x + (1.0 - tau) * v)) * weights
        if tau == 0.0:
            gain = max_guidance
        else:  # as guided_euler: the cap min(max_guidance, (1 - tau) / (tau r^2))
            r2 = (1.0 - tau) ** 2 / (tau**2 + (1.0 - tau) ** 2)
            gain = max_guidance.clamp(max=(1.0 - tau) / (tau * r2))
        x = x + dt * (v + gain * pull)
    return torch.where(frozen, target, x)
