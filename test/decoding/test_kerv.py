"""KERV with a parallel draft head: one parallel draft call + one verify pass per action, and
drafting by the KF and the previous action at any trusted position (tiny random policy)."""

from __future__ import annotations

import itertools
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
from vla_accel_ros.decoding import DecodeContext, make_decoder
from vla_accel_ros.decoding.acceptor import checked_fill
from vla_accel_ros.decoding.kerv import (
    TcpPositions,
    kf_completion_tokens,
    update_rate,
)
from vla_accel_ros.decoding.protocol import PREFILL_VERIFIED, DecodeResult, PassResult, TargetPass, advance
from vla_accel_ros.models import ParallelDraftHead, Policy
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.own.incremental import IncrementalVisionEncoder
from vla_accel_ros.models.sampling import pick_tokens
from vla_accel_ros.runtime.runner import run_policy_step

torch.set_num_threads(1)
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
Observations = Callable[..., list[Observation]]  # the conftest.py fixture


@pytest.fixture(scope="module")
def policy(policy: Policy) -> Policy:
    """The shared tiny policy with a parallel draft head that differs from the sequential one."""
    policy.parallel_draft = ParallelDraftHead.from_sequential(policy.config, policy.draft).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in policy.parallel_draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return policy


class CountingPolicy:
    """The policy, counting its draft and score calls (everything else is passed through)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.calls: Counter[str] = Counter()
        self.requested: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def draft_tokens(self, prefix: Any, n: int, last_token: torch.Tensor | None = None,
                     noise: torch.Tensor | None = None) -> Any:
        self.calls["draft_tokens"] += 1
        return self.policy.draft_tokens(prefix, n, last_token)

    def draft_tokens_parallel(self, prefix: Any, n: int, last_token: torch.Tensor | None = None,
                              noise: torch.Tensor | None = None) -> Any:
        self.calls["draft_tokens_parallel"] += 1
        self.requested.append(n)
        return self.policy.draft_tokens_parallel(prefix, n, last_token)

    def score(self, prefix: Any, tokens: torch.Tensor) -> Any:
        self.calls["score"] += 1
        return self.policy.score(prefix, tokens)


def converged_filter(kin: ArmKinematics) -> JointKalmanFilter:
    kf = JointKalmanFilter(kin, dt=0.05)
    for i in range(6):
        kf.update(Q_HOME + np.array([0.05, -0.03, 0.02, 0.04, 0.0, 0.03, 0.0]) * i, 0.05 * i)
    return kf


def test_one_parallel_draft_call_and_one_verify_pass(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    kf = converged_filter(kin)
    contexts = [DecodeContext(),
                DecodeContext(kalman=kf, gripper_history=(0.0,), joint_positions=np.stack([Q_HOME] * 5))]
    for name, r in itertools.product(("kerv", "world_aware"), (0, 5, 15)):
        decoder = make_decoder(name, r_min=r, r_max=r)
        for obs, context in itertools.product(observations(3, seed=2), contexts):
            counting = CountingPolicy(policy)
            result = decoder.decode(counting, policy.prefill(obs), context)
            assert counting.calls == Counter(draft_tokens_parallel=1, score=1)
            assert result.target_passes == 1 and result.rounds == 1 and result.draft_passes == 7
            assert result.tokens.shape == (7,) and np.all((0 <= result.tokens) & (result.tokens <= 254))


def test_the_proposal_is_the_parallel_heads(policy: Policy, observations: Observations) -> None:
    """Accepting everything, the action is the parallel proposal; exact acceptance keeps AR's tokens
    up to and including the bonus."""
    prefix = policy.prefill(observations(1, seed=3)[0])
    loose = make_decoder("kerv", r_min=255, r_max=255).decode(policy, prefix, DecodeContext())
    np.testing.assert_array_equal(loose.tokens, policy.draft_tokens_parallel(prefix, 7)[0][0].numpy())
    assert not np.array_equal(loose.tokens, policy.draft_tokens(prefix, 7)[0][0].numpy())
    exact = make_decoder("kerv", r_min=0, r_max=0).decode(policy, prefix, DecodeContext())
    greedy = policy.greedy_decode(prefix)[0].numpy()
    np.testing.assert_array_equal(exact.tokens[: exact.accepted_len + 1], greedy[: exact.accepted_len + 1])


def test_parallel_draft_false_keeps_the_sequential_head(policy: Policy, observations: Observations) -> None:
    counting = CountingPolicy(policy)
    prefix = policy.prefill(observations(1)[0])
    result = make_decoder("kerv", parallel_draft=False).decode(counting, prefix, DecodeContext())
    assert counting.calls == Counter(draft_tokens=1, score=1) and result.draft_passes == 7


def test_the_kf_drafts_any_trusted_position_with_the_parallel_head(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    kf = converged_filter(kin)
    context = DecodeContext(kalman=kf, gripper_history=(1.0,), step=5)
    completion = kf_completion_tokens(policy, context)
    kf_tokens = completion[0]
    prefix = policy.prefill(observations(1, seed=4)[0])
    parallel = policy.draft_tokens_parallel(prefix, 7)[0][0].numpy()
    kerv = make_decoder("kerv", r_min=255, r_max=255)  # accept everything: the proposal is the action
    kerv.kf_acceptance[:] = [0.0, 0.95, 0.0, 0.95, 0.95, 0.0, 0.0]  # reliable on 1, 3 and 4, not at the end
    mask = np.array([False, True, False, True, True, False, False])
    np.testing.assert_array_equal(kerv.kf_draft_mask(completion, parallel=True), mask)
    assert not kerv.kf_draft_mask(completion, parallel=False).any()  # sequential: no trailing run
    assert kerv.draft_length(completion, parallel=True) == kerv.draft_length(completion) == 7
    counting = CountingPolicy(policy)
    result = kerv.decode(counting, prefix, context)
    assert counting.calls == Counter(draft_tokens_parallel=1, score=1) and counting.requested == [7]
    np.testing.assert_array_equal(result.tokens, np.where(mask, kf_tokens, parallel))

    # trusted at the end too: the parallel head is asked only up to the last position the KF does not take
    kerv.kf_acceptance[:] = [0.0, 0.0, 0.95, 0.0, 0.95, 0.95, 0.95]
    np.testing.assert_array_equal(np.flatnonzero(kerv.kf_draft_mask(completion, parallel=True)), [2, 4, 5, 6])
    np.testing.assert_array_equal(np.flatnonzero(kerv.kf_draft_mask(completion)), [4, 5, 6])
    counting = CountingPolicy(policy)
    result = kerv.decode(counting, prefix, context)
    assert counting.requested == [4] and result.draft_passes == 4 and result.target_passes == 1
    expected = np.concatenate([parallel[:4], kf_tokens[4:]])
    expected[2] = kf_tokens[2]
    np.testing.assert_array_equal(result.tokens, expected)


def test_deadline_drafts_with_the_parallel_head_and_prices_a_round_per_call(
    policy: Policy, observations: Observations
) -> None:
    """Every round is one parallel call; the cost of a round does not grow with its draft length."""
    decoder = make_decoder("deadline", r_min=0, r_max=0)
    counting = CountingPolicy(policy)
    prefix = policy.prefill(observations(1, seed=6)[0])
    result = decoder.decode(counting, prefix, DecodeContext())  # no deadline: rounds until done
    assert counting.calls["draft_tokens"] == 0
    assert counting.calls["draft_tokens_parallel"] == result.rounds == counting.calls["score"] == result.target_passes
    greedy = policy.greedy_decode(prefix)[0].numpy()
    np.testing.assert_array_equal(result.tokens, greedy)  # r = 0: exact speculative decoding
    assert decoder.parallel and decoder.draft_call_s is not None and decoder.draft_call_s > 0
    assert decoder.round_cost(7) == decoder.round_cost(1)
    sequential = make_decoder("deadline", parallel_draft=False, draft_step_s=0.001, verify_s=0.002)
    assert sequential.round_cost(7) > sequential.round_cost(1)


def test_the_previous_action_drafts_where_it_has_been_reliable_and_the_head_does_not_run(
    policy: Policy, observations: Observations
) -> None:
    prefix = policy.prefill(observations(1, seed=4)[0])
    own_token = int(policy.draft_tokens_parallel(prefix, 1)[0][0, 0])
    held = np.array([3, 30, 60, 90, 120, 150, 180])
    context = DecodeContext(token_history=held[None], step=5)
    kerv = make_decoder("kerv", r_min=255, r_max=255)  # accept everything: the proposal is the action
    kerv.hold_acceptance[:] = 0.95
    head_calls: list[int] = []
    hook = policy.parallel_draft.register_forward_hook(lambda *_: head_calls.append(1))
    try:
        result = kerv.decode(policy, prefix, context)
    finally:
        hook.remove()
    assert head_calls == [] and result.draft_passes == 1 and result.target_passes == 1
    np.testing.assert_array_equal(result.tokens, [own_token, *held[1:]])  # position 0 is always the target's

    kerv.hold_acceptance[4] = 0.3  # one unreliable position: the head proposes it (and only what it must)
    counting = CountingPolicy(policy)
    result = kerv.decode(counting, prefix, context)
    parallel = policy.draft_tokens_parallel(prefix, 5)[0][0].numpy()
    assert counting.requested == [5] and result.target_passes == 1
    np.testing.assert_array_equal(result.tokens, [own_token, *held[1:4], parallel[4], *held[5:]])
    assert make_decoder("kerv", hold_draft=False).draft_length(None, parallel=True, hold=held) == 7


def test_where_the_kf_and_the_previous_action_both_qualify_the_more_reliable_proposes(
    policy: Policy, kin: ArmKinematics
) -> None:
    context = DecodeContext(kalman=converged_filter(kin), gripper_history=(1.0,), step=5)
    completion = kf_completion_tokens(policy, context)
    held = (completion[0] + 7) % 255  # differs from the KF's token everywhere
    kerv = make_decoder("kerv", kf_trust=0.8, hold_trust=0.5)
    kerv.kf_acceptance[:] = [0.0, 0.9, 0.9, 0.85, 0.0, 0.0, 0.0]
    kerv.hold_acceptance[:] = [0.0, 0.95, 0.6, 0.4, 0.7, 0.0, 0.3]
    tokens, mask = kerv.cheap_proposal(completion, held, parallel=True)
    np.testing.assert_array_equal(mask, [False, True, True, True, True, False, False])
    np.testing.assert_array_equal(tokens[1:5], [held[1], completion[0][2], completion[0][3], held[4]])
    # the sequential head keeps only the trailing run of cheap positions, here none
    assert not kerv.cheap_proposal(completion, held)[1].any()


def test_the_previous_actions_record_counts_conditioned_positions_and_restarts_each_episode(
    policy: Policy, observations: Observations
) -> None:
    rate = np.zeros(7)
    held = np.array([10, 20, 30, 40, 50, 60, 70])
    argmax = np.array([11, 21, 33, 40, 50, 60, 70])
    update_rate(rate, held, argmax, n_valid=4, r=2, weight=0.5)  # positions 0..3 count
    np.testing.assert_allclose(rate, [0.5, 0.5, 0, 0.5, 0, 0, 0])
    kerv = make_decoder("kerv")
    kerv.hold_acceptance[:] = 0.9
    kerv.decode(policy, policy.prefill(observations(1, seed=4)[0]), DecodeContext(step=0))
    assert not kerv.hold_acceptance.any()  # a new episode: the record starts over


@pytest.mark.parametrize("value", [0.0, 1.5, float("nan")])
def test_hold_trust_outside_zero_one_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="hold_trust"):
        make_decoder("kerv", hold_trust=value)


def test_tcp_positions_compute_each_measurement_once_and_match_the_fk(kin: ArmKinematics) -> None:
    calls: list[int] = []

    class CountingKinematics:
        def fk(self, q: np.ndarray) -> Any:
            calls.append(1)
            return kin.fk(q)

    counting = CountingKinematics()
    path = np.stack([Q_HOME + 0.02 * i for i in range(7)])
    positions = TcpPositions()
    first = positions(counting, path[:5])
    second = positions(counting, path[2:7])  # three seen before, two new
    assert len(calls) == 5 + 2
    np.testing.assert_array_equal(second, np.array([kin.fk(q).position for q in path[2:7]]))
    np.testing.assert_array_equal(first[2:], second[:3])
    positions(CountingKinematics(), path[2:7])  # another robot: nothing carries over
    assert len(calls) == 7 + 5


def test_world_aware_keeps_the_previous_action_from_drafting_near_contact(
    policy: Policy, observations: Observations
) -> None:
    prefix = policy.prefill(observations(1, seed=4)[0])
    held = np.array([3, 30, 60, 90, 120, 150, 180])
    requested = {}
    for clearance in (0.01, 0.2):  # within 2 cm of the target, and 20 cm from it
        decoder = make_decoder("world_aware")
        decoder.hold_acceptance[:] = 0.95
        counting = CountingPolicy(policy)
        decoder.decode(counting, prefix, DecodeContext(token_history=held[None], step=5, target_clearance=clearance))
        requested[clearance] = counting.requested
    assert requested == {0.01: [7], 0.2: [1]}  # near contact the head proposes every position
    with pytest.raises(ValueError, match="hold_min_looseness"):
        make_decoder("world_aware", hold_min_looseness=1.5)


class PassCountingPolicy(CountingPolicy):
    """Also counts the two kinds of prefill."""

    def prefill(self, obs: Observation) -> Any:
        self.calls["prefill"] += 1
        return self.policy.prefill(obs)

    def prefill_batch(self, observations: Any, tokens: torch.Tensor | None = None) -> Any:
        self.calls["prefill_scored" if tokens is not None else "prefill"] += 1
        return self.policy.prefill_batch(observations, tokens)


def verified_by(decoder: Any, policy: Any, context: DecodeContext,
                make_pass: Callable[[torch.Tensor], Any]) -> tuple[DecodeResult, tuple[int, ...]]:
    """``decoder``'s step whose prefill carries its proposal, that pass made by ``make_pass`` (the
    proposal (1, 6) -> its ScoreOutput): the result and the proposal's tokens."""
    steps = decoder.step(policy, context)
    request = advance(steps, None)
    assert isinstance(request, TargetPass) and request.prefix is None and len(request.tokens) == 6
    scored = make_pass(torch.tensor([request.tokens], dtype=torch.long))
    result = advance(steps, PassResult.alone(policy, scored.prefix, scored.logits, 0.0))
    assert isinstance(result, DecodeResult)
    return result, request.tokens


