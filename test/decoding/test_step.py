"""A decoder's step yields the target passes it needs and whoever drives it makes them: its prefill
first (plain, or with a proposal riding along), then passes after a prefix. Driven by hand, with
the verify pass batched over several robots' prefixes, a step is ``decode`` token for token."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding import DecodeContext, DecodeResult, make_decoder
from vla_accel_ros.decoding.protocol import PassResult, TargetPass, advance
from vla_accel_ros.models import Policy
from vla_accel_ros.models.api import PolicyCapabilities

torch.set_num_threads(1)
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
Observations = Callable[..., list[Observation]]  # the conftest.py fixture


def contexts(kin: ArmKinematics, steps: int, noise: bool) -> list[DecodeContext]:
    """An episode's contexts: a filter fed the measurements so far (converging), the history
    growing, noise per step if asked."""
    out, history = [], np.zeros((0, 7), dtype=np.int64)
    g = torch.Generator().manual_seed(7)
    for step in range(steps):
        kf = JointKalmanFilter(kin, dt=0.05)
        for i in range(step + 1):
            kf.update(Q_HOME + 0.01 * i, 0.05 * i)
        token_noise = torch.rand(7, 256, generator=g).log_().neg_().log_().neg_().mul_(0.5) if noise else None
        out.append(DecodeContext(kalman=kf, step=step,
                                 joint_positions=np.stack([Q_HOME + 0.01 * i for i in range(step + 1)]),
                                 gripper_history=(1.0,) * step, token_history=history, token_noise=token_noise))
        history = np.concatenate([history, np.full((1, 7), 100 + step, dtype=np.int64)])
    return out


def by_hand(decoder: Any, policy: Any, prefix: Any, context: DecodeContext) -> DecodeResult:
    """``decoder``'s step after ``prefix``, each pass made here and said to take 1 ms."""
    steps = decoder.step(policy, context, prefix)
    pending = advance(steps, None)
    while isinstance(pending, TargetPass):
        scored = policy.score(pending.prefix, torch.tensor([pending.tokens], dtype=torch.long))
        pending = advance(steps, PassResult.alone(policy, scored.prefix, scored.logits, 1e-3))
    return pending


@pytest.mark.parametrize("name", ["ar", "sd", "kerv", "world_aware", "deadline", "kerv_released"])
def test_a_steps_first_pass_is_its_prefill_and_a_given_prefix_has_none(policy: Policy, kin: ArmKinematics,
                                                                        observations: Observations, name: str) -> None:
    context = contexts(kin, 1, noise=False)[0]
    first = advance(make_decoder(name).step(policy, context), None)
    assert isinstance(first, TargetPass) and first.prefix is None and first.tokens == ()  # step 0: nothing to propose
    prefix = policy.prefill(observations(1, seed=20)[0])
    after = advance(make_decoder(name).step(policy, context, prefix), None)
    assert isinstance(after, TargetPass) and after.prefix is prefix


def test_world_aware_proposes_inside_the_prefill_in_free_space(policy: Policy, kin: ArmKinematics) -> None:
    context = replace(contexts(kin, 3, noise=False)[2], target_clearance=0.2)
    first = advance(make_decoder("world_aware").step(policy, context), None)
    assert isinstance(first, TargetPass) and first.prefix is None
    assert first.tokens == tuple(context.token_history[-1][:6])  # no rate measured yet: the previous action


@pytest.mark.parametrize("name", ["kerv", "world_aware"])
@pytest.mark.parametrize("noise", [False, True])
def test_a_step_driven_by_hand_is_decode(policy: Policy, kin: ArmKinematics, observations: Observations, name: str,
                                        noise: bool) -> None:
    whole, split = make_decoder(name), make_decoder(name)
    for obs, context in zip(observations(6, seed=21), contexts(kin, 6, noise), strict=True):
        prefix = policy.prefill(obs)
        a, b = whole.decode(policy, prefix, context), by_hand(split, policy, prefix, context)
        np.testing.assert_array_equal(a.tokens, b.tokens, err_msg=f"step {context.step}")
        assert (a.accepted_len, a.target_passes, a.draft_passes, a.kf_filled, a.threshold) == (
            b.accepted_len, b.target_passes, b.draft_passes, b.kf_filled, b.threshold)
        np.testing.assert_array_equal(whole.kf_acceptance, split.kf_acceptance)
        np.testing.assert_array_equal(whole.hold_acceptance, split.hold_acceptance)
    assert b.timings["verify"] == pytest.approx(1.0)  # the pass's time as the caller measured it


