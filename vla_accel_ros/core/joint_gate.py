"""Which joint-state samples the control core believes (:class:`JointGate`).

A sample further from the last accepted one than the velocity limits reach over the elapsed time
(plus ``JUMP_SLACK``) is an outlier. Outliers that agree with each other (each within reach of the
one before) for ``jump_confirm_s`` of arrival time are a real jump (an episode reset, an arm moved
by hand). Time, not a sample count, decides: three samples of a glitch take 1.5 ms at 2 kHz, and a
burst delivered at once takes none. A sample beyond the URDF position limits by more than
``joint_limit_tolerance`` is never believed. ROS-free; not thread-safe (the controller calls it
under its lock).
"""

from __future__ import annotations

import math

import numpy as np

from vla_accel_ros.core.kinematics import ArmKinematics

# A measured position further from the last accepted one than the velocity limits reach over the
# elapsed time, plus this slack (rad or m: encoder noise, stamping jitter), is no motion the arm can
# make: an outlier, or the first sample after a reset or teleport.
JUMP_SLACK = 0.05
# Speed the gate assumes for a joint without a URDF velocity limit (rad/s or m/s).
UNLIMITED_SPEED = 10.0

ACCEPT, OUTLIER, JUMP = "accept", "outlier", "jump"


class JointGate:
    """Classifies each joint-state sample against the last accepted one (module docstring)."""

    def __init__(self, kin: ArmKinematics, *, jump_confirm_s: float, joint_limit_tolerance: float) -> None:
        self.kin = kin
        self.jump_confirm_s = jump_confirm_s
        self.joint_limit_tolerance = joint_limit_tolerance
        velocity = kin.limits.velocity
        self._speed = np.where(np.isfinite(velocity), velocity, UNLIMITED_SPEED)
        self.last_outlier = ""  # why the last outlier was gated
        self.forget()

    def forget(self) -> None:
        """No outlier is the start of a jump any more (the core restarted)."""
        # the newest outlier, its arrival, when the run of agreeing ones began, how many agree
        self._jump_q: np.ndarray | None = None
        self._jump_rx = -math.inf
        self._jump_since = -math.inf
        self._jump_n = 0

    def beyond_limits(self, q: np.ndarray) -> str:
        """What puts ``q`` further past a URDF position limit than ``joint_limit_tolerance``, or ''."""
        lower, upper = self.kin.limits.lower, self.kin.limits.upper
        beyond = np.maximum(lower - q, q - upper)
        worst = int(np.argmax(beyond))
        if beyond[worst] <= self.joint_limit_tolerance:
            return ""
        return (f"{self.kin.joint_names[worst]} = {q[worst]:.6g} is outside its limits "
                f"[{lower[worst]:.4g}, {upper[worst]:.4g}] by {beyond[worst]:.4g} (joint_limit_tolerance "
                f"{self.joint_limit_tolerance:g})")

    def check(self, q: np.ndarray, now: float, accepted: np.ndarray, accepted_at: float) -> str:
        """``ACCEPT``, ``OUTLIER`` (``last_outlier`` says why) or ``JUMP`` (a confirmed jump: accept
        ``q`` and restart) for the sample ``q`` arriving at ``now``, the last accepted one being
        ``accepted`` at ``accepted_at``."""
        excess = np.abs(q - accepted) - self._speed * max(now - accepted_at, 0.0)
        if not np.any(excess > JUMP_SLACK):
            self._jump_q, self._jump_n = None, 0
            return ACCEPT
        agrees = (self._jump_q is not None and not np.any(
            np.abs(q - self._jump_q) - self._speed * max(now - self._jump_rx, 0.0) > JUMP_SLACK))
        if not agrees:
            self._jump_since, self._jump_n = now, 0
        self._jump_n += 1
        self._jump_q, self._jump_rx = q, now
        persisted = now - self._jump_since
        confirm = self.jump_confirm_s
        if persisted >= confirm - 1e-9 and (self._jump_n > 1 or confirm <= 0.0):  # round-off of summed periods
            return JUMP
        worst = int(np.argmax(excess))
        self.last_outlier = (
            f"joint state outlier: {self.kin.joint_names[worst]} at {q[worst]:.4f}, "
            f"{abs(q[worst] - accepted[worst]):.4f} "
            f"from the last accepted sample {max(now - accepted_at, 0.0):.3f} s before, more than its velocity limit "
            f"reaches (+{JUMP_SLACK} slack); gated (agreeing outliers for {persisted:.3f} s, a real jump persists "
            f"jump_confirm_s = {confirm:g} s)")
        return OUTLIER
