"""Chunk execution as properties: the refill schedule, the alignment of a chunk to its observation's
time (or, in ``wait``, its start at arrival), every blend, the re-anchoring of deltas, and the v*T
bound across chunk boundaries whatever the chunks, latencies and blends (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_accel_ros.core.actions import JOINT_POSITION, action_to_joint_targets
from vla_accel_ros.core.chunks import (
    CHUNK_ANCHORS,
    CHUNK_BLENDS,
    WEIGHTED_AVERAGE_NEW,
    ChunkPlan,
    ChunkSettings,
    blend_weights,
    first_kept_slot,
    plan_chunk,
    plan_deviation,
)
from vla_accel_ros.core.controller import Controller, ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf

DT = 0.05
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
IMAGE = np.zeros((16, 16, 3), np.uint8)


@pytest.fixture(scope="module")
def kin() -> ArmKinematics:
    return ArmKinematics(default_urdf())


def additive(q: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, float]:
    """A step that adds the action's first 3 numbers to 3 joints: deltas whose integral is obvious."""
    out = np.array(q, dtype=float)
    out[:3] += action[:3]
    return out, float(action[6])


def plan_of(q: np.ndarray, start: float = 0.0, horizon: int | None = None) -> ChunkPlan:
    q = np.array(q, dtype=float)
    return ChunkPlan(q, np.linspace(0, 1, len(q)), np.linspace(-1, 1, 7 * len(q)).reshape(len(q), 7), start, start, 0,
                     horizon or len(q))


@given(horizon=st.integers(2, 32), threshold=st.floats(0.0, 1.0), remaining=st.integers(0, 32))
def test_async_refills_at_the_threshold_and_sync_when_used_up(horizon, threshold, remaining):
    remaining = min(remaining, horizon)
    plan = plan_of(np.zeros((horizon, 7)))
    plan.next = horizon - remaining
    async_ = ChunkSettings(chunk_execution="async", chunk_refill_threshold=threshold)
    assert plan.wants_refill(async_) == (remaining <= threshold * horizon)
    for waiting in ("sync", "wait"):
        assert plan.wants_refill(ChunkSettings(chunk_execution=waiting)) == (remaining == 0)
    plan.replan_requested = True  # the kinematic verification asks whatever the queue holds
    assert plan.wants_refill(async_) and plan.wants_refill(ChunkSettings(chunk_execution="sync"))


def test_a_single_action_always_wants_the_next_inference():
    plan = plan_of(np.zeros((1, 7)))
    assert plan.wants_refill(ChunkSettings(chunk_execution="sync"))


@given(horizon=st.integers(1, 25), delay=st.floats(0.0, 2.0), obs_stamp=st.floats(-100.0, 100.0))
def test_a_chunk_is_aligned_to_its_observation_and_drops_the_steps_that_ran(horizon, delay, obs_stamp):
    actions = np.tile(np.arange(horizon, dtype=float)[:, None] * 1e-3, (1, 7))
    plan = plan_chunk(actions, obs_stamp, obs_stamp + delay, DT, np.zeros(7), additive)
    first = first_kept_slot(obs_stamp, obs_stamp + delay, horizon, DT)
    assert first == min(math.floor(delay / DT + 1e-6), horizon - 1)  # the last action is never dropped
    assert plan.first_slot == first and len(plan.q) == horizon - first
    assert plan.start == pytest.approx(obs_stamp + first * DT)  # step k of the plan: obs + (first + k) dt
    assert plan.gripper[0] == pytest.approx(actions[first, 6])
    # at the tick it arrived, the due step is the plan's first
    assert plan.step_at(obs_stamp + delay, DT) == min(max(0, math.floor(delay / DT + 1e-6) - first), len(plan.q) - 1)