@pytest.mark.parametrize("noise", [False, True])
def test_one_batched_pass_verifies_several_robots_proposals(policy: Policy, kin: ArmKinematics,
                                                            observations: Observations, noise: bool) -> None:
    """Each robot's own prefix row and noise; the pass for all of them at once gives each the
    tokens its own ``decode`` gives."""
    n = 3
    frames = [observations(5, seed=30 + r) for r in range(n)]
    own, shared = [make_decoder("world_aware") for _ in range(n)], [make_decoder("world_aware") for _ in range(n)]
    episodes = [contexts(kin, 5, noise) for _ in range(n)]
    for t in range(5):
        tensors = [policy.observation_tensors(frames[r][t]) for r in range(n)]
        batch = policy.prefill_tensors(*(torch.cat([x[k] for x in tensors]) for k in range(3))).prefix
        steps = [shared[r].step(policy, episodes[r][t], batch.select(r)) for r in range(n)]
        requests = [advance(step, None) for step in steps]
        assert all(isinstance(request, TargetPass) and len(request.tokens) == 6 for request in requests)
        proposals = torch.tensor([request.tokens for request in requests], dtype=torch.long)
        scored = policy.score(batch.select_rows(list(range(n))), proposals)
        for r in range(n):
            got = advance(steps[r], PassResult.alone(policy, scored.prefix.select(r), scored.logits[r : r + 1], 0.0))
            expected = own[r].decode(policy, policy.prefill(frames[r][t]), episodes[r][t])
            assert isinstance(got, DecodeResult)
            np.testing.assert_array_equal(got.tokens, expected.tokens, err_msg=f"robot {r} step {t}")


class WithoutDraftHead:
    """The policy as a policy without a draft head sees it (a Hugging Face VLA), counting passes."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def capabilities(self) -> PolicyCapabilities:
        return replace(self.policy.capabilities(), draft_head=False, parallel_draft_head=False)

    def score(self, prefix: Any, tokens: torch.Tensor) -> Any:
        self.calls["score"] += 1
        return self.policy.score(prefix, tokens)


def test_without_a_draft_head_the_first_step_is_ar_and_later_ones_one_pass(policy: Policy, kin: ArmKinematics,
                                                                           observations: Observations) -> None:
    """No previous action to propose from: the first step decodes token by token (``ar``); later
    steps propose the cheap sources' 7 tokens for one pass."""
    bare = WithoutDraftHead(policy)
    decoder, reference = make_decoder("kerv"), make_decoder("kerv")
    for obs, context in zip(observations(3, seed=40), contexts(kin, 3, noise=False), strict=True):
        prefix = policy.prefill(obs)
        steps = decoder.step(bare, context, prefix)
        request = advance(steps, None)
        assert isinstance(request, TargetPass)
        if context.step == 0:
            assert request.tokens == ()  # the target's own first token
            result = by_hand(decoder, bare, prefix, context)
            assert result.mode == "first_step_ar" and result.target_passes == 7
            reference.decode(bare, prefix, context)
            continue
        if context.step == 1:  # no rate measured yet: the previous action proposes
            assert request.tokens == tuple(context.token_history[-1][:6])
        scored = policy.score(prefix, torch.tensor([request.tokens], dtype=torch.long))
        result = advance(steps, PassResult.alone(bare, scored.prefix, scored.logits, 0.0))
        assert isinstance(result, DecodeResult) and result.draft_passes == 0 and result.target_passes == 1
        np.testing.assert_array_equal(result.tokens, reference.decode(bare, prefix, context).tokens)
