"""The continuous action head as a decoder: ``flow10`` (teacher, 10 Euler steps) and ``flow2``
(the distilled student, 2 steps). No action tokens are decoded and no target pass is made after
the prefill: the head maps noise to the action under the prefix features. The tokens reported
are the action's bins, for bookkeeping only.

The noise comes from a generator seeded with ``seed`` at every episode start (step 0), so an
episode is reproducible; samples are clipped to the tokenizer's range, so actions stay in bounds.

The noise is correlated from step to step (``noise_correlation`` rho): n_t = rho n_(t-1) +
sqrt(1 - rho^2) e_t with fresh standard normal e_t, so every n_t is still standard normal and
every action a sample of the head's distribution, but consecutive samples pick the same side of
a two-way choice. With independent noise (rho = 0) the gripper, whose demonstrated command is
open or closed and nothing between, flipped between the two at the cube step after step and
never held a grasp long enough to lift it (see the README).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.protocol import (
    N_ACTION_TOKENS,
    DecodeContext,
    Decoder,
    DecodeResult,
    Step,
    model_free_result,
)
from vla_accel_ros.decoding.specs import DecoderSpec, FlowDecoderConfig
from vla_accel_ros.decoding.speculation import PassLedger
from vla_accel_ros.models.api import (
    PolicyLike,
    Prefix,
    as_chunk_sampling,
    as_continuous_head,
    as_guided_sampling,
)
from vla_accel_ros.models.realtime_chunking import ChunkGuide, guidance_weights


class FlowDecoder(Decoder):
    spec: ClassVar[type[DecoderSpec]] = specs.Flow10
    student: ClassVar[bool] = False

    def __init__(self, **cfg: Any) -> None:
        self.config = FlowDecoderConfig(**cfg)
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.noise: torch.Tensor | None = None  # the previous step's noise
        # real-time chunking: the previous chunk in the sampler's space and its observation's
        # stamp, and how long a step takes (an average, seconds)
        self.previous: tuple[torch.Tensor, float] | None = None
        self.step_s = 0.0

    def reset(self) -> None:
        self.previous, self.step_s = None, 0.0

    def guide(self, context: DecodeContext, horizon: int) -> ChunkGuide | None:
        """Real-time chunking's guide for a chunk of ``horizon`` steps from this step's
        observation: the previous chunk's plan for the same times, its first steps (those this
        inference takes) frozen, up to ``rtc_horizon`` steps guided; None when off or nothing to follow."""
        if self.config.rtc_horizon <= 0 or self.previous is None or len(context.joint_stamps) == 0:
            return None
        previous, stamp = self.previous
        dt = context.control_period_s
        shift = int(round((float(context.joint_stamps[-1]) - stamp) / dt))
        guided = min(self.config.rtc_horizon, horizon, len(previous) - shift)
        if shift < 0 or guided <= 0:
            return None
        target = previous[np.clip(np.arange(horizon) + shift, 0, len(previous) - 1)]
        frozen = min(int(math.ceil(self.step_s / dt)), guided)
        weights = torch.as_tensor(guidance_weights(horizon, frozen, guided), dtype=target.dtype)[:, None]
        return ChunkGuide(target[None], weights, frozen, self.config.rtc_guidance)

    def remember(self, context: DecodeContext, sample: torch.Tensor, started: float) -> None:
        """This step's chunk (sampler's space, (H, D)) for the next step's guide, and its time."""
        if self.config.rtc_horizon <= 0 or len(context.joint_stamps) == 0:
            return
        self.previous = (sample.detach(), float(context.joint_stamps[-1]))
        took = context.clock() - started
        self.step_s = took if self.step_s == 0.0 else 0.8 * self.step_s + 0.2 * took

    def next_noise(self, step: int, width: int = N_ACTION_TOKENS) -> torch.Tensor:
        """This step's (1, width) standard normal noise, correlated with the previous step's."""
        fresh = torch.randn(1, width, generator=self.generator)
        rho = self.config.noise_correlation
        if step == 0 or self.noise is None or rho == 0.0:
            self.noise = fresh
        else:
            self.noise = rho * self.noise + math.sqrt(1.0 - rho * rho) * fresh
        return self.noise

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        self.check_policy(policy)
        ledger = PassLedger(policy, context)  # no target pass after the prefill: it only times the step
        prefill = yield from ledger.prefill(prefix)
        if context.step == 0:
            self.generator.manual_seed(self.config.seed)
        if policy.capabilities().flow_chunks:
            return self._sampled_chunk(policy, context, prefill.prefix, ledger)
        head = as_continuous_head(policy)
        heads = head.flow
        noise = self.next_noise(context.step, heads.config.action_width)
        condition = head.flow_condition(prefill.prefix)
        head_start = context.clock()
        guide = self.guide(context, heads.config.horizon) if heads.config.horizon > 1 else None
        sample = heads.sample(condition, noise, student=self.student, guide=guide)
        head_ms = (context.clock() - head_start) * 1e3  # the sampler alone: its Euler steps
        if heads.config.horizon > 1:
            self.remember(context, sample[0].reshape(-1, N_ACTION_TOKENS), ledger.started)
        chunk = np.asarray(head.tokenizer.denormalise(sample[0].numpy().reshape(-1, N_ACTION_TOKENS)), dtype=float)
        tokens = head.tokenizer.encode(chunk[0])
        result = model_free_result(self.name, chunk[0], tokens, {"head": head_ms, "decode": ledger.decode_ms()})
        # A chunked head (horizon > 1) hands the controller every step of its chunk.
        return replace(result, chunk=chunk) if len(chunk) > 1 else result

    def _sampled_chunk(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix,
                       ledger: PassLedger) -> DecodeResult:
        """A flow VLA's chunk (``flow_chunks``): fresh noise of the policy's shape, the policy's own
        step count (``flow10``) or 2 steps (``flow2``): its fitted 2-step sampler when it has one
        (``vla-accel train-flow``), else 2 Euler steps of the same field. The controller gets the
        chunk's first ``n_action_steps``; real-time chunking's guide keeps all of it."""
        sampler = as_chunk_sampling(policy)
        noise = torch.randn(sampler.noise_shape(), generator=self.generator)
        steps = 2 if self.student else int(policy.config.num_steps)
        head_start = context.clock()
        # a model sampled here takes a guide; a policy server's chunk does not
        guided = self.config.rtc_horizon > 0 and policy.capabilities().chunk_guidance
        guide = self.guide(context, sampler.noise_shape()[0]) if guided else None
        if self.student:  # the policy's fitted 2-step sampler, when it has one (vla-accel train-flow)
            chunk = sampler.sample_chunk(prefix, noise, steps, guide, student=True)
        else:
            chunk = sampler.sample_chunk(prefix, noise, steps, guide)
        head_ms = (context.clock() - head_start) * 1e3
        if guided:
            self.remember(context, as_guided_sampling(policy).sample_space(chunk), ledger.started)
        tokens = np.zeros(N_ACTION_TOKENS, dtype=np.int64)  # no action tokens: bookkeeping only
        result = model_free_result(self.name, chunk[0], tokens, {"head": head_ms, "decode": ledger.decode_ms()})
        # LeRobot's select_action executes the chunk's first n_action_steps, then samples anew
        return replace(result, chunk=chunk[: policy.config.n_action_steps])


class Flow2Decoder(FlowDecoder):
    spec = specs.Flow2
    student = True
