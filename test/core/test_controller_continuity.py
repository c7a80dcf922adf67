"""Command continuity of the control core: two consecutive commands never differ by more than the URDF
velocity limit x the control period, per joint, whatever the measured state does (outliers, jumps,
NaN, gaps, stale inputs), across every source switch; joint-state gating; the bounded fallback."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import vla_accel_ros.core.chunk_executor as chunk_executor
from vla_accel_ros.core.controller import (
    Controller,
    ControllerConfig,
    TickResult,
)
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf

Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
PERIOD = 0.05
SAMPLES_PER_TICK = 5  # joint states at 100 Hz, ticks at 20 Hz
IMAGE = np.zeros((16, 16, 3), np.uint8)
KIN = ArmKinematics(default_urdf())
STEP = KIN.limits.velocity * PERIOD  # the most two consecutive commands may differ by


def assert_continuous(results: list[TickResult]) -> None:
    """Every command finite and within the position limits; consecutive ones within v*T per joint."""
    commands = [r.q_command for r in results if r.q_command is not None]
    assert commands, "no command"
    for k, q in enumerate(commands):
        assert np.all(np.isfinite(q)), (k, q)
        assert KIN.within_limits(q), (k, q)
    steps = np.abs(np.diff(np.array(commands), axis=0))
    worst = steps.max(axis=0) if len(steps) else np.zeros(KIN.n)
    assert np.all(steps <= STEP + 1e-9), f"step {worst} exceeds v*T {STEP}"


class Arm:
    """A controller driven tick by tick by a simulated arm whose servo follows the commands (or is
    moved from outside); ``measure`` may corrupt what the controller is told."""

    def __init__(self, q: np.ndarray = Q_HOME, **cfg) -> None:
        self.ctrl = Controller(KIN, ControllerConfig(period_s=PERIOD, **cfg))
        self.ctrl.set_instruction("pick up the red cube")
        self.ctrl.set_enabled(True)
        self.q = q.astype(float).copy()
        self.t = 0.0
        self.results: list[TickResult] = []
        self.follow = True  # the servo moves the arm toward the command
        self.measure: Callable[[np.ndarray, int], np.ndarray | None] = lambda q, i: q  # None: no sample
        self.images = True

    def tick(self, action: np.ndarray | None = None, before: Callable[[Controller], None] | None = None) -> TickResult:
        for i in range(SAMPLES_PER_TICK):
            t = self.t + i * PERIOD / SAMPLES_PER_TICK
            sample = self.measure(self.q.copy(), i)
            if sample is not None:
                self.ctrl.on_joint_state(sample, 0.04, t)
        if self.images:
            self.ctrl.on_image(IMAGE, self.t)
        if action is not None:
            self.ctrl.on_action(action, self.t, self.t + 0.01)
        if before is not None:
            before(self.ctrl)
        self.t += PERIOD
        result = self.ctrl.tick(self.t)
        self.results.append(result)
        if self.follow and result.q_command is not None:
            self.q += 0.6 * (result.q_command - self.q)
        return result

    def run(self, n: int, **kw) -> list[TickResult]:
        return [self.tick(**kw) for _ in range(n)]


MOVE = np.array([0.03, 0.0, -0.02, 0.0, 0.0, 0.0, 1.0])  # 3 cm/step: IK targets far beyond v*T from the arm


# --- table-driven cases ------------------------------------------------------------------------------
def case_outlier(arm: Arm) -> None:
    arm.run(10)
    bad = np.zeros(KIN.n)
    bad[1] = 0.5  # within the limits, 4.6 x v*T away
    arm.measure = lambda q, i: q + bad if i == 2 else q
    arm.tick()
    arm.measure = lambda q, i: q
    arm.run(10)
    stats = arm.ctrl.stats
    assert stats.outliers_rejected == 1 and stats.jumps_accepted == 0
    assert "joint2" in stats.last_outlier and "outlier" in stats.last_outlier
    for r in arm.results:  # the outlier moved nothing: not the filter, nor the command
        np.testing.assert_allclose(r.q_command, Q_HOME, atol=1e-6)


def case_jump_within_limits(arm: Arm) -> None:
    arm.run(10)
    arm.follow = False
    arm.q[2] += 0.5  # the arm is really there (moved by hand, sim reset)
    arm.run(12)
    stats = arm.ctrl.stats
    # gated until the agreeing outliers have persisted jump_confirm_s (0.05 s: samples 10 ms apart)
    confirm = arm.ctrl.config.jump_confirm_s
    assert stats.jumps_accepted == 1 and stats.outliers_rejected == round(confirm / (PERIOD / SAMPLES_PER_TICK))
    np.testing.assert_allclose(arm.results[-1].q_command, arm.q, atol=1e-3)  # ramped there


def case_nan_sample(arm: Arm) -> None:
    arm.run(5)
    arm.measure = lambda q, i: np.full(KIN.n, np.nan) if i == 1 else q
    arm.run(3)
    arm.measure = lambda q, i: q
    arm.run(5)
    assert arm.ctrl.stats.inputs_rejected == 3


def case_gap_then_resume(arm: Arm) -> None:
    arm.run(5, action=MOVE)
    arm.measure = lambda q, i: None
    held = arm.run(10)  # past the joint-state watchdog
    assert held[-1].source == "hold" and "joint states stale" in held[-1].reason
    arm.measure = lambda q, i: q
    arm.q[0] += 0.4  # moved during the gap: within what 0.5 s allows, so accepted
    arm.follow = False
    arm.run(10)
    assert arm.ctrl.stats.outliers_rejected == 0


def case_disable_enable(arm: Arm) -> None:
    arm.run(6, action=MOVE)
    arm.run(6, action=MOVE, before=lambda c: c.set_enabled(False))
    assert arm.results[-1].source == "hold" and arm.results[-1].reason == "disabled"
    arm.run(6, action=-MOVE, before=lambda c: c.set_enabled(True))
    assert arm.results[-1].source == "policy"


def case_guard_trip(arm: Arm, monkeypatch: pytest.MonkeyPatch) -> None:
    arm.run(4, action=MOVE)
    monkeypatch.setattr(chunk_executor, "action_to_joint_targets", lambda *a: (np.full(KIN.n, np.nan), 1.0))
    arm.run(3, action=MOVE)
    monkeypatch.undo()
    arm.run(6, action=-MOVE)
    assert arm.ctrl.stats.guard_trips == 3


def case_source_switches(arm: Arm) -> None:
    arm.run(5, action=MOVE)  # policy
    arm.run(8)  # fallback, then hold once fallback_max_s is used up
    arm.run(5, action=-MOVE)  # policy again
    arm.tick(action=MOVE, before=lambda c: c.set_enabled(False))  # policy -> hold
    arm.run(3, before=lambda c: c.set_enabled(True))  # hold -> fallback
    arm.run(5, action=MOVE)  # fallback -> policy
    arm.images = False
    arm.run(14, action=MOVE)  # the camera watchdog holds whatever the actions
    assert arm.results[-1].source == "hold" and "camera stale" in arm.results[-1].reason
    arm.images = True
    arm.run(5, action=-MOVE)
    sources = [r.source for r in arm.results]
    for a, b in [("policy", "fallback"), ("fallback", "hold"), ("hold", "policy"), ("policy", "hold"),
                 ("hold", "fallback"), ("fallback", "policy")]:
        assert any(x == a and y == b for x, y in itertools.pairwise(sources)), (a, b, sources)


def case_clock_goes_back(arm: Arm) -> None:
    arm.run(6, action=MOVE)
    arm.t -= 3.0  # sim reset / bag played again
    arm.q[0] += 0.3
    arm.run(10, action=-MOVE)


CASES: dict[str, Callable[..., None]] = {
    "outlier sample": case_outlier,
    "jump within limits": case_jump_within_limits,
    "NaN sample": case_nan_sample,
    "gap then resume": case_gap_then_resume,
    "disable and enable": case_disable_enable,
    "guard trip": case_guard_trip,
    "source switches": case_source_switches,
    "clock goes back": case_clock_goes_back,
}


@pytest.mark.parametrize("name", list(CASES))
def test_consecutive_commands_stay_within_velocity_limit_times_period(name, monkeypatch):
    arm = Arm()
    case = CASES[name]
    if name == "guard trip":
        case(arm, monkeypatch)
    else:
        case(arm)
    assert_continuous(arm.results)


def test_one_outlier_does_not_reach_the_hold_target_the_policy_or_its_observation():
    arm = Arm()
    arm.run(4)
    bad = Q_HOME.copy()
    bad[0] += 0.5
    arm.ctrl.on_joint_state(bad, 0.04, arm.t + 0.001)
    _, obs = arm.ctrl.wait_observation(0, timeout=0.0)
    np.testing.assert_allclose(obs.joint_pos, Q_HOME, atol=1e-9)  # the policy's proprioception
    held = arm.tick(before=lambda c: c.set_enabled(False))
    np.testing.assert_allclose(held.q_command, Q_HOME, atol=1e-9)  # the hold target
    assert arm.ctrl.stats.outliers_rejected == 1


def test_alternating_outliers_are_never_taken_as_a_jump():
    arm = Arm()
    bad = np.zeros(KIN.n)
    bad[3] = 0.6
    arm.measure = lambda q, i: q + bad if i % 2 else q  # every other sample broken
    arm.run(20)
    assert arm.ctrl.stats.jumps_accepted == 0 and arm.ctrl.stats.outliers_rejected == 40
    assert not any("stale" in r.reason for r in arm.results)  # the good samples keep the watchdog fed
    assert_continuous(arm.results)
    for r in arm.results:
        np.testing.assert_allclose(r.q_command, Q_HOME, atol=1e-6)


def test_a_hold_after_a_real_jump_ramps_to_the_new_position_at_the_velocity_limit():
    arm = Arm()
    arm.run(3)
    arm.ctrl.set_enabled(False)
    arm.follow = False
    arm.q = np.clip(Q_HOME + np.array([1.0, 0.5, -0.8, 0.6, 1.2, 0.5, -1.0]), KIN.limits.lower, KIN.limits.upper)
    before = arm.results[-1].q_command
    results = arm.run(20)
    assert all(r.source == "hold" for r in results)
    assert arm.ctrl.stats.jumps_accepted == 1
    distance = np.abs(arm.q - before)
    worst = int(np.argmax(distance / STEP))  # the joint that needs the most ticks moves at its limit
    moves = np.abs(np.diff(np.array([before] + [r.q_command for r in results]), axis=0))[:, worst]
    confirming = int(np.argmax(moves > 0))  # the hold stays put while the jump persists jump_confirm_s
    assert 0 < confirming * PERIOD <= arm.ctrl.config.jump_confirm_s + PERIOD and not moves[:confirming].any()
    moves = moves[confirming:]
    full = int(distance[worst] // STEP[worst])
    assert full >= 3
    np.testing.assert_allclose(moves[:full], STEP[worst], rtol=1e-9)
    np.testing.assert_allclose(results[-1].q_command, arm.q, atol=1e-9)
    assert_continuous(arm.results)


# --- property: any stream of samples -----------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    kind: str
    vector: tuple[float, ...]
    action: bool
    jitter: float


STEPS = st.builds(
    Step,
    kind=st.sampled_from(["ok", "ok", "ok", "ok", "outlier", "jump", "nan", "gap", "stale", "toggle", "back"]),
    vector=st.tuples(*[st.floats(-1.0, 1.0)] * 7),
    action=st.booleans(),
    jitter=st.floats(-0.02, 0.06),
)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(STEPS, min_size=5, max_size=40), fallback_max_s=st.sampled_from([0.0, 0.1, 0.25, 1.0]),
       expect_actions=st.booleans())
def test_any_joint_state_stream_gives_continuous_commands_within_limits(steps, fallback_max_s, expect_actions):
    # a stream that never delivers a joint state gives no command at all, rightly: nothing to check
    assume(any(step.kind not in ("gap", "stale") for step in steps))
    ctrl = Controller(KIN, ControllerConfig(period_s=PERIOD, fallback_max_s=fallback_max_s,
                                            expect_actions=expect_actions))
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)
    q = Q_HOME.copy()
    t = 10.0
    results = []
    for step in steps:
        vec = np.asarray(step.vector)
        if step.kind == "jump":
            q = np.clip(Q_HOME + 2.0 * vec, KIN.limits.lower, KIN.limits.upper)
        elif step.kind == "toggle":
            ctrl.set_enabled(not ctrl.enabled)
        elif step.kind == "back":
            t -= 2.0
        dt = max(PERIOD + step.jitter, 0.001)  # late ticks, early ticks: the bound is per returned command
        if step.kind not in ("gap", "stale"):
            for i in range(3):
                sample = q.copy()
                if step.kind == "outlier" and i == 1:
                    sample = sample + 3.0 * vec
                elif step.kind == "nan" and i == 1:
                    sample[int(abs(vec[0]) * 6)] = np.nan
                ctrl.on_joint_state(sample, 0.04, t + i * dt / 3)
        if step.kind != "stale":
            ctrl.on_image(IMAGE, t)
        if step.action:
            ctrl.on_action(np.concatenate([0.05 * vec[:6], [0.5]]), t, t)
        t += dt
        result = ctrl.tick(t)
        results.append(result)
        if result.q_command is not None:
            q += 0.5 * (result.q_command - q)  # the servo follows
        assert 0.0 <= result.gripper_command <= 1.0
    assert_continuous(results)


# --- the bounded fallback ----------------------------------------------------------------------------
def pushed(arm: Arm, push_ticks: int, velocity: float = 0.6) -> int:
    """Push joint 1 from outside at ``velocity`` rad/s for ``push_ticks`` ticks, then leave it where it
    is; return the index of the last push tick."""
    arm.follow = False
    for _ in range(push_ticks):
        arm.q[0] += velocity * PERIOD
        arm.tick()
    return len(arm.results) - 1


@pytest.mark.parametrize("expect_actions", [False, True])
def test_an_external_push_is_not_carried_on_past_fallback_max_s(expect_actions):
    # expect_actions False is the node's inference: false; True with no action ever is inference failing
    arm = Arm(expect_actions=expect_actions, fallback_max_s=0.25)
    arm.run(2)
    end = pushed(arm, 20)
    arm.run(20)
    settle = end + int(np.ceil(0.25 / PERIOD))
    commands = np.array([r.q_command for r in arm.results])
    assert np.all(np.abs(np.diff(commands[settle:], axis=0)) < 1e-3)
    assert_continuous(arm.results)
    if expect_actions:
        assert arm.results[-1].source == "hold" and "no fresh policy action" in arm.results[-1].reason
    else:  # tracks the arm, nothing extrapolated
        assert arm.results[-1].source == "fallback"
        np.testing.assert_allclose(commands[-1], arm.q, atol=1e-9)


def test_a_push_while_the_fallback_runs_ends_with_the_window_and_a_hold():
    arm = Arm(fallback_max_s=0.25)
    arm.follow = False
    for _ in range(10):  # pushed while the policy acts, the actions end with the push (inference fails)
        arm.q[0] += 0.6 * PERIOD
        arm.tick(action=np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]))
    end = len(arm.results) - 1
    arm.run(20)
    after = arm.results[end + 1:]
    assert [r.source for r in after[:5]] == ["fallback"] * 5 and {r.source for r in after[5:]} == {"hold"}
    speeds = [int(re.search(r"at (\d+)% speed", r.reason).group(1)) for r in after[:5]]
    assert speeds == [80, 60, 40, 20, 0]  # the extrapolated velocity decays to 0 over the window
    commands = np.array([r.q_command for r in arm.results])
    settle = end + int(np.ceil(0.25 / PERIOD)) + 1  # the first hold tick may still ramp back by the last lead
    assert np.all(np.abs(np.diff(commands[settle:], axis=0)) < 1e-3)
    assert_continuous(arm.results)


def test_persistent_inference_failure_holds_with_a_reason_and_reports_the_starvation():
    arm = Arm(fallback_max_s=0.25)
    arm.run(3, action=MOVE)
    assert arm.ctrl.action_starved_s == 0.0
    results = arm.run(20)  # no action any more
    fallback = [r for r in results if r.source == "fallback"]
    assert len(fallback) == 5 and all("Kalman" in r.reason for r in fallback)
    last = results[-1]
    assert last.source == "hold" and "no fresh policy action for" in last.reason and "fallback_max_s" in last.reason
    assert arm.ctrl.hold_reason == last.reason
    assert arm.ctrl.action_starved_s == pytest.approx(1.0)
    assert last.stats.fallback_expired == 1 and last.stats.hold_ticks == 15
    recovered = arm.tick(action=MOVE)
    assert recovered.source == "policy" and arm.ctrl.action_starved_s == 0.0 and arm.ctrl.hold_reason == ""
    assert_continuous(arm.results)


def test_fallback_max_s_zero_holds_at_once_without_a_fresh_action():
    arm = Arm(fallback_max_s=0.0)
    arm.tick(action=MOVE)
    assert [arm.tick().source for _ in range(3)] == ["hold"] * 3
    assert arm.tick(action=MOVE).source == "policy"
    assert_continuous(arm.results)


def test_the_fallback_window_restarts_after_a_hold():
    arm = Arm(fallback_max_s=0.25)
    arm.run(10)
    assert arm.results[-1].source == "hold"
    arm.tick(before=lambda c: c.set_enabled(False))
    # the window (0.25 s) counts from the first tick after the hold: six ticks, 0 to 0.25 s into it
    assert [arm.tick(before=lambda c: c.set_enabled(True)).source for _ in range(6)] == ["fallback"] * 6
    assert arm.tick().source == "hold"
