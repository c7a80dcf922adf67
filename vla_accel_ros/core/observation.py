"""The one observation type shared by the sim, the policy, the controller and the node."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Observation:
    """What the policy sees at one control step.

    image: RGB uint8, shape (H, W, 3).
    instruction: free text, e.g. "pick up the red cube".
    joint_pos: arm joint positions in the arm's joint order (rad or m), shape (n_arm,).
    gripper: finger opening in metres (sum of both fingers' travel is not used: one finger's).
    stamp: time of the observation in seconds (sim or ROS time).
    extra_images: the further cameras' RGB uint8 images (a wrist camera, ...), in the order of the
        model's image slots after ``image``.
    state: the robot state a policy reads in place of :attr:`proprio`, raw (OpenVLA-OFT's proprio
        as its dataset recorded it, e.g. LIBERO's end-effector pose and gripper); None: ``proprio``.
    """

    image: np.ndarray
    instruction: str
    joint_pos: np.ndarray
    gripper: float
    stamp: float = 0.0
    extra_images: tuple[np.ndarray, ...] = ()
    state: np.ndarray | None = None

    @property
    def images(self) -> tuple[np.ndarray, ...]:
        """Every camera's image, in the model's image slots: ``image`` then ``extra_images``."""
        return (self.image, *self.extra_images)

    @property
    def proprio(self) -> np.ndarray:
        """Proprioception vector fed to the policy: arm joints then gripper opening."""
        joints = np.asarray(self.joint_pos)
        out = np.empty(joints.shape[0] + 1, np.float32)  # one allocation: read at every prefill
        out[:-1] = joints
        out[-1] = self.gripper
        return out
