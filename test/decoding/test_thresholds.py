"""Threshold functions move in their documented direction and stay in bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_accel_ros.decoding import thresholds as th
from vla_accel_ros.decoding.thresholds import KinematicSignals, kinematic_threshold


def non_increasing(values: list[float]) -> bool:
    return all(b <= a + 1e-12 for a, b in zip(values, values[1:]))


def non_decreasing(values: list[float]) -> bool:
    return all(b >= a - 1e-12 for a, b in zip(values, values[1:]))


def test_innovation_tightens_r() -> None:
    sweep = np.linspace(0.0, 8.0, 40)
    rs = [kinematic_threshold(KinematicSignals(innovation=x)) for x in sweep]
    assert non_increasing(rs) and rs[0] == 15 and rs[-1] == 5


def test_ee_acceleration_tightens_r() -> None:
    sweep = np.linspace(0.0, 5.0, 40)
    rs = [kinematic_threshold(KinematicSignals(ee_acceleration=x)) for x in sweep]
    assert non_increasing(rs) and rs[0] == 15 and rs[-1] == 5


def test_curvature_tightens_r() -> None:
    """A smaller radius (sharper bend) gives a smaller r; a straight path gives r_max."""
    radii = [math.inf, 1.0, 0.2, 0.1, 0.05, 0.03, 0.01, 0.001]
    rs = [kinematic_threshold(KinematicSignals(path_radius=x)) for x in radii]
    assert non_increasing(rs) and rs[0] == 15 and rs[-1] == 5
    assert len(set(rs)) > 2


def test_joint_limit_proximity_tightens_r() -> None:
    margins = [0.5, 0.2, 0.1, 0.08, 0.05, 0.03, 0.01, 0.0]
    rs = [kinematic_threshold(KinematicSignals(min_limit_margin=x)) for x in margins]
    assert non_increasing(rs) and rs[0] == 15 and rs[-1] == 5


def test_threshold_respects_bounds_and_worst_signal_decides() -> None:
    smooth = KinematicSignals()
    assert kinematic_threshold(smooth, r_min=3, r_max=12) == 12
    worst = KinematicSignals(innovation=100.0, ee_acceleration=100.0, path_radius=0.0, min_limit_margin=0.0)
    assert kinematic_threshold(worst, r_min=3, r_max=12) == 3
    half_innovation = KinematicSignals(innovation=(th.INNOVATION_LOOSE + th.INNOVATION_TIGHT) / 2)
    both = KinematicSignals(innovation=half_innovation.innovation, min_limit_margin=0.0)
    assert kinematic_threshold(both) == 5 < kinematic_threshold(half_innovation) == 10
    with pytest.raises(ValueError, match="r_min"):
        kinematic_threshold(smooth, r_min=10, r_max=5)


def test_non_finite_signals_are_tight() -> None:
    assert kinematic_threshold(KinematicSignals(innovation=math.nan)) == 5
    assert kinematic_threshold(KinematicSignals(ee_acceleration=math.inf)) == 5


def circle_points(radius: float, n: int = 5, arc: float = 1.0) -> np.ndarray:
    """Points on a circle in a tilted plane, spanning ``arc`` radians."""
    angles = np.linspace(0.0, arc, n)
    flat = np.stack([radius * np.cos(angles), radius * np.sin(angles), np.zeros(n)], axis=1)
    tilt = np.array([[1, 0, 0], [0, np.cos(0.7), -np.sin(0.7)], [0, np.sin(0.7), np.cos(0.7)]])
    return flat @ tilt.T + np.array([0.3, 0.0, 0.4])


@pytest.mark.parametrize("radius", [0.01, 0.05, 0.3])
def test_circle_fit_recovers_radius(radius: float) -> None:
    assert th.fit_circle_radius(circle_points(radius)) == pytest.approx(radius, rel=1e-6)


def test_circle_fit_straight_and_stationary_paths() -> None:
    line = np.outer(np.linspace(0, 0.05, 5), [1.0, 2.0, -1.0]) + 0.3
    assert th.fit_circle_radius(line) == math.inf
    assert th.fit_circle_radius(np.full((5, 3), 0.3)) == math.inf
    assert th.fit_circle_radius(circle_points(0.05)[:2]) == math.inf
    noisy = circle_points(0.05) + np.random.default_rng(0).normal(0, 1e-4, (5, 3))
    assert th.fit_circle_radius(noisy) == pytest.approx(0.05, rel=0.05)


def test_clearance_and_contact_probability_directions() -> None:
    clearances = [0.0, 0.01, 0.02, 0.05, 0.08, 0.1, 0.5]
    assert non_decreasing([th.clearance_looseness(c) for c in clearances])
    probabilities = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert non_increasing([th.contact_probability_looseness(p) for p in probabilities])
    assert th.clearance_looseness(0.0) == 0.0 and th.clearance_looseness(1.0) == 1.0


def test_world_aware_threshold_tight_near_contact_loose_in_free_space() -> None:
    looseness = np.linspace(0.0, 1.0, 11)
    for r_max in (15, 60):
        ceiling = th.world_aware_ceiling(r_max)
        assert ceiling == int(th.FREE_SPACE_SCALE * r_max)  # the bounds' own top, loosened
        for r_kin in (5, 10, 15, r_max):
            rs = [th.world_aware_threshold(r_kin, c, r_max) for c in looseness]
            assert non_decreasing(rs)
            assert rs[0] < r_kin < rs[-1] or rs[-1] == ceiling
            assert all(th.R_FLOOR <= r <= ceiling for r in rs)
        assert non_decreasing([th.world_aware_threshold(r, 0.5, r_max) for r in range(0, r_max + 1)])
    assert th.world_aware_ceiling(15) == 18  # the default bounds [5, 15]


def test_released_schedule_decays_from_r_start_to_r_min() -> None:
    rs = [th.released_schedule_threshold(t, 120) for t in range(0, 121)]
    assert rs[0] == 15.0
    assert rs[-1] == pytest.approx(3.0, abs=1e-9)
    assert non_increasing(rs)
    assert th.released_schedule_threshold(10, 120) > th.released_schedule_threshold(40, 120)
    with pytest.raises(ValueError):
        th.released_schedule_threshold(0, 0)


def test_kinematic_signals_from_context_see_curvature_and_limits() -> None:
    """Rotating only the base joint moves the TCP on a circle whose radius is its distance from the
    base axis; a joint parked at its limit drives r down to r_min."""
    from vla_accel_ros.core.kalman import JointKalmanFilter
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding import DecodeContext, make_decoder
    from vla_accel_ros.decoding.kerv import kinematic_signals

    kin = ArmKinematics(default_urdf())
    q_home = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    path = np.stack([q_home + np.array([0.1 * i, 0, 0, 0, 0, 0, 0]) for i in range(5)])
    kf = JointKalmanFilter(kin, dt=0.05)
    for i, q in enumerate(path):
        kf.update(q, 0.05 * i)
    signals = kinematic_signals(DecodeContext(joint_positions=path, kalman=kf))
    assert signals is not None
    tcp = kin.fk(path[-1]).position
    assert signals.path_radius == pytest.approx(np.hypot(tcp[0], tcp[1]), rel=1e-3)
    assert signals.min_limit_margin == pytest.approx(float(np.min(kin.limit_margin(path[-1]))), abs=1e-3)
    assert kinematic_signals(DecodeContext(joint_positions=path)) is None  # no filter, no signals

    at_limit = q_home.copy()
    at_limit[3] = kin.limits.upper[3]
    kf_limit = JointKalmanFilter(kin, dt=0.05)
    for i in range(5):
        kf_limit.update(at_limit, 0.05 * i)
    kerv = make_decoder("kerv")
    context = DecodeContext(joint_positions=np.stack([at_limit] * 5), kalman=kf_limit)
    assert kerv.threshold(None, None, context) == 5.0
    kf_rest = JointKalmanFilter(kin, dt=0.05)
    for i in range(5):
        kf_rest.update(q_home, 0.05 * i)
    assert kerv.threshold(None, None, DecodeContext(joint_positions=np.stack([q_home] * 5), kalman=kf_rest)) == 15.0


def test_circle_fit_on_plain_floats_matches_the_numpy_fit() -> None:
    rng = np.random.default_rng(3)
    for i in range(300):
        radius, arc = 10 ** rng.uniform(-2, 0.5), rng.uniform(0.05, 2.0)
        rotation = np.linalg.qr(rng.normal(size=(3, 3)))[0]
        angles = np.linspace(0.0, arc, 5)
        points = np.stack([radius * np.cos(angles), radius * np.sin(angles), np.zeros(5)], 1) @ rotation.T + 0.4
        points += rng.normal(0, 1e-4 if i % 2 else 1e-6, points.shape)
        fast, reference = th.fit_circle_radius(points), th._fit_circle_radius_numpy(points)
        assert fast == pytest.approx(reference, rel=1e-6) or (math.isinf(fast) and math.isinf(reference))
    # two smallest eigenvalues equal (a symmetric star in 3-D): the plane is NumPy's choice
    star = np.array([[1, 0, 0], [-1, 0, 0], [0, 2, 0], [0, -2, 0], [0, 0, 1], [0, 0, -1]], dtype=float) * 0.01
    assert th.fit_circle_radius(star) == th._fit_circle_radius_numpy(star)
