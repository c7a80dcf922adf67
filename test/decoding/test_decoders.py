"""Every decoder on a tiny real policy (random weights): exactness, pass counts, deadlines."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import vla_accel_ros
from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.history import EpisodeHistory
from vla_accel_ros.decoding.kerv import kf_completion_tokens
from vla_accel_ros.decoding.protocol import DecodeContext
from vla_accel_ros.decoding.specs import (
    names,
    names_with,
    spec_of,
    threshold_sweep,
)
from vla_accel_ros.evaluation.comparisons import (
    BASELINE,
    CONTACT_COMPARISON,
    THRESHOLD_SWEPT,
    THRESHOLD_TRACED,
)
from vla_accel_ros.models import Policy
from vla_accel_ros.models.own.flow import FlowHeadConfig, FlowHeads
from vla_accel_ros.models.sampling import SamplingConfig
from vla_accel_ros.runtime.runner import run_policy_step

torch.set_num_threads(1)
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
Observations = Callable[..., list[Observation]]  # the conftest.py fixture (with the tiny policy and kin)


@pytest.fixture(scope="module")
def policy(policy: Policy) -> Policy:
    """The shared tiny policy with an untrained continuous action head, for the flow decoders."""
    torch.manual_seed(0)
    policy.flow = FlowHeads(FlowHeadConfig(d_model=32, hidden=16, layers=1)).eval()  # an untrained action head
    return policy


def converged_filter(kin: ArmKinematics) -> JointKalmanFilter:
    kf = JointKalmanFilter(kin, dt=0.05)
    for i in range(6):
        kf.update(Q_HOME + np.array([0.05, -0.03, 0.02, 0.04, 0.0, 0.03, 0.0]) * i, 0.05 * i)
    return kf


class TickClock:
    """A clock that moves on by ``tick`` seconds each time it is read: decisions are reproducible."""

    def __init__(self, tick: float) -> None:
        self.counter = itertools.count()
        self.tick = tick

    def __call__(self) -> float:
        return next(self.counter) * self.tick


DECODERS = names()


def test_registry_names_and_errors() -> None:
    assert DECODERS == ("ar", "sd", "kerv_released", "kerv", "world_aware", "deadline", "heisd", "flow10", "flow2",
                        "chunk")
    for name in DECODERS:
        assert make_decoder(name).name == name
        assert make_decoder(name).spec is spec_of(name)
    with pytest.raises(ValueError, match="unknown decoder 'beam'"):
        make_decoder("beam")
    with pytest.raises(ValueError, match="sd"):
        make_decoder("sd", r_min=3)
    with pytest.raises(ValueError, match="r_min"):
        make_decoder("kerv", r_min=9, r_max=2)
    with pytest.raises(ValueError, match="r"):
        make_decoder("sd", r=-1)


def test_the_specs_declare_each_decoders_capabilities() -> None:
    assert names_with(lambda s: s.flow_head) == ("flow10", "flow2")
    assert names_with(lambda s: s.action_chunk) == ("chunk",)
    assert names_with(lambda s: s.retrieval_store) == ("heisd",)
    assert names_with(lambda s: s.episode_state) == ("heisd",)
    assert names_with(lambda s: s.verifies_in_prefill) == ("world_aware",)
    assert names_with(lambda s: s.parallel_draft) == ("kerv", "world_aware", "deadline")
    assert names_with(lambda s: s.draft_head) == ("sd", "kerv_released", "deadline", "heisd")
    assert names_with(lambda s: s.fill_check) == names_with(lambda s: s.kinematic_threshold) == ("kerv", "world_aware")
    # settings change what an instance does; the spec declares the defaults
    assert make_decoder("world_aware", prefill_verify=False).config.prefill_verify is False
    assert make_decoder("kerv", prefill_verify=True).config.prefill_verify is True
    assert make_decoder("kerv").capabilities() is spec_of("kerv")
    with pytest.raises(ValueError, match="unknown decoder 'beam'"):
        spec_of("beam")


def test_registry_names_the_baseline_and_the_threshold_sweep() -> None:
    assert BASELINE == "ar"
    assert {BASELINE, *THRESHOLD_SWEPT, *CONTACT_COMPARISON, *THRESHOLD_TRACED} <= set(DECODERS)
    assert threshold_sweep("sd", 9) == {"r": 9}
    assert threshold_sweep("kerv", 9) == {"r_min": 3, "r_max": 9}
    assert threshold_sweep("kerv", 2) == {"r_min": 1, "r_max": 2}
    assert [name for name in DECODERS if threshold_sweep(name, 9) is not None] == list(THRESHOLD_SWEPT)
    for name in THRESHOLD_SWEPT:  # the sweep's settings build the decoder at that threshold
        for r in (3, 20):
            make_decoder(name, **threshold_sweep(name, r))
    with pytest.raises(ValueError, match="unknown decoder"):
        threshold_sweep("beam", 9)


# Every module but the registry asks it and names no decoder.
NAME_FREE_SOURCES = sorted(str(path.relative_to(Path(vla_accel_ros.__file__).parent))
                           for path in Path(vla_accel_ros.__file__).parent.rglob("*.py")
                           if path.name != "specs.py")


@pytest.mark.parametrize("source", NAME_FREE_SOURCES)
def test_only_the_registry_names_decoders_in_code(source: str) -> None:
    text = (Path(vla_accel_ros.__file__).parent / source).read_text()
    names = "|".join(re.escape(name) for name in sorted(DECODERS, key=len, reverse=True))
    quoted = re.findall(rf"""(["'])({names})\1""", text)
    assert not quoted, f"{source} names decoders as string literals: {sorted({name for _, name in quoted})}"


def test_ar_matches_policy_greedy_decoding(policy: Policy, observations: Observations) -> None:
    for obs in observations(3):
        prefix = policy.prefill(obs)
        result = make_decoder("ar").decode(policy, prefix, DecodeContext())
        np.testing.assert_array_equal(result.tokens, policy.greedy_decode(prefix)[0].numpy())
        assert result.target_passes == 7 and result.draft_passes == 0
        np.testing.assert_allclose(result.action, policy.tokens_to_action(result.tokens))


def test_exact_sd_and_kerv_agree_with_ar(policy: Policy, kin: ArmKinematics, observations: Observations) -> None:
    """r = 0: sd always gives AR's tokens; kerv gives them up to its bonus, and wholly when every
    draft token was accepted."""
    kf = converged_filter(kin)
    sd, kerv, ar = make_decoder("sd", r=0), make_decoder("kerv", r_min=0, r_max=0), make_decoder("ar")
    for obs in observations(8, seed=1):
        prefix = policy.prefill(obs)
        expected = ar.decode(policy, prefix, DecodeContext()).tokens
        sd_result = sd.decode(policy, prefix, DecodeContext())
        np.testing.assert_array_equal(sd_result.tokens, expected)
        assert sd_result.rounds == sd_result.target_passes >= 1
        for context in (DecodeContext(), DecodeContext(kalman=kf, gripper_history=(1.0,))):
            k = kerv.decode(policy, prefix, context)
            n = k.accepted_len
            np.testing.assert_array_equal(k.tokens[: n + 1], expected[: n + 1])
            if n == 7:
                np.testing.assert_array_equal(k.tokens, expected)


def test_shared_sampling_noise_keeps_exact_speculation_equal_to_ar(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    """With the step's sampling noise in the context, sd at r = 0 returns AR's *sampled* tokens
    token for token, kerv up to its bonus, and the draft's first proposal is the target's sample."""
    sampling = SamplingConfig(1.5, seed=0)
    ar, sd, kerv = make_decoder("ar"), make_decoder("sd", r=0), make_decoder("kerv", r_min=0, r_max=0)
    changed = 0
    for step, obs in enumerate(observations(8, seed=2)):
        prefix = policy.prefill(obs)
        noise = sampling.token_noise(episode=0, step=step)
        sampled = ar.decode(policy, prefix, DecodeContext(token_noise=noise)).tokens
        np.testing.assert_array_equal(sd.decode(policy, prefix, DecodeContext(token_noise=noise)).tokens, sampled)
        k = kerv.decode(policy, prefix, DecodeContext(kalman=converged_filter(kin), token_noise=noise))
        np.testing.assert_array_equal(k.tokens[: k.accepted_len + 1], sampled[: k.accepted_len + 1])
        draft, _ = policy.draft_tokens(prefix, 3, noise=noise)
        assert int(draft[0, 0]) == sampled[0]
        changed += not np.array_equal(sampled, ar.decode(policy, prefix, DecodeContext()).tokens)
    assert changed > 0  # the noise did move tokens off the greedy ones


def test_episode_history_gives_each_step_its_noise() -> None:
    assert EpisodeHistory().context().token_noise is None  # greedy by default
    history = EpisodeHistory(sampling=SamplingConfig(0.5))
    history.reset(episode=100003)
    torch.testing.assert_close(history.context().token_noise, SamplingConfig(0.5).token_noise(100003, 0))
    with pytest.raises(ValueError, match="token_noise"):
        DecodeContext(token_noise=torch.zeros(6, 256))


def test_kerv_and_world_aware_make_one_verify_pass(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    kf = converged_filter(kin)
    contexts = [
        DecodeContext(),
        DecodeContext(kalman=kf, gripper_history=(0.0,), joint_positions=np.stack([Q_HOME] * 5)),
        DecodeContext(kalman=kf, target_clearance=0.0),
    ]
    for name, r in itertools.product(("kerv", "world_aware"), (0, 5, 15)):
        decoder = make_decoder(name, r_min=r, r_max=r)
        for obs, context in itertools.product(observations(4, seed=2), contexts):
            result = decoder.decode(policy, policy.prefill(obs), context)
            assert result.target_passes == 1 and result.rounds == 1
            assert result.draft_passes == 7
            assert result.tokens.shape == (7,) and np.all((0 <= result.tokens) & (result.tokens <= 254))
            assert np.all(np.isfinite(result.action))


def test_kerv_lets_the_kf_draft_where_it_has_been_reliable(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    kf = converged_filter(kin)
    kerv = make_decoder("kerv", r_min=255, r_max=255)  # accept everything: the proposal is the action
    context = DecodeContext(kalman=kf, gripper_history=(1.0,), step=5)
    kf_tokens, _ = kf_completion_tokens(policy, context)
    obs = observations(1, seed=4)[0]
    full = kerv.decode(policy, policy.prefill(obs), context)
    assert full.draft_passes == 7 and full.target_passes == 1  # no record yet: the draft head drafts all
    kerv.kf_acceptance[:] = [0.0, 0.0, 0.0, 0.95, 0.95, 0.95, 0.95]  # reliable on positions 3..6
    mixed = kerv.decode(policy, policy.prefill(obs), context)
    assert mixed.draft_passes == 3 and mixed.target_passes == 1 and mixed.rounds == 1
    np.testing.assert_array_equal(mixed.tokens[:3], full.tokens[:3])  # the draft head's tokens
    np.testing.assert_array_equal(mixed.tokens[3:], kf_tokens[3:])  # the KF's, verified in the same pass
    kerv.kf_acceptance[5] = 0.5  # one unreliable position: the draft head must reach past it
    assert kerv.draft_length((kf_tokens, np.ones(7, bool))) == 6
    assert kerv.draft_length(None) == 7  # no filter, no kinematic draft
    assert make_decoder("kerv", kf_draft=False).draft_length((kf_tokens, np.ones(7, bool))) == 7


def test_kf_acceptance_counts_only_positions_the_target_conditioned_on_accepted_tokens() -> None:
    kerv = make_decoder("kerv", kf_rate_weight=0.5)
    kf_tokens = np.array([10, 20, 30, 40, 50, 60, 70])
    argmax = np.array([11, 21, 99, 40, 50, 60, 70, 0])
    kerv.update_kf_acceptance(kf_tokens, argmax, n_valid=4, r=2)  # positions 0..3 count
    np.testing.assert_allclose(kerv.kf_acceptance, [0.5, 0.5, 0, 0.5, 0, 0, 0])


def test_flow_heads_are_seeded_per_episode_and_stay_in_bounds(policy: Policy, observations: Observations) -> None:
    for name in ("flow10", "flow2"):
        decoder = make_decoder(name, seed=4)
        prefix = policy.prefill(observations(1, seed=6)[0])
        first = [decoder.decode(policy, prefix, DecodeContext(step=s)).action for s in range(3)]
        again = [decoder.decode(policy, prefix, DecodeContext(step=s)).action for s in range(3)]
        np.testing.assert_array_equal(first, again)  # step 0 reseeds: the episode repeats exactly
        assert not np.array_equal(first[0], first[1])  # new noise each step (correlated with the last)
        for action in first:
            assert np.all(action >= policy.tokenizer.q01 - 1e-12) and np.all(action <= policy.tokenizer.q99 + 1e-12)
        result = decoder.decode(policy, prefix, DecodeContext(step=1))
        assert result.target_passes == 0 and result.draft_passes == 0 and result.decoder == name
    bare = Policy.create(policy.config, policy.tokenizer, seed=3)
    with pytest.raises(ValueError, match="continuous action head"):
        make_decoder("flow2").decode(bare, bare.prefill(observations(1)[0]), DecodeContext())


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_flow_noise_is_standard_normal_with_the_configured_step_correlation(rho: float) -> None:
    """Every step's noise is N(0, 1) (each action a proper sample of the head), and consecutive
    steps correlate by rho (so a two-way choice like the gripper's does not flip every step)."""
    decoder = make_decoder("flow2", seed=1, noise_correlation=rho)
    noise = np.concatenate([decoder.next_noise(step).numpy() for step in range(20000)])
    np.testing.assert_allclose(noise.mean(0), 0.0, atol=0.1)
    np.testing.assert_allclose(noise.std(0), 1.0, atol=0.06)
    lag1 = np.mean([np.corrcoef(noise[:-1, d], noise[1:, d])[0, 1] for d in range(7)])
    assert abs(lag1 - rho) < 0.05
    assert not np.array_equal(decoder.next_noise(0).numpy(), noise[-1])  # step 0: a fresh start
    with pytest.raises(ValueError, match="noise_correlation"):
        make_decoder("flow2", noise_correlation=1.5)


def test_kerv_released_one_pass_on_forced_steps(policy: Policy, observations: Observations) -> None:
    decoder = make_decoder("kerv_released", r_start=0, r_min=0)
    history = np.tile(np.arange(7, dtype=np.int64) * 30, (3, 1))
    for obs in observations(4, seed=3):
        prefix = policy.prefill(obs)
        forced = decoder.decode(policy, prefix, DecodeContext(step=3, token_history=history))
        assert forced.target_passes == 1 and forced.kf_filled == 7 - forced.accepted_len
        ordinary = decoder.decode(policy, prefix, DecodeContext(step=2, token_history=history))
        expected = make_decoder("ar").decode(policy, prefix, DecodeContext()).tokens
        np.testing.assert_array_equal(ordinary.tokens, expected)  # r(t) = 0 here: exact SD


def deadline_rounds(policy: Policy, obs: Observation, kf: JointKalmanFilter,
                    time_left: float | None) -> tuple[int, int, int]:
    decoder = make_decoder("deadline", r_min=0, r_max=0, margin_s=0.0, draft_step_s=0.0005, verify_s=0.004)
    context = DecodeContext(kalman=kf, gripper_history=(1.0,), time_left_s=time_left, clock=TickClock(0.001))
    result = decoder.decode(policy, policy.prefill(obs), context)
    assert result.target_passes == result.rounds
    assert result.tokens.shape == (7,)
    return result.rounds, result.kf_filled, result.accepted_len


def test_deadline_makes_fewer_rounds_as_time_runs_out(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    kf = converged_filter(kin)
    for obs in observations(3, seed=4):
        budgets = [None, 0.2, 0.03, 0.015, 0.008, 0.003, 0.0, -0.01]
        runs = [deadline_rounds(policy, obs, kf, t) for t in budgets]
        rounds = [r for r, _, _ in runs]
        assert all(b <= a for a, b in zip(rounds, rounds[1:])), rounds
        assert rounds[0] > 1  # with r = 0 and a random draft head, unlimited time takes several rounds
        assert rounds[-1] == 0 and runs[-1][1] == 7  # no time: the KF fills the whole action
        no_deadline = make_decoder("sd", r=0).decode(policy, policy.prefill(obs), DecodeContext())
        assert rounds[0] == no_deadline.rounds
        for rounds_used, kf_filled, _ in runs:
            assert (kf_filled > 0) == (rounds_used < rounds[0])


def test_deadline_learns_pass_costs(policy: Policy, kin: ArmKinematics, observations: Observations) -> None:
    decoder = make_decoder("deadline")
    assert decoder.verify_s is None
    context = DecodeContext(kalman=converged_filter(kin), time_left_s=1.0, clock=TickClock(0.002))
    decoder.decode(policy, policy.prefill(observations(1)[0]), context)
    assert decoder.verify_s == pytest.approx(0.002)  # one tick around each pass
    assert 0 < decoder.draft_step_s <= 0.002


def test_run_policy_step_over_an_episode(policy: Policy, kin: ArmKinematics, observations: Observations) -> None:
    from vla_accel_ros.decoding.boundary import PUBLISHED_BOUNDARY
    from vla_accel_ros.decoding.retrieval import RetrievalStore

    keys = np.concatenate([policy.prefill(o).pooled.numpy() for o in observations(3, seed=6)])
    store = RetrievalStore.build(keys, np.random.default_rng(0).integers(0, 255, (3, 4, 7)),
                                 meta={"calibration": PUBLISHED_BOUNDARY.to_dict()})
    settings = {"heisd": {"store": store}}  # heisd needs a retrieval store
    for name in (n for n in DECODERS if not spec_of(n).refusal(policy.capabilities())):  # chunk: OFT's
        history = EpisodeHistory(JointKalmanFilter(kin, dt=0.05), max_steps=10, control_period_s=0.05)
        for i, obs in enumerate(observations(5, seed=5)):
            assert history.observe_joints(obs.joint_pos * 0 + Q_HOME + 0.01 * i, obs.stamp)
            decoder = make_decoder(name, **settings.get(name, {}))
            result = run_policy_step(policy, obs, decoder, history.context(time_left_s=0.05))
            history.record(result)
            assert {"prefill", "draft", "verify", "decode", "total"} <= set(result.timings)
            assert result.timings["total"] >= result.timings["prefill"] > 0
            assert result.timings["total"] >= result.timings["decode"] >= result.timings["verify"]
            assert result.decoder == name
        context = history.context()
        assert context.step == 5 and context.token_history.shape == (5, 7)
        assert len(context.gripper_history) == 5 and context.kalman.converged
    assert history.observe_joints(np.full(7, np.nan), 1.0) is False


def test_the_time_left_counts_from_the_steps_start_the_prefill_included(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    now = [0.0]

    class SlowPrefill:
        """The policy, its prefill taking 50 ms of the step's clock."""

        def __getattr__(self, name: str) -> object:
            return getattr(policy, name)

        def prefill(self, obs: Observation) -> object:
            now[0] += 0.05
            return policy.prefill(obs)

    obs = observations(1, seed=7)[0]
    context = DecodeContext(kalman=converged_filter(kin), gripper_history=(1.0,), time_left_s=0.04,
                            clock=lambda: now[0])
    settings = {"margin_s": 0.0, "draft_step_s": 0.0005, "verify_s": 0.004}
    late = run_policy_step(SlowPrefill(), obs, make_decoder("deadline", **settings), context)
    assert late.rounds == 0 and late.kf_filled == 7 and late.timings["prefill"] == pytest.approx(50.0)
    in_time = run_policy_step(policy, obs, make_decoder("deadline", **settings), context)
    assert in_time.rounds > 0 and in_time.timings["prefill"] == 0.0
