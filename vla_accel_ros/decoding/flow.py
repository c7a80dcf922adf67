"""The continuous action head as a decoder: ``flow10`` (teacher, 10 Euler steps) and ``flow2``
(the distilled student, 2 steps). No action tokens are decoded and no target pass is made after
the prefill: the head maps noise to the action under the prefix features. The tokens reported
are the action's bins, for bookkeeping only.

The noise comes from a generator seeded with ``seed`` at every episode start (step 0), so an
episode is reproducible; samples are clipped to the tokenizer's range, so actions stay in bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vla_accel_ros.decoding.base import N_ACTION_TOKENS, DecodeContext, DecodeResult, PolicyLike, model_free_result
from vla_accel_ros.models.flow import prefix_condition


@dataclass(frozen=True)
class FlowDecoderConfig:
    seed: int = 0


class FlowDecoder:
    name = "flow10"
    student = False

    def __init__(self, **cfg: Any) -> None:
        self.config = FlowDecoderConfig(**cfg)
        self.generator = torch.Generator().manual_seed(self.config.seed)

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult:
        heads = getattr(policy, "flow", None)
        if heads is None:
            raise ValueError(
                f"decoder '{self.name}' needs a checkpoint with a continuous action head (vla-accel train-flow)"
            )
        started = context.clock()
        if context.step == 0:
            self.generator.manual_seed(self.config.seed)
        noise = torch.randn(1, N_ACTION_TOKENS, generator=self.generator)
        with torch.inference_mode():
            condition = prefix_condition(prefix.hidden_last, prefix.pooled)
            head_start = context.clock()
            sample = heads.sample(condition, noise, student=self.student)
            head_ms = (context.clock() - head_start) * 1e3  # the sampler alone: its Euler steps
        action = policy.tokenizer.denormalise(sample[0].numpy())
        return model_free_result(
            self.name, np.asarray(action, dtype=float), policy.tokenizer.encode(action),
            {"head": head_ms, "decode": (context.clock() - started) * 1e3},  # read last: the encoding is counted
        )


class Flow2Decoder(FlowDecoder):
    name = "flow2"
    student = True
