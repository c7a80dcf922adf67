"""The control core with the real URDF kinematics and Kalman filter: policy, fallback, hold, guards."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_accel_ros.core.controller import Controller, ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.decoding.protocol import model_free_result
from vla_accel_ros.runtime.thread_worker import InferenceWorker

Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
PERIOD = 0.05
IMAGE = np.zeros((32, 32, 3), np.uint8)


@pytest.fixture(scope="module")
def kin() -> ArmKinematics:
    return ArmKinematics(default_urdf())


def running(kin: ArmKinematics, q: np.ndarray = Q_HOME, t: float = 0.0, **cfg) -> Controller:
    ctrl = Controller(kin, ControllerConfig(period_s=PERIOD, **cfg))
    ctrl.on_joint_state(q, 0.04, t)
    ctrl.on_image(IMAGE, t)
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)
    return ctrl


def feed(ctrl: Controller, q: np.ndarray, t: float) -> None:
    ctrl.on_joint_state(q, 0.04, t)
    ctrl.on_image(IMAGE, t)


def test_no_command_without_joint_state(kin):
    result = Controller(kin).tick(0.0)
    assert result.q_command is None and result.source == "hold"
    assert "no joint state" in result.reason
    assert result.stats.ticks == 1 and result.stats.ticks_published == 0


def test_disabled_holds_measured_position(kin):
    ctrl = running(kin)
    ctrl.set_enabled(False)
    result = ctrl.tick(0.01)
    assert result.source == "hold" and result.reason == "disabled"
    np.testing.assert_allclose(result.q_command, Q_HOME)


def test_missing_instruction_holds(kin):
    ctrl = Controller(kin, ControllerConfig(period_s=PERIOD))
    feed(ctrl, Q_HOME, 0.0)
    ctrl.set_enabled(True)
    assert ctrl.tick(0.01).reason == "waiting for an instruction"
    assert ctrl.set_instruction("   ") is not None


def test_policy_action_goes_through_ik_and_is_used_once(kin):
    ctrl = running(kin)
    assert ctrl.on_action(np.array([0.01, 0, 0, 0, 0, 0, 0.0]), obs_stamp=0.0, now=0.02) is None
    result = ctrl.tick(0.03)
    assert result.source == "policy"
    moved = kin.fk(result.q_command).position - kin.fk(Q_HOME).position
    assert moved[0] == pytest.approx(0.01, abs=2e-3) and abs(moved[1]) < 2e-3
    assert result.gripper_command == 0.0
    # the fingers close from the measured opening (0.04 m) at their URDF velocity limit (0.2 m/s)
    np.testing.assert_allclose(result.finger_positions, 0.04 - kin.gripper_limits.velocity * PERIOD)
    again = ctrl.tick(0.08)
    assert again.source == "fallback" and "no fresh action" in again.reason
    assert again.stats.actions_used == 1 and again.stats.fallback_ticks == 1


def test_expired_action_is_not_executed(kin):
    ctrl = running(kin, action_timeout_s=0.1)
    ctrl.on_action(np.array([0.02, 0, 0, 0, 0, 0, 1.0]), obs_stamp=0.0, now=0.01)
    feed(ctrl, Q_HOME, 0.2)
    result = ctrl.tick(0.2)
    assert result.source == "fallback" and "expired" in result.reason
    assert result.stats.actions_expired == 1


def test_action_for_an_old_instruction_is_dropped(kin):
    ctrl = running(kin)
    message = ctrl.on_action(np.zeros(7), 0.0, 0.01, instruction="pick up the blue cube")
    assert message is not None and "instruction changed" in message
    assert ctrl.tick(0.02).source == "fallback"


def test_fallback_continues_the_measured_motion_within_limits(kin):
    # The arm moves joint 1 at 0.5 rad/s; no action arrives (inference slower than the period).
    ctrl = Controller(kin, ControllerConfig(period_s=PERIOD, action_dt_s=PERIOD))
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)
    velocity = np.zeros(7)
    velocity[0] = 0.5
    for k in range(10):
        t = k * 0.01
        feed(ctrl, Q_HOME + velocity * t, t)
    result = ctrl.tick(0.09)
    assert result.source == "fallback" and "Kalman" in result.reason
    lead = result.q_command - (Q_HOME + velocity * 0.09)
    assert lead[0] == pytest.approx(0.5 * PERIOD, rel=0.3)  # extrapolated one action step ahead
    np.testing.assert_allclose(lead[1:], 0.0, atol=1e-3)
    assert kin.within_limits(result.q_command)


def test_blocked_inference_worker_falls_back_for_fallback_max_s_then_holds(kin):
    ctrl = running(kin)
    release = threading.Event()

    def slow_runner(obs):  # a real worker thread whose inference takes longer than many periods
        release.wait(5.0)
        return model_free_result("slow", np.array([0.01, 0, 0, 0, 0, 0, 1.0]), np.zeros(7, np.int64), {})

    worker = InferenceWorker(ctrl, slow_runner, clock=lambda: now[0])
    now = [0.0]
    worker.start()
    try:
        sources = []
        for k in range(1, 11):
            now[0] = k * PERIOD
            feed(ctrl, Q_HOME, now[0])
            result = ctrl.tick(now[0])
            sources.append(result.source)
            assert kin.within_limits(result.q_command)
        # the window (0.25 s) counts from the first tick (t = 0.05): fallback up to t = 0.3, then a hold with a reason
        assert sources == ["fallback"] * 6 + ["hold"] * 4
        assert "no fresh policy action" in result.reason and "fallback_max_s" in result.reason
        assert ctrl.hold_reason == result.reason
        assert ctrl.action_starved_s == pytest.approx(0.45) and result.stats.fallback_expired == 1
        release.set()
        for _ in range(100):
            if worker.stats()["actions"]:
                break
            threading.Event().wait(0.02)
        assert ctrl.tick(now[0] + PERIOD).source == "policy"
    finally:
        release.set()
        worker.stop()
    assert worker.stats()["actions"] >= 1


def test_stale_camera_holds_latched_position_and_recovers(kin):
    ctrl = running(kin, camera_timeout_s=0.2)
    q_late = Q_HOME + 0.01
    ctrl.on_joint_state(q_late, 0.04, 0.3)  # joints fresh, camera last seen at t=0
    held = ctrl.tick(0.3)
    assert held.source == "hold" and "camera stale" in held.reason
    ctrl.on_joint_state(q_late + 0.01, 0.04, 0.31)  # the arm sags: the hold target must not follow
    again = ctrl.tick(0.32)
    np.testing.assert_allclose(again.q_command, held.q_command)
    assert ctrl.hold_reason.startswith("camera stale")
    ctrl.on_image(IMAGE, 0.33)
    assert ctrl.tick(0.34).source == "fallback"
    assert ctrl.hold_reason == ""


def test_stale_joint_states_hold_and_recover(kin):
    ctrl = running(kin, joint_state_timeout_s=0.1)
    ctrl.on_image(IMAGE, 0.2)
    result = ctrl.tick(0.2)
    assert result.source == "hold" and "joint states stale" in result.reason
    np.testing.assert_allclose(result.q_command, Q_HOME)
    ctrl.on_joint_state(Q_HOME, 0.04, 0.21)
    assert ctrl.tick(0.22).source == "fallback"


@pytest.mark.parametrize("bad", [np.full(7, np.nan), np.array([0, 0, 0, np.inf, 0, 0, 0]), np.zeros(6)])
def test_bad_inputs_are_rejected_with_a_reason(kin, bad):
    ctrl = running(kin)
    assert "joint state rejected" in ctrl.on_joint_state(bad, 0.0, 0.01)
    action = np.resize(bad, 7) if bad.size == 7 else bad
    assert "action rejected" in ctrl.on_action(action, 0.0, 0.01)
    result = ctrl.tick(0.02)
    assert np.all(np.isfinite(result.q_command))
    assert result.stats.inputs_rejected == 2


def test_implausible_joint_positions_are_rejected_but_a_small_overshoot_is_not(kin):
    ctrl = running(kin)
    absurd = Q_HOME.copy()
    absurd[2] = 2.9e16  # finite, but no arm is there: a broken driver or message
    message = ctrl.on_joint_state(absurd, 0.04, 0.01)
    assert message is not None and "joint3" in message and "outside its limits" in message
    near = Q_HOME.copy()
    near[0] = kin.limits.upper[0] - 0.01
    assert ctrl.on_joint_state(near, 0.04, 2.0) is None
    near[0] = kin.limits.upper[0] + 0.05  # encoders do report a little past a limit
    assert ctrl.on_joint_state(near, 0.04, 2.01) is None
    assert ctrl.stats.outliers_rejected == 0 and ctrl.stats.inputs_rejected == 1
    ctrl.on_image(IMAGE, 2.01)
    result = ctrl.tick(2.02)
    assert np.all(np.isfinite(result.q_command)) and kin.within_limits(result.q_command)


def test_time_going_backwards_is_rejected(kin):
    ctrl = running(kin, t=1.0)
    assert "backwards" in ctrl.on_joint_state(Q_HOME, 0.04, 0.5)
    assert "backwards" in ctrl.on_image(IMAGE, 0.5)


def test_wrong_image_is_rejected(kin):
    ctrl = running(kin)
    assert "image rejected" in ctrl.on_image(np.zeros((8, 8), np.uint8), 0.01)
    assert "image rejected" in ctrl.on_image(np.zeros((8, 8, 3), np.float32), 0.01)


@settings(max_examples=40, deadline=None)
@given(
    action=st.lists(st.floats(-1.0, 1.0), min_size=7, max_size=7),
    offset=st.lists(st.floats(-3.0, 3.0), min_size=7, max_size=7),
)
def test_commands_always_within_position_and_velocity_limits(kin, action, offset):
    q0 = np.clip(Q_HOME + np.asarray(offset), kin.limits.lower, kin.limits.upper)
    ctrl = running(kin, q=q0)
    ctrl.on_action(np.asarray(action), 0.0, 0.0)
    first = ctrl.tick(0.01)
    ctrl.on_action(-np.asarray(action), 0.01, 0.01)
    second = ctrl.tick(0.01 + PERIOD)
    for result in (first, second):
        assert kin.within_limits(result.q_command)
        reach = kin.limits.velocity * max(PERIOD, ctrl.config.action_dt_s) + 1e-9
        assert np.all(np.abs(result.q_command - q0) <= reach)
        assert 0.0 <= result.gripper_command <= 1.0
        assert np.all(result.finger_positions >= kin.gripper_limits.lower)
        assert np.all(result.finger_positions <= kin.gripper_limits.upper)
    step = np.abs(second.q_command - first.q_command)
    assert np.all(step <= kin.limits.velocity * PERIOD + 1e-9)


def test_gripper_command_maps_to_finger_positions(kin):
    ctrl = running(kin)
    ctrl.on_action(np.array([0, 0, 0, 0, 0, 0, 0.5]), 0.0, 0.0)
    ctrl.tick(0.01)
    result = ctrl.tick(0.06)
    assert result.gripper_command == 0.5  # kept through fallback
    np.testing.assert_allclose(result.finger_positions, 0.5 * kin.gripper_limits.upper)  # reached in two ticks


def test_finger_commands_move_at_most_their_velocity_limit_per_tick(kin):
    ctrl = running(kin, fallback_max_s=10.0)
    step = kin.gripper_limits.velocity * PERIOD  # 0.2 m/s x 0.05 s
    fingers = [ctrl.tick(0.0).finger_positions]
    for k in range(1, 20):  # the policy flips the gripper every tick
        feed(ctrl, Q_HOME, k * PERIOD)
        ctrl.on_action(np.array([0, 0, 0, 0, 0, 0, float(k % 2)]), k * PERIOD, k * PERIOD)
        fingers.append(ctrl.tick(k * PERIOD).finger_positions)
    steps = np.abs(np.diff(np.array(fingers), axis=0))
    assert steps.max() == pytest.approx(step.max()) and np.all(steps <= step + 1e-12)
    fingers = np.array(fingers)
    assert np.all(fingers >= kin.gripper_limits.lower) and np.all(fingers <= kin.gripper_limits.upper)


def test_fingers_without_a_urdf_velocity_limit_move_at_gripper_velocity(kin):
    urdf = default_urdf().read_text().replace('upper="0.04" velocity="0.2"', 'upper="0.04" velocity="0"')
    free = ArmKinematics(urdf)
    assert not np.any(np.isfinite(free.gripper_limits.velocity))
    ctrl = running(free, gripper_velocity=0.05)
    ctrl.on_action(np.array([0, 0, 0, 0, 0, 0, 0.0]), 0.0, 0.0)
    np.testing.assert_allclose(ctrl.tick(0.01).finger_positions, 0.04 - 0.05 * PERIOD)


def test_teleported_arm_restarts_the_filter_and_the_command_ramps_to_it(kin):
    ctrl = running(kin, fallback_max_s=1.0)
    first = ctrl.tick(0.005)
    ctrl.on_action(np.array([0.01, 0, 0, 0, 0, 0, 1.0]), 0.0, 0.0)
    q_new = Q_HOME.copy()
    q_new[0] = 0.8  # an episode reset moved the arm far in 10 ms
    # gated until the agreeing samples have persisted jump_confirm_s (0.05 s: six samples 10 ms apart)
    for k, t in enumerate((0.01, 0.02, 0.03, 0.04, 0.05, 0.06)):
        ctrl.on_joint_state(q_new, 0.04, t)
        assert ctrl.stats.outliers_rejected == min(k + 1, 5)
    assert ctrl.stats.jumps_accepted == 1 and "joint1" in ctrl.last_outlier
    previous = first.q_command
    step = kin.limits.velocity * PERIOD
    for k in range(1, 12):
        t = 0.06 + k * PERIOD
        feed(ctrl, q_new, t)
        result = ctrl.tick(t)
        assert result.source == "fallback"  # the pending action belonged to the old pose
        assert np.all(np.abs(result.q_command - previous) <= step + 1e-9)
        previous = result.q_command
    np.testing.assert_allclose(previous, q_new, atol=1e-6)  # reached at the velocity limit


def test_deadline_misses_and_jitter_are_counted(kin):
    ctrl = running(kin)
    for t in (0.0, 0.05, 0.1, 0.2, 0.25):
        feed(ctrl, Q_HOME, t)
        result = ctrl.tick(t)
    assert result.stats.deadline_misses == 1  # the 100 ms gap
    timing = ctrl.timing()
    assert timing["samples"] == 4
    assert timing["jitter_ms_p99"] == pytest.approx(50.0, rel=0.1)


def test_wait_observation_returns_the_newest(kin):
    ctrl = running(kin)
    first = ctrl.wait_observation(0, timeout=0.1)
    assert first is not None
    seq, obs = first
    assert obs.instruction == "pick up the red cube" and obs.image.shape == (32, 32, 3)
    assert ctrl.wait_observation(seq, timeout=0.05) is None
    ctrl.on_image(IMAGE, 0.1)
    ctrl.on_image(IMAGE, 0.2)
    seq2, obs2 = ctrl.wait_observation(seq, timeout=0.1)
    assert seq2 == seq + 2 and obs2.stamp == 0.2
