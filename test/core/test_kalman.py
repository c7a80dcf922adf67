"""Joint-space Kalman filter: tracking, limits, bad measurements, predicted actions."""

from __future__ import annotations

import numpy as np
import pytest

from vla_accel_ros.core.kalman import JointKalmanFilter, KalmanConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf

Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


@pytest.fixture(scope="module")
def kin() -> ArmKinematics:
    return ArmKinematics(default_urdf())


def ca_trajectory(t: float, v0: np.ndarray, acc: np.ndarray) -> np.ndarray:
    return Q_HOME + v0 * t + 0.5 * acc * t * t


def feed_trajectory(kf: JointKalmanFilter, v0: np.ndarray, acc: np.ndarray, n: int, noise: float = 0.0) -> float:
    """Measurements at uneven steps (40/60 ms alternating); returns the last stamp."""
    rng = np.random.default_rng(0)
    t = 0.0
    for i in range(n):
        assert kf.update(ca_trajectory(t, v0, acc) + noise * rng.standard_normal(7), t)
        t += 0.04 if i % 2 == 0 else 0.06
    return t - (0.04 if (n - 1) % 2 == 0 else 0.06)


def test_tracks_constant_acceleration_after_convergence(kin: ArmKinematics) -> None:
    v0 = np.array([0.2, -0.1, 0.15, 0.1, -0.2, 0.1, 0.3])
    acc = np.array([0.3, 0.2, -0.2, 0.1, 0.25, -0.15, 0.2])
    kf = JointKalmanFilter(kin, dt=0.05)
    assert not kf.converged
    t_last = feed_trajectory(kf, v0, acc, n=30, noise=2e-4)
    assert kf.converged and kf.n_skipped == 0
    np.testing.assert_allclose(kf.qd, v0 + acc * t_last, atol=0.02)
    np.testing.assert_allclose(kf.qdd, acc, atol=0.3)
    for horizon in (0.05, 0.1):
        np.testing.assert_allclose(kf.predict_q(horizon), ca_trajectory(t_last + horizon, v0, acc),
                                   atol=5e-4 + 0.02 * horizon)
    assert kf.innovation() < 3.0


def test_predicted_action_is_fk_delta_of_next_step(kin: ArmKinematics) -> None:
    v0 = np.array([0.1, 0.1, -0.1, 0.1, 0.0, -0.1, 0.1])
    acc = np.zeros(7)
    kf = JointKalmanFilter(kin, dt=0.05)
    t_last = feed_trajectory(kf, v0, acc, n=20)
    action = kf.predict_action(0.05, gripper_history=[1.0, 0.0])
    expected = kin.pose_delta(kin.fk(ca_trajectory(t_last, v0, acc)), kin.fk(ca_trajectory(t_last + 0.05, v0, acc)))
    assert action.shape == (7,)
    np.testing.assert_allclose(action[:6], expected, atol=5e-4)
    assert action[6] == 0.0  # the gripper's last command


def test_stationary_arm_predicts_zero_delta_and_default_gripper(kin: ArmKinematics) -> None:
    kf = JointKalmanFilter(kin, dt=0.05)
    for i in range(5):
        kf.update(Q_HOME, 0.05 * i)
    action = kf.predict_action(0.05, gripper_history=[])
    np.testing.assert_allclose(action[:6], 0.0, atol=1e-9)
    assert action[6] == 1.0  # no history: open
    assert kf.ee_acceleration() < 1e-6


def test_never_predicts_outside_urdf_limits(kin: ArmKinematics) -> None:
    """Drive every joint toward its upper limit at near its velocity limit, keep accelerating."""
    kf = JointKalmanFilter(kin, dt=0.05)
    lower, upper, vmax = kin.limits.lower, kin.limits.upper, kin.limits.velocity
    q = Q_HOME.copy()
    v = 0.9 * vmax
    for i in range(40):
        q = np.minimum(q + v * 0.05, upper)  # saturates at the limit like a real joint
        kf.update(q, 0.05 * i)
        for horizon in (0.05, 0.2, 1.0, 5.0):
            pred = kf.predict_q(horizon)
            assert np.all(np.isfinite(pred))
            assert kin.within_limits(pred), (i, horizon, pred - upper)
            # what the velocity limits allow over the horizon
            assert np.all(np.abs(pred - np.clip(kf.q, lower, upper)) <= vmax * horizon + 1e-9)
        assert np.all(np.abs(kf.qd) <= vmax + 1e-12)
    assert np.any(np.isclose(kf.predict_q(1.0), upper))