def proposes_in_prefill(decoder: Any, policy: Any, context: DecodeContext) -> bool:
    """Whether ``decoder``'s step at ``context`` has a proposal ride along with its prefill."""
    request = advance(decoder.step(policy, context), None)
    return isinstance(request, TargetPass) and request.prefix is None and len(request.tokens) > 0


def prefill_verify_context(kin: ArmKinematics, held: np.ndarray, **kwargs: Any) -> DecodeContext:
    return DecodeContext(kalman=converged_filter(kin), gripper_history=(1.0,), token_history=held[None], step=5,
                         joint_positions=np.stack([Q_HOME + 0.01 * i for i in range(5)]), **kwargs)


def test_a_proposal_verified_inside_the_prefill_costs_no_pass_of_its_own(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    obs = observations(1, seed=8)[0]
    held = np.array([3, 30, 60, 90, 120, 150, 180])
    counting = PassCountingPolicy(policy)
    decoder = make_decoder("kerv", prefill_verify=True, r_min=255, r_max=255)  # accept everything
    result = run_policy_step(counting, obs, decoder, prefill_verify_context(kin, held))
    assert counting.calls == Counter(prefill_scored=1)  # no prefill of its own, no score, no draft head
    assert result.mode == PREFILL_VERIFIED and result.target_passes == 1 and result.rounds == 1
    assert result.draft_passes == 0 and result.accepted_len == 7
    np.testing.assert_array_equal(result.tokens, held)  # every position is a cheap token, the first too
    assert {"prefill", "decode", "total"} <= set(result.timings)
    # an episode's first step has no previous action: it decodes after the prefill
    counting = PassCountingPolicy(policy)
    first = run_policy_step(counting, obs, decoder, DecodeContext(kalman=converged_filter(kin)))
    assert counting.calls == Counter(prefill=1, draft_tokens_parallel=1, score=1) and first.mode == ""
    counting = PassCountingPolicy(policy)
    run_policy_step(counting, obs, make_decoder("kerv"), prefill_verify_context(kin, held))  # off by default for kerv
    assert counting.calls["prefill_scored"] == 0 and counting.calls["score"] == 1


@pytest.mark.parametrize("r", [0, 9, 40])
def test_verifying_inside_the_prefill_equals_verifying_the_same_proposal_after_it(
    policy: Policy, kin: ArmKinematics, observations: Observations, r: int
) -> None:
    """One pass or two, the same proposal gets the same verdict: accepted prefix, the target's token
    at the first rejection, the KF's tokens after it."""
    held = np.array([120, 110, 130, 127, 127, 127, 200])
    for obs in observations(4, seed=9):
        noise = torch.distributions.Gumbel(0.0, 0.5).sample((7, 256))
        context = prefill_verify_context(kin, held, token_noise=noise)
        one_pass = make_decoder("kerv", prefill_verify=True, r_min=r, r_max=r)
        fused, proposal = verified_by(one_pass, policy, context,
                                      lambda feed, obs=obs: policy.prefill_batch([obs], feed))
        two_passes = make_decoder("kerv", prefill_verify=True, r_min=r, r_max=r)
        after, _ = verified_by(two_passes, policy, context,
                               lambda feed, obs=obs: policy.score(policy.prefill(obs), feed))
        scored = policy.score(policy.prefill(obs), torch.tensor([proposal]))
        np.testing.assert_array_equal(fused.tokens, after.tokens)
        assert fused.accepted_len == after.accepted_len
        target = pick_tokens(scored.logits[0], noise, 0).numpy()
        n = fused.accepted_len
        assert np.all(np.abs(fused.tokens[:n] - target[:n]) <= r)
        if n < 7:
            assert fused.tokens[n] == target[n]  # the bonus
            completion = kf_completion_tokens(policy, context)
            np.testing.assert_array_equal(fused.tokens[n + 1 :], completion[0][n + 1 :])  # the KF's fill


def test_checked_fill_keeps_the_tokens_within_r_of_the_targets_picks_and_takes_the_picks_elsewhere() -> None:
    tokens = np.array([10, 20, 30, 40, 50, 60, 70])
    target = np.array([99, 99, 33, 90, 50, 64, 0])
    checked, kept = checked_fill(tokens, target, 2, r=4)
    np.testing.assert_array_equal(checked, [10, 20, 30, 90, 50, 60, 0])  # 40 and 70 give way; nothing before 2 moves
    assert kept == 3
    assert checked_fill(tokens, target, 7, r=0)[1] == 0  # nothing after the last position


@pytest.mark.parametrize("prefill_verify", [False, True])
def test_the_checked_fill_replaces_kf_tokens_far_from_the_targets_picks_in_the_same_pass(
    policy: Policy, kin: ArmKinematics, observations: Observations, prefill_verify: bool
) -> None:
    """With ``fill_check`` the action is the unchecked one except where a KF token lies more than r
    from the target's pick of the same pass, which then takes its place; still one target pass."""
    held = np.array([120, 110, 130, 127, 127, 127, 200])
    checked_any = False
    for obs in observations(6, seed=12):
        noise = torch.distributions.Gumbel(0.0, 0.5).sample((7, 256))
        context = prefill_verify_context(kin, held, token_noise=noise)
        results = []
        for fill_check in (False, True):
            decoder = make_decoder("kerv", prefill_verify=prefill_verify, r_min=2, r_max=2, fill_check=fill_check)
            counting = PassCountingPolicy(policy)
            if prefill_verify:
                prefill = lambda feed, counting=counting, obs=obs: counting.prefill_batch([obs], feed)  # noqa: E731
                results.append(verified_by(decoder, counting, context, prefill)[0])
            else:
                results.append(run_policy_step(counting, obs, decoder, context))
            assert results[-1].target_passes == 1
        plain, checked = results
        assert plain.accepted_len == checked.accepted_len
        n = plain.accepted_len
        np.testing.assert_array_equal(plain.tokens[: n + 1], checked.tokens[: n + 1])  # prefix and bonus agree
        changed = np.flatnonzero(plain.tokens != checked.tokens)
        assert np.all(changed > n)
        assert np.all(np.abs(plain.tokens[changed] - checked.tokens[changed]) > 2)  # only KF tokens beyond r move
        assert checked.kf_filled <= plain.kf_filled
        checked_any |= len(changed) > 0
    assert checked_any  # the check did change some fill on these observations


def test_kerv_and_world_aware_declare_the_fill_check() -> None:
    from vla_accel_ros.decoding.specs import names_with, spec_of

    assert names_with(lambda s: s.fill_check) == ("kerv", "world_aware")
    assert not spec_of("sd").fill_check and make_decoder("kerv").config.fill_check is False


def test_world_aware_verifies_inside_the_prefill_in_free_space_only(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    obs = observations(1, seed=10)[0]
    held = np.array([3, 30, 60, 90, 120, 150, 180])
    modes = {}
    for clearance in (0.01, 0.2):
        counting = PassCountingPolicy(policy)
        result = run_policy_step(counting, obs, make_decoder("world_aware"),
                                 prefill_verify_context(kin, held, target_clearance=clearance))
        modes[clearance] = (result.mode, counting.calls["prefill_scored"], counting.calls["score"])
    assert modes == {0.01: ("", 0, 1), 0.2: (PREFILL_VERIFIED, 1, 0)}
    off = make_decoder("world_aware", prefill_verify=False)
    assert not proposes_in_prefill(off, policy, prefill_verify_context(kin, held, target_clearance=0.2))
    with pytest.raises(ValueError, match="prefill_min_looseness"):
        make_decoder("world_aware", prefill_min_looseness=-0.1)


def test_world_aware_with_the_checked_fill_verifies_inside_the_prefill_at_contact_too(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    """The checked fill bounds what follows a rejected cheap token, so by default its proposal is
    verified inside the prefill at contact as well as in free space; a set value still rules."""
    assert make_decoder("world_aware").config.prefill_min_looseness == 0.5
    assert make_decoder("world_aware", fill_check=True).config.prefill_min_looseness == 0.0
    assert make_decoder("world_aware", fill_check=True, prefill_min_looseness=0.5).config.prefill_min_looseness == 0.5
    obs = observations(1, seed=5)[0]
    held = np.array([3, 30, 60, 90, 120, 150, 180])
    at_contact = prefill_verify_context(kin, held, target_clearance=0.01)
    checked = run_policy_step(policy, obs, make_decoder("world_aware", fill_check=True), at_contact)
    assert checked.mode == PREFILL_VERIFIED
    unchecked = run_policy_step(policy, obs, make_decoder("world_aware"), at_contact)
    assert unchecked.mode == ""


def test_world_aware_without_the_scene_decides_from_the_previous_steps_contact_head(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    """On a robot the decision before the prefill reads the contact head of the step before (one
    control period old): none at an episode's start, and none after a step that did not run."""
    free = make_decoder("world_aware", prefill_min_looseness=0.0)  # any contact reading allows it
    held = np.array([3, 30, 60, 90, 120, 150, 180])
    context = lambda step: replace(prefill_verify_context(kin, held), step=step)  # noqa: E731
    obs = observations(3, seed=11)
    assert not proposes_in_prefill(free, policy, context(5))  # no reading yet
    first = run_policy_step(policy, obs[0], free, context(5))
    assert first.mode == ""  # decoded after the prefill, which read the contact head
    second = run_policy_step(policy, obs[1], free, context(6))
    assert second.mode == PREFILL_VERIFIED  # the reading of step 5 decided
    assert run_policy_step(policy, obs[2], free, context(7)).mode == PREFILL_VERIFIED  # step 6 read it again
    assert not proposes_in_prefill(free, policy, context(9))  # step 8 never ran: its reading is missing
    strict = make_decoder("world_aware", prefill_min_looseness=1.0)  # a contact head never says "free" this surely
    run_policy_step(policy, obs[0], strict, context(5))
    assert run_policy_step(policy, obs[1], strict, context(6)).mode == ""


def test_prefill_verification_with_incremental_vision_with_and_without_reused_keys(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    """Incremental vision carries the proposal too: re-encoding changed patches, its pass is the
    full one (exact); reusing keys and values, the action tokens ride along with the recomputed
    tokens, and on a frame refreshed in full the result is again exactly the full pass's."""
    held = np.array([3, 30, 60, 90, 120, 150, 180])
    context = prefill_verify_context(kin, held, target_clearance=0.2)
    feed = torch.tensor([held[:6].tolist()])
    frames = observations(3, seed=12)
    for config in (VisionReuseConfig(), VisionReuseConfig(reuse_kv=True)):
        reuse = IncrementalVisionEncoder(policy, config)
        counting = PassCountingPolicy(policy)
        result = run_policy_step(counting, frames[0], make_decoder("world_aware"), context, reuse)
        assert result.mode == PREFILL_VERIFIED and reuse.last.refreshed and counting.calls["score"] == 0
        full, proposal = verified_by(make_decoder("world_aware"), policy, context,
                                     lambda tokens: policy.prefill_batch([frames[0]], tokens))
        assert proposal == tuple(held[:6])
        np.testing.assert_array_equal(result.tokens, full.tokens)
        reuse.prefill_batch([frames[0]], feed)  # the same image again: nothing re-encoded
        assert reuse.last.recomputed == 0


def test_action_tokens_ride_along_with_the_recomputed_tokens_under_reused_keys(
    policy: Policy, observations: Observations
) -> None:
    """With reuse_kv the verified tokens see exactly the prefix a plain incremental prefill builds
    for that frame: scoring them after ``prefill`` or inside ``prefill_scored`` agrees."""
    feed = torch.tensor([[3, 30, 60, 90, 120, 150]])
    first = observations(1, seed=13)[0]
    frames = [first]
    for step, patch in enumerate((1, None, 2)):  # one patch changes, then only the joints, then another patch
        image = frames[-1].image.copy()
        if patch is not None:
            image[:16, 16 * (patch % 2) : 16 * (patch % 2) + 16] ^= 0x80
        frames.append(Observation(image, first.instruction, first.joint_pos + 0.02 * (step + 1), 0.04,
                                  0.05 * (step + 1)))
    plain = IncrementalVisionEncoder(policy, VisionReuseConfig(reuse_kv=True))
    scored = IncrementalVisionEncoder(policy, VisionReuseConfig(reuse_kv=True))
    recomputed = []
    for obs in frames:
        after = policy.score(plain.prefill(obs), feed)
        inside = scored.prefill_batch([obs], feed)
        assert plain.last == scored.last
        torch.testing.assert_close(inside.logits, after.logits, atol=1e-5, rtol=0)
        assert inside.prefix.prefix_len == after.prefix.prefix_len and inside.prefix.n_tokens == 6
        for (ka, va), (kb, vb) in zip(inside.prefix.cache.layers, after.prefix.cache.layers):
            torch.testing.assert_close(ka, kb, atol=1e-5, rtol=0)
            torch.testing.assert_close(va, vb, atol=1e-5, rtol=0)
        recomputed.append(scored.last.recomputed)
    assert recomputed == [4, 1, 0, 1]  # the first frame in full, then incremental ones
    with pytest.raises(ValueError, match="lie in"):
        scored.prefill_batch([frames[0]], torch.tensor([[300]]))