@given(horizon=st.integers(1, 25), delay=st.floats(0.0, 2.0), obs_stamp=st.floats(-100.0, 100.0))
def test_an_unaligned_chunk_runs_from_its_first_action_at_the_tick_it_arrived(horizon, delay, obs_stamp):
    actions = np.tile(np.arange(horizon, dtype=float)[:, None] * 1e-3, (1, 7))
    now = obs_stamp + delay
    plan = plan_chunk(actions, obs_stamp, now, DT, np.zeros(7), additive, aligned=False)
    assert plan.first_slot == 0 and len(plan.q) == horizon and plan.gripper[0] == actions[0, 6]
    # step k is due at the k-th tick after the one it arrived at, even when ticks come up to half a period off
    for k in range(horizon):
        for jitter in (-0.45 * DT, 0.0, 0.45 * DT):
            assert plan.step_at(now + k * DT + jitter, DT) == k
    np.testing.assert_allclose(plan.q[:, 0], np.cumsum(actions[:, 0]), atol=1e-12)


@given(horizon=st.integers(2, 16), delay=st.floats(0.0, 1.0), anchor=st.lists(st.floats(-2, 2), min_size=7,
                                                                                max_size=7))
def test_deltas_are_integrated_from_the_anchor_not_from_the_observation(horizon, delay, anchor):
    rng = np.random.default_rng(horizon)
    actions = np.concatenate([rng.uniform(-0.01, 0.01, (horizon, 6)), rng.uniform(0, 1, (horizon, 1))], axis=1)
    plan = plan_chunk(actions, 0.0, delay, DT, np.array(anchor), additive)
    kept = actions[plan.first_slot:]
    expected = np.array(anchor)[None, :3] + np.cumsum(kept[:, :3], axis=0)
    np.testing.assert_allclose(plan.q[:, :3], expected, atol=1e-12)
    np.testing.assert_allclose(plan.q[:, 3:], np.tile(np.array(anchor)[3:], (len(kept), 1)))


@given(blend=st.sampled_from(CHUNK_BLENDS), n_old=st.integers(1, 12), n_new=st.integers(2, 12),
       offset=st.integers(0, 11), seed=st.integers(0, 1000))
def test_every_blend_combines_exactly_the_overlap(blend, n_old, n_new, offset, seed):
    rng = np.random.default_rng(seed)
    old = plan_of(rng.normal(size=(n_old, 7)))
    old.next = min(offset, n_old)  # steps before it already ran
    new_actions = np.concatenate([rng.normal(scale=0.01, size=(n_new, 6)), rng.uniform(0, 1, (n_new, 1))], axis=1)
    alone = plan_chunk(new_actions, obs_stamp=old.next * DT, now=old.next * DT, dt=DT, anchor_q=np.zeros(7),
                       step=additive)
    blended = plan_chunk(new_actions, obs_stamp=old.next * DT, now=old.next * DT, dt=DT, anchor_q=np.zeros(7),
                         step=additive, previous=old, blend=blend)
    n = min(n_old - old.next, n_new)  # both hold the steps from old.next on
    assert blended.blended == n
    w = blend_weights(blend, n)
    if blend == "latest_only":
        np.testing.assert_array_equal(w, np.ones(n))
    elif blend == "weighted_average":
        np.testing.assert_allclose(w, WEIGHTED_AVERAGE_NEW)
    else:  # linear from the old to the new over the overlap
        np.testing.assert_allclose(w, np.arange(1, n + 1) / (n + 1))
        assert np.all(np.diff(w) > 0)
    for k in range(n):
        np.testing.assert_allclose(blended.q[k], w[k] * alone.q[k] + (1 - w[k]) * old.q[old.next + k])
        assert blended.gripper[k] == pytest.approx(w[k] * alone.gripper[k] + (1 - w[k]) * old.gripper[old.next + k])
        np.testing.assert_allclose(blended.actions[k], w[k] * alone.actions[k] + (1 - w[k]) * old.actions[old.next + k])
    np.testing.assert_array_equal(blended.q[n:], alone.q[n:])  # past the overlap: the new plan alone


def test_an_unknown_blend_is_refused():
    with pytest.raises(ValueError, match="chunk_blend"):
        blend_weights("average", 3)
    with pytest.raises(ValueError, match="chunk_blend"):
        ChunkSettings(chunk_blend="average")


