"""The hold: why the control core holds the arm at a tick, and where.

Why: an input missing or stale past its watchdog, a joint state beyond the limits, disabled, no
instruction, or a fault set from outside (the clock stopped, the inference worker down, a robot
description that contradicts the URDF in use); the controller adds the fallback used up. Where: the
measured position at the moment the hold began, latched, so a sagging arm does not drift the hold
target. ROS-free; the controller keeps one and calls it under its lock.
"""

from __future__ import annotations

import numpy as np

from vla_accel_ros.core.cameras import CameraSet
from vla_accel_ros.core.kinematics import ArmKinematics


def stale_reason(what: str, received: float, timeout_s: float, now: float, ahead_s: float) -> str:
    """Why an input received at ``received`` is too old (or stamped more than ``ahead_s`` ahead of
    ``now``: the clock went back), else ''."""
    if now - received > timeout_s:
        return f"{what} stale ({now - received:.3f} s > {timeout_s} s)"
    if received - now > ahead_s:
        return f"{what} stale (stamped {received - now:.3f} s ahead: the clock went back)"
    return ""


class Hold:
    """The hold reasons in the order they are reported, the faults set from outside ('' = none), and
    the hold in force (``reason``, ``target``)."""

    def __init__(self, kin: ArmKinematics, *, joint_state_timeout_s: float, camera_timeout_s: float,
                 period_s: float) -> None:
        self.kin = kin
        self.joint_state_timeout_s = joint_state_timeout_s
        self.camera_timeout_s = camera_timeout_s
        self.period_s = period_s  # an input stamped further ahead than this means the clock went back
        self.clock_fault = ""  # the node's clock stopped (sim time without /clock)
        self.inference_fault = ""  # why the inference worker is down
        self.config_fault = ""  # e.g. a robot description that contradicts the URDF in use
        self.reason = ""  # why the arm holds ('' = it does not)
        self.target: np.ndarray | None = None  # the position held, latched when the hold began

    def why(self, now: float, *, joints_received: float | None, beyond_limits: str, cameras: CameraSet,
            enabled: bool, instruction: str) -> str:
        """Why the arm must hold at ``now`` ('' = it need not); ``joints_received``: the newest joint
        state's arrival, None before the first."""
        if joints_received is None:
            return "no joint state received"
        if self.clock_fault:  # the watchdogs below compare times on the stopped clock
            return self.clock_fault
        if beyond_limits:
            return f"joint state beyond the URDF limits: {beyond_limits}; holding the last valid position"
        if stale := stale_reason("joint states", joints_received, self.joint_state_timeout_s, now, self.period_s):
            return stale
        if stale := cameras.hold_reason(now, self.camera_timeout_s, self.period_s):
            return stale
        if not enabled:
            return "disabled"
        if not instruction:
            return "waiting for an instruction"
        if self.inference_fault:
            return f"inference unavailable: {self.inference_fault}"
        if self.config_fault:
            return self.config_fault
        return ""

    def latch(self, reason: str, q_measured: np.ndarray | None) -> np.ndarray | None:
        """Hold for ``reason``: the target, latched at ``q_measured`` (within the limits) if the hold
        begins now; None before the first joint state."""
        self.reason = reason
        if q_measured is None:
            return None
        if self.target is None:
            self.target = np.clip(q_measured, self.kin.limits.lower, self.kin.limits.upper)
        return self.target

    def release(self) -> None:
        """The arm no longer holds: the next hold latches where the arm is then."""
        self.target, self.reason = None, ""
