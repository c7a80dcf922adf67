"""Temperature sampling of the action tokens that every decoder shares: Gumbel-max with noise
fixed per (episode, control step, action dimension).

Sampling token i from softmax(logits_i / T) is the same as taking argmax(logits_i + T * g_i)
with g_i standard Gumbel noise. Drawing g once per control step, before any decoding, makes the
target's "sampled token" at a position a deterministic function of the logits there, so the
speculative decoders keep their exactness: with r = 0 they return AR's sampled tokens token for
token, and the draft heads, reading the same g, propose the sample the target is about to take.
Temperature 0 is greedy (no noise is drawn).

A greedy policy is a fixed function of the frame, so a state it does not get out of (a grasp
closed beside the cube, a cube held but not lifted) repeats until the time limit; a little
sampling lets the next step differ (see the README's policy section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vla_accel_ros.models.configuration import (
    DEFAULT_TEMPERATURE as DEFAULT_TEMPERATURE,  # re-exported beside SamplingConfig
)
from vla_accel_ros.models.configuration import MAX_TEMPERATURE
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS

if TYPE_CHECKING:  # torch is imported where noise is made: the node's parameter checks run without it
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """``temperature`` 0 = greedy; ``seed`` picks the noise stream (with the episode and step)."""

    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE}], got {self.temperature}")
        if self.seed < 0:
            raise ValueError(f"sampling seed must be >= 0, got {self.seed}")

    def token_noise(self, episode: int, step: int) -> torch.Tensor | None:
        """(7, 256) temperature-scaled Gumbel noise of one control step; None when greedy.
        The same (seed, episode, step) always gives the same noise."""
        if self.temperature == 0.0:
            return None
        import torch

        state = np.random.SeedSequence([self.seed, int(episode) & 0xFFFFFFFF, int(step)]).generate_state(2)
        generator = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        uniform = torch.rand(ACTION_DIM, N_BINS, generator=generator).clamp_(1e-12, 1.0 - 1e-7)
        return uniform.log_().neg_().log_().neg_().mul_(self.temperature)


def pick_tokens(logits: torch.Tensor, noise: torch.Tensor | None, first_position: int) -> torch.Tensor:
    """The decoded token at each of ``logits``' positions (..., k, 256): the argmax of the logits
    plus the noise of its action dimension, the k dimensions starting at ``first_position``
    (past the last dimension: the last one again)."""
    if noise is None:
        return logits.argmax(-1)
    k = logits.shape[-2]
    if first_position + k <= ACTION_DIM:  # the usual case: a slice (a view), not an index copy
        return (logits + noise[first_position : first_position + k]).argmax(-1)
    positions = [min(first_position + i, ACTION_DIM - 1) for i in range(k)]
    return (logits + noise[positions]).argmax(-1)