def test_the_plan_deviation_compares_with_the_previous_step():
    plan = plan_of(np.array([[0.0] * 7, [0.1] * 7, [0.2] * 7]))
    assert plan_deviation(plan, 0, np.full(7, 5.0)) == 0.0  # nothing planned has happened yet
    assert plan_deviation(plan, 2, np.full(7, 0.1)) == pytest.approx(0.0)
    assert plan_deviation(plan, 2, np.full(7, 0.4)) == pytest.approx(0.3)


# --- the controller -----------------------------------------------------------------------------
def controller(kin: ArmKinematics, **chunks: object) -> Controller:
    ctrl = Controller(kin, ControllerConfig(period_s=DT, action_dt_s=DT, fallback_max_s=0.25,
                                            chunks=ChunkSettings(**chunks)))  # type: ignore[arg-type]
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)
    return ctrl


def small_deltas(rng: np.random.Generator, horizon: int) -> np.ndarray:
    return np.concatenate([rng.uniform(-0.01, 0.01, (horizon, 6)), rng.uniform(0, 1, (horizon, 1))], axis=1)


def drive(kin: ArmKinematics, ctrl: Controller, ticks: int, horizon: int, latency_ticks: int,
          rng: np.random.Generator, follow: float = 1.0, chunk_of=small_deltas) -> list:
    """A worker with a fixed latency serving the controller's schedule (wait_observation) with
    ``chunk_of(rng, horizon)``, an arm that moves ``follow`` of the way to each command; the tick results."""
    q = Q_HOME.copy()
    in_flight: tuple[int, float] | None = None  # (tick it is delivered at, observation stamp)
    seq, results = 0, []
    for i in range(ticks):
        now = i * DT
        ctrl.on_joint_state(q, 0.04, now)
        ctrl.on_image(IMAGE, now)
        if in_flight is None and (got := ctrl.wait_observation(seq, timeout=0.0)) is not None:
            seq, obs = got
            in_flight = (i + latency_ticks, obs.stamp)
        if in_flight is not None and i >= in_flight[0]:
            assert ctrl.on_action_chunk(chunk_of(rng, horizon), in_flight[1], now) is None
            in_flight = None
        result = ctrl.tick(now)
        results.append(result)
        if result.q_command is not None:
            q = q + follow * (result.q_command - q)
    return results


@settings(max_examples=25, deadline=None)
@given(execution=st.sampled_from(("sync", "wait", "async")), blend=st.sampled_from(CHUNK_BLENDS),
       horizon=st.integers(2, 12), latency=st.integers(0, 6), threshold=st.floats(0.0, 1.0),
       follow=st.floats(0.2, 1.0), seed=st.integers(0, 10_000), anchor=st.sampled_from(CHUNK_ANCHORS))
def test_commands_stay_within_v_t_and_the_limits_across_chunk_boundaries(kin, execution, blend, horizon, latency,
                                                                         threshold, follow, seed, anchor):
    ctrl = controller(kin, chunk_execution=execution, chunk_blend=blend, chunk_refill_threshold=threshold,
                      chunk_anchor=anchor)
    results = drive(kin, ctrl, 60, horizon, latency, np.random.default_rng(seed), follow)
    commands = np.array([r.q_command for r in results])
    assert np.all(np.isfinite(commands))
    assert np.all(np.abs(np.diff(commands, axis=0)) <= kin.limits.velocity * DT + 1e-9)
    assert all(kin.within_limits(c) for c in commands)
    assert sum(r.chunk_start for r in results) >= 2  # chunk boundaries were crossed


@pytest.mark.parametrize("latency", [1, 2, 3])
def test_async_never_waits_between_chunks_and_sync_waits_at_every_boundary(kin, latency):
    horizon = 8
    waits = {}
    for execution in ("sync", "async"):
        ctrl = controller(kin, chunk_execution=execution, chunk_refill_threshold=0.5)
        results = drive(kin, ctrl, 120, horizon, latency, np.random.default_rng(0))
        first_policy = next(i for i, r in enumerate(results) if r.source == "policy")
        waits[execution] = sum(r.source != "policy" for r in results[first_policy:])
        boundaries = sum(r.chunk_start for r in results[first_policy:])
        if execution == "sync":  # each boundary: the latency, plus the tick the plan's last step used
            assert waits["sync"] >= (boundaries - 1) * latency
    assert waits["async"] == 0  # the next chunk arrives before the queue runs out


