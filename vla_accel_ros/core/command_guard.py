"""The last word on every command the control core returns (:class:`CommandGuard`).

An arm command is kept within what the velocity limits reach from the measured position over one
command's horizon, then within velocity limit x period of the previous returned command (the very
first one: of the measured position) and within the position limits; a command that is not a finite
arm configuration repeats the previous one (a trip). Two consecutive commands therefore never differ
by more than v*T per joint, whatever the measurements, the source or the hold target do.

The fingers obey the same rule: each finger position within its limits and within its velocity
limit x period of the previous one (of the measured opening, the first time); a finger without a
URDF velocity limit moves at most ``gripper_velocity``. ROS-free; not thread-safe (the controller
calls it under its lock).
"""

from __future__ import annotations

import numpy as np

from vla_accel_ros.core.actions import gripper_command_to_opening
from vla_accel_ros.core.kinematics import ArmKinematics


class CommandGuard:
    """Clamps arm and finger commands against the URDF limits and the previous command."""

    def __init__(self, kin: ArmKinematics, *, period_s: float, action_dt_s: float, gripper_velocity: float) -> None:
        self.kin = kin
        velocity = kin.limits.velocity
        # Reach of the arm from its measured position within one command's horizon.
        self._reach = velocity * max(period_s, action_dt_s)
        self._step = velocity * period_s  # most a command may differ from the previous one
        self._lo, self._hi = np.empty(kin.n), np.empty(kin.n)  # the bounds, reused every tick
        finger_velocity = kin.gripper_limits.velocity
        self._finger_step = np.where(np.isfinite(finger_velocity), finger_velocity, gripper_velocity) * period_s
        self._max_opening = float(kin.gripper_limits.upper.max()) if kin.gripper_joint_names else 0.0
        self.last_arm: np.ndarray | None = None  # the previous returned arm command
        self.last_fingers: np.ndarray | None = None

    def arm(self, q_cmd: np.ndarray | None, q_measured: np.ndarray | None) -> tuple[np.ndarray | None, bool]:
        """The arm command to return for ``q_cmd`` and whether the guard tripped (``q_cmd`` was no
        finite arm configuration: the previous command again). None when there is nothing to
        command (no candidate, or no measurement yet)."""
        if q_cmd is None or q_measured is None:
            return None, False
        lim = self.kin.limits
        previous = self.last_arm
        if previous is None:  # the very first command continues from where the arm is
            previous = np.clip(q_measured, lim.lower, lim.upper)
        q = np.asarray(q_cmd, dtype=float)
        if q.shape == (self.kin.n,) and np.all(np.isfinite(q)):
            lo, hi = self._lo, self._hi
            np.subtract(q_measured, self._reach, out=lo)
            np.add(q_measured, self._reach, out=hi)
            out = np.clip(q, lo, hi)  # the one new array: it becomes the previous command
            # Last, so that it always holds: the previous command is within the position limits,
            # so clipping to them keeps the step within v*T.
            np.subtract(previous, self._step, out=lo)
            np.add(previous, self._step, out=hi)
            np.clip(out, lo, hi, out=out)
            np.clip(out, lim.lower, lim.upper, out=out)
            if np.isfinite(out).all():
                return out, False
        return previous, True

    def fingers(self, gripper_cmd: float, measured_opening: float | None) -> np.ndarray:
        """The finger positions for a gripper command in [0, 1] (1 = open): within each finger's
        velocity limit x period of the previous returned ones (the first time: of
        ``measured_opening``, when known) and within the limits."""
        lim = self.kin.gripper_limits
        opening = gripper_command_to_opening(gripper_cmd, self._max_opening)
        fingers = np.clip(np.full(len(self.kin.gripper_joint_names), opening), lim.lower, lim.upper)
        previous = self.last_fingers
        if previous is None:
            if measured_opening is None:
                return fingers  # no measured opening to continue from: the command itself
            previous = np.clip(np.full(len(fingers), measured_opening), lim.lower, lim.upper)
        out = np.clip(fingers, previous - self._finger_step, previous + self._finger_step)
        return np.clip(out, lim.lower, lim.upper)

    def returned(self, arm: np.ndarray, fingers: np.ndarray) -> None:
        """The commands that were returned: the next ones are within a step of these."""
        self.last_arm, self.last_fingers = arm, fingers
