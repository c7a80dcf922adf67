"""kerv and world_aware split their decoding after the prefill around its one verify pass
(``split_verify``): ``propose_after_prefill``, the pass, ``finish_verified``. Run by hand, or with
the pass batched over several robots' prefixes, that is ``decode`` token for token."""

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
from vla_accel_ros.decoding.protocol import PendingVerify
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
        out.append(DecodeContext(kalman=kf, step=step, joint_positions=np.stack([Q_HOME + 0.01 * i for i in range(step + 1)]),
                                 gripper_history=(1.0,) * step, token_history=history, token_noise=token_noise))
        history = np.concatenate([history, np.full((1, 7), 100 + step, dtype=np.int64)])
    return out


def by_hand(decoder: Any, policy: Any, prefix: Any, context: DecodeContext) -> DecodeResult:
    step = decoder.propose_after_prefill(policy, prefix, context)
    if isinstance(step, DecodeResult):
        return step
    return decoder.finish_verified(policy, step, policy.score(prefix, torch.from_numpy(step.tokens[None])), context, 1e-3)


def test_kerv_and_world_aware_declare_the_split_and_deadline_does_not() -> None:
    assert make_decoder("kerv").capabilities().split_verify
    assert make_decoder("world_aware").capabilities().split_verify
    for name in ("deadline", "sd", "ar", "kerv_released"):  # deadline is a kerv that decodes in rounds
        assert not make_decoder(name).capabilities().split_verify, name


@pytest.mark.parametrize("name", ["kerv", "world_aware"])
@pytest.mark.parametrize("noise", [False, True])
def test_the_split_steps_are_decode(policy: Policy, kin: ArmKinematics, observations: Observations, name: str,
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
        steps = [shared[r].propose_after_prefill(policy, batch.select(r), episodes[r][t]) for r in range(n)]
        assert all(isinstance(step, PendingVerify) and step.tokens.shape == (6,) for step in steps)
        scored = policy.score(batch.select_rows(list(range(n))), torch.from_numpy(np.stack([s.tokens for s in steps])))
        for r in range(n):
            row = type(scored)(scored.logits[r : r + 1], scored.prefix.select(r))
            got = shared[r].finish_verified(policy, steps[r], row, episodes[r][t])
            expected = own[r].decode(policy, policy.prefill(frames[r][t]), episodes[r][t])
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


def test_without_a_draft_head_the_first_step_comes_back_finished(policy: Policy, kin: ArmKinematics,
                                                                 observations: Observations) -> None:
    """No previous action to propose from: the first step decodes token by token (``ar``) inside
    ``propose_after_prefill``; later steps propose the cheap sources' 7 tokens for one pass."""
    bare = WithoutDraftHead(policy)
    decoder, reference = make_decoder("kerv"), make_decoder("kerv")
    for obs, context in zip(observations(3, seed=40), contexts(kin, 3, noise=False), strict=True):
        prefix = policy.prefill(obs)
        step = decoder.propose_after_prefill(bare, prefix, context)
        if context.step == 0:
            assert isinstance(step, DecodeResult) and step.mode == "first_step_ar"
            reference.decode(bare, prefix, context)
            continue
        assert isinstance(step, PendingVerify)
        if context.step == 1:  # no rate measured yet: the previous action proposes
            np.testing.assert_array_equal(step.tokens, context.token_history[-1][:6])
        result = decoder.finish_verified(bare, step, policy.score(prefix, torch.from_numpy(step.tokens[None])), context)
        assert result.draft_passes == 0 and result.target_passes == 1
        np.testing.assert_array_equal(result.tokens, reference.decode(bare, prefix, context).tokens)