@pytest.mark.parametrize("latency", [1, 3, 5])
def test_wait_holds_the_last_command_during_inference_and_runs_every_action(kin, latency):
    horizon = 8
    ctrl = controller(kin, chunk_execution="wait")
    results = drive(kin, ctrl, 100, horizon, latency, np.random.default_rng(1))
    first_policy = next(i for i, r in enumerate(results) if r.source == "policy")
    after = results[first_policy:]
    assert results[-1].stats.chunk_steps_dropped == 0  # nothing was due before its chunk arrived
    boundaries = [i for i, r in enumerate(after) if r.chunk_start]
    assert len(boundaries) >= 3
    for start, end in zip(boundaries, boundaries[1:]):
        sources = [r.source for r in after[start:end]]
        # the whole chunk, then the ticks of the next inference (its latency and the tick that asked)
        assert sources[:horizon] == ["policy"] * horizon and len(sources) >= horizon + latency
        waiting = [r.q_command for r in after[start + horizon - 1:end]]
        for command in waiting[1:]:
            np.testing.assert_array_equal(command, waiting[0])  # held: nothing extrapolated


@pytest.mark.parametrize("execution", ["wait", "sync"])
def test_step_anchoring_applies_each_delta_from_the_measured_position(kin, execution):
    # a servo that covers half of each command: integrated open loop, the plan runs ahead of the arm
    forward = np.array([0.01, 0.0, -0.005, 0.0, 0.0, 0.0, 1.0])
    ahead = {}
    for anchor in CHUNK_ANCHORS:
        ctrl = controller(kin, chunk_execution=execution, chunk_anchor=anchor)
        results = drive(kin, ctrl, 60, 8, 2, np.random.default_rng(0), follow=0.5,
                        chunk_of=lambda rng, horizon: np.tile(forward, (horizon, 1)))
        policy = [r for r in results if r.source == "policy"]
        assert len(policy) >= 16
        from_arm = [action_to_joint_targets(kin, r.q_measured, forward, DT)[0] for r in policy]
        if anchor == "step":  # every command is the delta from where the arm was measured at its tick
            for r, expected in zip(policy, from_arm, strict=True):
                np.testing.assert_allclose(r.q_command, expected, atol=1e-9)
        ahead[anchor] = max(float(np.abs(r.q_command - q).max()) for r, q in zip(policy, from_arm, strict=True))
    assert ahead["plan"] > 5 * ahead["step"] + 1e-3  # open loop, the plan ran away from the lagging arm


def test_a_late_chunk_is_re_anchored_where_the_arm_is(kin):
    # the arm moved 0.2 rad on joint 1 during inference: the chunk continues from there
    ctrl = controller(kin, chunk_execution="async")
    for i in range(6):
        q = Q_HOME + np.array([0.0, 0.04 * i, 0, 0, 0, 0, 0])
        ctrl.on_joint_state(q, 0.04, i * DT)
    ctrl.on_image(IMAGE, 0.0)
    result = None
    chunk = np.tile([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], (8, 1))  # stand still
    assert ctrl.on_action_chunk(chunk, obs_stamp=0.0, now=0.25) is None
    ctrl.on_image(IMAGE, 0.25)
    result = ctrl.tick(0.25)
    assert result.source == "policy" and result.chunk_start
    assert result.stats.chunk_steps_dropped == 5  # steps 0-4 ran during the 0.25 s inference
    # the command stays near the arm's estimate (0.2 rad and still moving), never back at the observed 0.0
    assert result.q_command[1] - Q_HOME[1] > 0.15


