"""From a policy action to joint targets: the one path shared by the sim, the expert and the node.

A policy acts in one of two action spaces, which its robot record declares (``action_space``):

- ``ee_delta_world_rotvec+gripper`` (OpenVLA, OFT on LIBERO and Bridge, the package's own policies):
  7 numbers per control step, end-effector Δx Δy Δz (m), Δroll Δpitch Δyaw (rad, a world-frame
  rotation vector; see ``kinematics``), then the gripper; turned into joint targets by differential IK;
- ``joint_position+gripper`` (OFT on ALOHA, most LeRobot policies): the arm's absolute joint
  positions (rad, URDF order), then the gripper: DOF + 1 numbers.

The gripper command is in [0, 1] with 1 = open and 0 = closed. Either way the joint targets are
clamped to the URDF position limits and to what the velocity limits reach over one action step.
"""

from __future__ import annotations

import numpy as np

from vla_accel_ros.core.kinematics import ArmKinematics

ACTION_DIM = 7  # an end-effector delta action
ACTION_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")
EE_DELTA = "ee_delta_world_rotvec+gripper"
JOINT_POSITION = "joint_position+gripper"
ACTION_SPACES = (EE_DELTA, JOINT_POSITION)


def check_action_space(space: str) -> str:
    """``space`` if it is one of ``ACTION_SPACES``, else ValueError naming them."""
    if space not in ACTION_SPACES:
        raise ValueError(f"unknown action space '{space}': one of {', '.join(ACTION_SPACES)}")
    return space


def action_width(space: str, dof: int) -> int:
    """The numbers of one action in ``space`` for an arm of ``dof`` joints."""
    return ACTION_DIM if check_action_space(space) == EE_DELTA else dof + 1


def validate_action(action: np.ndarray, width: int = ACTION_DIM) -> np.ndarray:
    """Return the action as float64 (width,), or raise ValueError naming what is wrong."""
    action = np.asarray(action, dtype=float)
    if action.shape != (width,):
        raise ValueError(f"action must have {width} numbers, got shape {action.shape}")
    if not np.all(np.isfinite(action)):
        raise ValueError(f"action has non-finite values: {action}")
    return action


def action_to_joint_targets(
    kin: ArmKinematics, q_current: np.ndarray, action: np.ndarray, dt: float, space: str = EE_DELTA
) -> tuple[np.ndarray, float]:
    """Joint targets (clamped to URDF position and velocity limits over ``dt``) and gripper command."""
    action = validate_action(action, action_width(space, kin.n))
    target = kin.ik(q_current, action[:6]) if space == EE_DELTA else action[:-1]
    return kin.clamp(target, q_current, dt), float(np.clip(action[-1], 0.0, 1.0))


def gripper_command_to_opening(command: float, max_opening: float) -> float:
    """Finger position for a gripper command in [0, 1] (1 = fully open)."""
    return float(np.clip(command, 0.0, 1.0) * max_opening)
