"""Joint-space constant-acceleration Kalman filter with URDF-derived noise and bounds.

Each arm joint has the state ``(q, qd, qdd)`` and evolves as a constant-acceleration model driven by
white jerk (the discrete "Wiener process acceleration" model). Joints are filtered independently:
measurements are joint positions, whose noise is independent per joint, and treating the joints
separately keeps each update to a few 3x3 operations.

Why the URDF sets the numbers: a joint cannot move faster than its velocity limit, so the filter
clips its velocity estimate there, sizes the jerk noise from the time the joint needs to reach that
speed, and clamps every predicted position to the position limits and to what the velocity limit
can reach over the horizon. A prediction is therefore always a configuration the arm could reach.

Time is whatever clock stamps the measurements (sim or ROS seconds); steps may vary in length.
Non-finite measurements and stamps that do not move forward are skipped and counted, never fused,
so the state stays finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vla_accel_ros.core.kinematics import ArmKinematics, Pose

# Number of fused measurements after which velocity and acceleration are observable.
MIN_UPDATES_CONVERGED = 3


@dataclass(frozen=True)
class KalmanConfig:
    """Noise settings of :class:`JointKalmanFilter`.

    ramp_time_s: time a joint takes to reach its velocity limit from rest; sets the acceleration
        scale ``a = v_max / ramp_time`` and the jerk scale ``j = a / ramp_time``.
    jerk_fraction: process-noise jerk standard deviation as a fraction of that jerk scale.
    meas_std: joint encoder noise standard deviation (rad or m).
    max_gap_s: a gap between measurements longer than this re-initialises the velocity and
        acceleration (the old motion says little about the new one).
    """

    ramp_time_s: float = 0.5
    jerk_fraction: float = 0.5
    meas_std: float = 1e-3
    max_gap_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("ramp_time_s", "jerk_fraction", "meas_std", "max_gap_s"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"KalmanConfig.{name} must be a finite number > 0, got {value!r}")


def _transition(dt: float) -> np.ndarray:
    return np.array([[1.0, dt, 0.5 * dt * dt], [0.0, 1.0, dt], [0.0, 0.0, 1.0]])


def _process_noise(dt: float) -> np.ndarray:
    """Unit-jerk-variance process noise of the constant-acceleration model over ``dt``."""
    d2, d3, d4, d5 = dt**2, dt**3, dt**4, dt**5
    return np.array([[d5 / 20, d4 / 8, d3 / 6], [d4 / 8, d3 / 3, d2 / 2], [d3 / 6, d2 / 2, dt]])


class JointKalmanFilter:
    """Constant-acceleration KF over the arm joints of ``kin``.

    ``dt`` is the nominal measurement period; it is used when ``update`` gets no stamp. Typical use:
    ``kf.update(q, stamp)`` on every joint-state message, then ``kf.predict_action(control_period,
    gripper_history)`` for the end-effector delta of the next control step.
    """

    def __init__(self, kin: ArmKinematics, dt: float, config: KalmanConfig | None = None) -> None:
        if not (np.isfinite(dt) and dt > 0):
            raise ValueError(f"JointKalmanFilter dt must be a finite number > 0, got {dt!r}")
        self.kin = kin
        self.dt = float(dt)
        self.config = config or KalmanConfig()
        n = kin.n
        vmax = np.where(np.isfinite(kin.limits.velocity), kin.limits.velocity, 10.0)
        self._vmax = vmax
        self._amax = vmax / self.config.ramp_time_s
        self._jerk_var = (self.config.jerk_fraction * self._amax / self.config.ramp_time_s) ** 2
        self._r = self.config.meas_std**2
        self._x = np.zeros((n, 3))
        self._p = np.zeros((n, 3, 3))
        self._stamp: float | None = None
        self._nis = np.zeros(n)  # last normalised innovation squared per joint
        # TCP pose and acceleration of the current state, computed on first use after each change:
        # a decoder asks for both (prediction and threshold) once per control step
        self._tcp_motion: tuple[Pose, np.ndarray] | None = None
        self.n_updates = 0
        self.n_skipped = 0
        self.reset()

    # --- state ------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything (new episode)."""
        self._x[:] = 0.0
        self._p[:] = 0.0
        self._stamp = None
        self._nis[:] = 0.0
        self._tcp_motion = None
        self.n_updates = 0
        self.n_skipped = 0

    @property
    def initialized(self) -> bool:
        return self._stamp is not None

    @property
    def converged(self) -> bool:
        """True once enough measurements were fused for velocity and acceleration to be meaningful."""
        return self.n_updates >= MIN_UPDATES_CONVERGED

    @property
    def stamp(self) -> float | None:
        """Time of the last fused measurement."""
        return self._stamp

    @property
    def q(self) -> np.ndarray:
        return self._x[:, 0].copy()

    @property
    def qd(self) -> np.ndarray:
        return self._x[:, 1].copy()

    @property
    def qdd(self) -> np.ndarray:
        return self._x[:, 2].copy()

    def _initial_covariance(self) -> np.ndarray:
        p = np.zeros((self.kin.n, 3, 3))
        p[:, 0, 0] = self._r
        p[:, 1, 1] = self._vmax**2
        p[:, 2, 2] = self._amax**2
        return p

    # --- filtering --------------------------------------------------------------------------
    def update(self, q: Sequence[float] | np.ndarray, stamp: float | None = None) -> bool:
        """Fuse one joint-position measurement taken at ``stamp`` (seconds).

        Returns False, and counts it in ``n_skipped``, when the measurement was skipped: wrong
        shape, a NaN/inf value, a non-finite stamp or one not after the previous stamp.
        """
        z = np.asarray(q, dtype=float)
        if z.shape != (self.kin.n,) or not np.all(np.isfinite(z)):
            self.n_skipped += 1
            return False
        if stamp is None:
            stamp = (self._stamp + self.dt) if self._stamp is not None else 0.0
        stamp = float(stamp)
        if not np.isfinite(stamp) or (self._stamp is not None and stamp <= self._stamp):
            self.n_skipped += 1
            return False

        if self._stamp is None or stamp - self._stamp > self.config.max_gap_s:
            # (Re)start at rest where the joint was measured: velocity/acceleration unknown.
            self._x[:] = 0.0
            self._x[:, 0] = z
            self._p = self._initial_covariance()
            self._stamp = stamp
            self._nis[:] = 0.0
            self._tcp_motion = None
            self.n_updates = 1
            return True

        dt = stamp - self._stamp
        f = _transition(dt)
        q_unit = _process_noise(dt)
        x_pred = self._x @ f.T  # (n,3)
        p_pred = f @ self._p @ f.T + self._jerk_var[:, None, None] * q_unit  # (n,3,3)

        innovation = z - x_pred[:, 0]
        s = p_pred[:, 0, 0] + self._r
        gain = p_pred[:, :, 0] / s[:, None]  # (n,3): P H^T S^-1 with H = [1 0 0]
        self._x = x_pred + gain * innovation[:, None]
        # Joseph form keeps P symmetric positive semi-definite under round-off.
        i_kh = np.eye(3)[None] - gain[:, :, None] * np.array([1.0, 0.0, 0.0])[None, None, :]
        self._p = i_kh @ p_pred @ np.transpose(i_kh, (0, 2, 1)) + self._r * gain[:, :, None] * gain[:, None, :]
        self._nis = innovation**2 / s

        # The URDF bounds what the joints can do; keep the estimate physically possible.
        self._x[:, 1] = np.clip(self._x[:, 1], -self._vmax, self._vmax)
        self._x[:, 2] = np.clip(self._x[:, 2], -self._amax, self._amax)
        self._stamp = stamp
        self._tcp_motion = None
        self.n_updates += 1
        return True

    def innovation(self) -> float:
        """Normalised innovation magnitude of the last update: sqrt(mean over joints of y^2 / S).

        About 1 when the measurements follow the constant-acceleration model within its noise;
        large when the motion changed unexpectedly. 0 before the second measurement.
        """
        if self.n_updates < 2:
            return 0.0
        nis = self._nis.tolist()  # plain floats: called once per control step, where NumPy's calls cost more
        return math.sqrt(sum(nis) / len(nis))

    # --- prediction -------------------------------------------------------------------------
    def predict_q(self, horizon_s: float) -> np.ndarray:
        """Joint positions ``horizon_s`` after the last measurement, within URDF limits.

        The extrapolation is clamped to what the velocity limits reach over the horizon and then
        to the position limits.
        """
        if not self.initialized:
            raise RuntimeError("JointKalmanFilter.predict_q called before any measurement was fused")
        h = max(float(horizon_s), 0.0)
        q, qd, qdd = self._x[:, 0], self._x[:, 1], self._x[:, 2]
        step = np.clip(qd * h + 0.5 * qdd * h * h, -self._vmax * h, self._vmax * h)
        return np.clip(q + step, self.kin.limits.lower, self.kin.limits.upper)

    def predict_action(self, horizon_s: float, gripper_history: Sequence[float]) -> np.ndarray:
        """Predicted 7-D action: the TCP delta from the filtered q to ``predict_q(horizon_s)``
        (``kin.pose_delta`` convention) and the gripper command, which is its last value in
        ``gripper_history`` (1.0 = open when the history is empty)."""
        delta = self.kin.pose_delta(self._current_tcp_motion()[0], self.kin.fk(self.predict_q(horizon_s)))
        gripper = float(gripper_history[-1]) if len(gripper_history) else 1.0
        return np.concatenate([delta, [gripper if np.isfinite(gripper) else 1.0]])

    def ee_acceleration(self) -> float:
        """Magnitude of the TCP linear acceleration (m/s^2) implied by the filtered state:
        ``J qdd + dJ/dt qd`` at the filtered q (clamped to the position limits)."""
        if not self.initialized:
            return 0.0
        return math.hypot(*self._current_tcp_motion()[1].tolist())

    def _current_tcp_motion(self) -> tuple[Pose, np.ndarray]:
        """(TCP pose, TCP linear acceleration) of the filtered state, q clamped to the position
        limits; kept until the state changes."""
        if self._tcp_motion is None:
            q = np.clip(self._x[:, 0], self.kin.limits.lower, self.kin.limits.upper)
            self._tcp_motion = self.kin.fk_acceleration(q, self._x[:, 1], self._x[:, 2])
        return self._tcp_motion
