"""The Kalman fallback: what the control core commands when no fresh policy action is due.

The joint-space Kalman filter extrapolates the arm's motion over one action step, i.e. it stands in
for the late action. Its velocity decays linearly to 0 over ``fallback_max_s`` after the last fresh
action (or after the hold before it); then the window is used up and the core holds, reporting how
long no action came (``starved_s``). ROS-free; not thread-safe (the controller calls it under its lock).
"""

from __future__ import annotations

import numpy as np

from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics


class FallbackWindow:
    """The fallback window and the filter's prediction within it."""

    def __init__(self, kin: ArmKinematics, kf: JointKalmanFilter, *, action_dt_s: float,
                 fallback_max_s: float) -> None:
        self.kin = kin
        self.kf = kf  # the controller's filter: read here, updated there
        self.action_dt_s = action_dt_s
        self.fallback_max_s = fallback_max_s
        self.start: float | None = None  # the last fresh action, or the first tick after a hold
        self.starved_s = 0.0  # how long no fresh action came, while that holds the arm

    def used_up(self, now: float) -> str:
        """Why the window is used up at ``now`` ('' = it is not); then ``starved_s`` says for how long."""
        assert self.start is not None
        elapsed = now - self.start
        if elapsed > self.fallback_max_s + 1e-9:  # a tick at the window end, give or take round-off, falls back
            # Persistent inference failure, or a policy far slower than the window: extrapolating on
            # would carry the arm's last motion on with nobody deciding it.
            self.starved_s = elapsed
            return f"no fresh policy action for {elapsed:.3f} s (fallback_max_s = {self.fallback_max_s:g} s)"
        return ""

    def predict(self, now: float) -> tuple[np.ndarray | None, str]:
        """The filter's prediction for ``now`` and how it was made (None: the filter has no state yet)."""
        assert self.start is not None
        elapsed = now - self.start
        # Extrapolate from the last measurement to one action step past the tick: the filter stands
        # in for the action the policy would have sent, with the same lead on the servo, its velocity
        # decaying to 0 over the window so that the motion ends when the window does.
        speed = max(1.0 - elapsed / self.fallback_max_s, 0.0) if self.fallback_max_s > 0.0 else 0.0
        kf = self.kf
        if kf.initialized and kf.stamp is not None:
            q_pred = kf.predict_q(max(now - kf.stamp, 0.0) + self.action_dt_s)
            if speed < 1.0:
                q_filtered = np.clip(kf.q, self.kin.limits.lower, self.kin.limits.upper)
                q_pred = q_filtered + speed * (q_pred - q_filtered)
            return q_pred, f"Kalman prediction at {speed:.0%} speed"
        return None, "filter not initialised, measured position"