def test_skips_nan_and_inf_and_stays_finite(kin: ArmKinematics) -> None:
    kf = JointKalmanFilter(kin, dt=0.05)
    for i in range(4):
        assert kf.update(Q_HOME + 0.01 * i, 0.05 * i)
    before = (kf.q, kf.qd, kf.n_updates)
    bad = Q_HOME.copy()
    bad[2] = np.nan
    assert kf.update(bad, 0.2) is False
    bad[2] = np.inf
    assert kf.update(bad, 0.25) is False
    assert kf.update(Q_HOME[:6], 0.3) is False  # wrong length
    assert kf.update(Q_HOME, np.nan) is False  # bad stamp
    assert kf.update(Q_HOME, 0.1) is False  # time going backwards
    assert kf.n_skipped == 5
    assert kf.n_updates == before[2]
    np.testing.assert_array_equal(kf.q, before[0])
    np.testing.assert_array_equal(kf.qd, before[1])
    assert kf.update(Q_HOME + 0.04, 0.2)  # a good one is fused again
    for value in (kf.q, kf.qd, kf.qdd, kf.predict_q(0.05), kf.predict_action(0.05, [1.0])):
        assert np.all(np.isfinite(value))
    assert np.isfinite(kf.innovation())


def test_innovation_rises_on_a_sudden_change(kin: ArmKinematics) -> None:
    kf = JointKalmanFilter(kin, dt=0.05)
    v0 = np.full(7, 0.1)
    t_last = feed_trajectory(kf, v0, np.zeros(7), n=20, noise=2e-4)
    smooth = kf.innovation()
    kf.update(ca_trajectory(t_last + 0.05, v0, np.zeros(7)) + 0.05, t_last + 0.05)  # a 50 mrad jump
    assert kf.innovation() > 5 * max(smooth, 0.1)


def test_long_gap_restarts_at_rest(kin: ArmKinematics) -> None:
    kf = JointKalmanFilter(kin, dt=0.05)
    feed_trajectory(kf, np.full(7, 0.2), np.zeros(7), n=10)
    assert kf.converged
    kf.update(Q_HOME, 100.0)
    assert not kf.converged
    np.testing.assert_array_equal(kf.qd, np.zeros(7))


def test_predict_before_any_measurement_is_an_error(kin: ArmKinematics) -> None:
    with pytest.raises(RuntimeError, match="before any measurement"):
        JointKalmanFilter(kin, dt=0.05).predict_q(0.05)


@pytest.mark.parametrize("field", ["ramp_time_s", "jerk_fraction", "meas_std", "max_gap_s"])
def test_config_rejects_non_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KalmanConfig(**{field: 0.0})


def test_rejects_bad_dt(kin: ArmKinematics) -> None:
    with pytest.raises(ValueError, match="dt"):
        JointKalmanFilter(kin, dt=0.0)


def test_ee_acceleration_follows_the_filtered_motion_and_each_new_measurement(kin: ArmKinematics) -> None:
    """The TCP acceleration is J qdd + dJ/dt qd of the filtered state, recomputed after every fused
    measurement (the pose and acceleration are kept only while the state stands)."""
    v0, acc = np.array([0.2, -0.1, 0.15, 0.1, -0.2, 0.1, 0.3]), np.array([0.5, 0.3, -0.4, 0.2, 0.1, -0.3, 0.2])
    kf = JointKalmanFilter(kin, dt=0.05)
    feed_trajectory(kf, v0, acc, n=10)
    q, qd, qdd = kf.q, kf.qd, kf.qdd
    h = 1e-4
    position = lambda t: kin.fk(q + qd * t + 0.5 * qdd * t * t).position  # noqa: E731
    expected = np.linalg.norm((position(h) - 2 * position(0.0) + position(-h)) / h**2)
    assert kf.ee_acceleration() == pytest.approx(expected, rel=1e-4)
    first = kf.predict_action(0.05, [1.0])
    kf.update(kf.predict_q(0.05) + 0.01, kf.stamp + 0.05)
    assert not np.allclose(kf.predict_action(0.05, [1.0]), first)  # not the kept pose of the old state