def test_the_kinematic_verification_asks_for_an_early_re_plan(kin):
    ctrl = controller(kin, chunk_execution="sync", chunk_verify_threshold_rad=0.05)
    ctrl.on_joint_state(Q_HOME, 0.04, 0.0)
    ctrl.on_image(IMAGE, 0.0)
    assert ctrl.wait_observation(0, timeout=0.0) is not None
    ctrl.on_action_chunk(np.tile([0.0] * 6 + [1.0], (8, 1)), obs_stamp=0.0, now=0.0)
    ctrl.tick(0.0)
    assert ctrl.wait_observation(1, timeout=0.0) is None  # sync: the plan is not used up
    pushed = Q_HOME + np.array([0.0, 0.1, 0, 0, 0, 0, 0])  # something pushed the arm off the plan
    for i in range(1, 4):
        ctrl.on_joint_state(Q_HOME + (pushed - Q_HOME) * i / 3, 0.04, i * DT)
        ctrl.on_image(IMAGE, i * DT)
        result = ctrl.tick(i * DT)
    assert result.stats.chunk_replans == 1
    assert ctrl.wait_observation(1, timeout=0.0) is not None  # the next inference starts early


@pytest.mark.parametrize("bad, why", [(np.zeros((8, 6)), "shape"), (np.zeros((0, 7)), "shape"),
                                      (np.full((8, 7), np.nan), "non-finite")])
def test_a_bad_chunk_is_one_line_and_the_arm_holds_safely(kin, bad, why):
    ctrl = controller(kin)
    ctrl.on_joint_state(Q_HOME, 0.04, 0.0)
    ctrl.on_image(IMAGE, 0.0)
    message = ctrl.on_action_chunk(bad, obs_stamp=0.0, now=0.0)
    assert message is not None and "\n" not in message and why in message
    sources = []
    for i in range(12):
        ctrl.on_joint_state(Q_HOME, 0.04, i * DT)
        ctrl.on_image(IMAGE, i * DT)
        result = ctrl.tick(i * DT)
        sources.append(result.source)
        assert np.all(np.isfinite(result.q_command))
    assert "policy" not in sources and sources[-1] == "hold"  # the fallback, then the hold


# --- absolute joint positions (the robot record's joint_position+gripper) ------------------------
@settings(max_examples=25, deadline=None)
@given(execution=st.sampled_from(("sync", "wait", "async")), blend=st.sampled_from(CHUNK_BLENDS),
       horizon=st.integers(1, 10), latency=st.integers(0, 4), spread=st.floats(0.0, 4.0), seed=st.integers(0, 10_000))
def test_joint_position_chunks_pass_the_same_clamps(kin, execution, blend, horizon, latency, spread, seed):
    """Targets anywhere, beyond the limits too: every command within the limits and within v*T of
    the previous one, chunk boundaries included."""
    ctrl = Controller(kin, ControllerConfig(period_s=DT, action_dt_s=DT, action_space=JOINT_POSITION,
                                            chunks=ChunkSettings(chunk_execution=execution, chunk_blend=blend)))
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)

    def targets_anywhere(rng: np.random.Generator, horizon: int) -> np.ndarray:
        return np.column_stack([Q_HOME + rng.uniform(-spread, spread, (horizon, kin.n)), rng.uniform(0, 1, horizon)])

    results = drive(kin, ctrl, 60, horizon, latency, np.random.default_rng(seed), chunk_of=targets_anywhere)
    commands = np.array([r.q_command for r in results])
    assert np.all(np.isfinite(commands)) and all(kin.within_limits(c) for c in commands)
    assert np.all(np.abs(np.diff(commands, axis=0)) <= kin.limits.velocity * DT + 1e-9)


def test_a_joint_position_target_within_reach_is_the_command(kin):
    ctrl = Controller(kin, ControllerConfig(period_s=DT, action_dt_s=DT, action_space=JOINT_POSITION))
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)
    ctrl.on_joint_state(Q_HOME, 0.04, 0.0)
    ctrl.on_image(IMAGE, 0.0)
    target = Q_HOME + 0.05  # within v*T of every joint
    assert ctrl.on_action(np.r_[target, 0.0], obs_stamp=0.0, now=0.0) is None
    result = ctrl.tick(0.0)
    assert result.source == "policy"
    np.testing.assert_allclose(result.q_command, target)
    # an end-effector delta (7 numbers) is the wrong shape for a joint-position policy: one line
    message = ctrl.on_action(np.zeros(7), obs_stamp=0.0, now=0.0)
    assert message is not None and "8 numbers" in message and "\n" not in message
