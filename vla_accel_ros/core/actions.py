"""From a policy action to joint targets: the one path shared by the sim, the expert and the node.

An action is 7 numbers per control step, OpenVLA convention: end-effector Δx Δy Δz (m), Δroll
Δpitch Δyaw (rad, a world-frame rotation vector; see ``kinematics``) and a gripper command in
[0, 1] with 1 = open and 0 = closed.
"""

from __future__ import annotations

import numpy as np

from vla_accel_ros.core.kinematics import ArmKinematics

ACTION_DIM = 7
ACTION_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")


def validate_action(action: np.ndarray) -> np.ndarray:
    """Return the action as float64 (7,), or raise ValueError naming what is wrong."""
    action = np.asarray(action, dtype=float)
    if action.shape != (ACTION_DIM,):
        raise ValueError(f"action must have {ACTION_DIM} numbers, got shape {action.shape}")
    if not np.all(np.isfinite(action)):
        raise ValueError(f"action has non-finite values: {action}")
    return action


def action_to_joint_targets(
    kin: ArmKinematics, q_current: np.ndarray, action: np.ndarray, dt: float
) -> tuple[np.ndarray, float]:
    """Joint targets (clamped to URDF position and velocity limits over ``dt``) and gripper command."""
    action = validate_action(action)
    q_target = kin.clamp(kin.ik(q_current, action[:6]), q_current, dt)
    return q_target, float(np.clip(action[6], 0.0, 1.0))


def gripper_command_to_opening(command: float, max_opening: float) -> float:
    """Finger position for a gripper command in [0, 1] (1 = fully open)."""
    return float(np.clip(command, 0.0, 1.0) * max_opening)
