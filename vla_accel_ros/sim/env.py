"""Pick-cube task in MuJoCo: "pick up the {color} cube" among a red, a green and a blue cube.

One ``step`` is one control period (20 Hz by default) of physics substeps. Actions go through
``vla_accel_ros.core.actions.action_to_joint_targets`` (differential IK on the URDF, clamped to its
limits), the same path the ROS node uses. Everything is deterministic for a given seed.

Success: the named cube's bottom is at least ``lift_height`` (5 cm) above the table for
``success_hold_steps`` consecutive steps; the episode then ends. Otherwise it ends after
``max_steps`` (120 steps = 6 s at 20 Hz), and success is judged on the final state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from vla_accel_ros.core.actions import (
    action_to_joint_targets,
    gripper_command_to_opening,
)
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.sim.scene import (
    CUBE_COLORS,
    CUBE_HALF_SIZE,
    TABLE_TOP_Z,
    build_scene,
)

Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
NEAR_CONTACT_DISTANCE = 0.02  # m, gripper-to-target clearance counted as "near contact"
CUBE_X_RANGE = (0.38, 0.62)
CUBE_Y_RANGE = (-0.2, 0.2)
CUBE_MIN_SEPARATION = 0.1
CUBE_YAW_RANGE = 0.25  # rad; a parallel gripper still grasps a cube turned this far
INSTRUCTION_TEMPLATE = "pick up the {color} cube"


@dataclass(frozen=True)
class SimConfig:
    image_size: int = 128
    control_hz: float = 20.0
    max_steps: int = 120
    wrist_camera: bool = False
    wrist_image: bool = False  # also render the wrist camera: the observation's second image slot
    urdf: str | None = None
    tcp_frame: str = "tcp"
    render: bool = True
    lift_height: float = 0.05
    success_hold_steps: int = 3
    home_noise: float = 0.05  # rad of uniform noise on the start pose

    def __post_init__(self) -> None:
        if not 16 <= self.image_size <= 1024:
            raise ValueError(f"image_size must be in [16, 1024], got {self.image_size}")
        if not 1.0 <= self.control_hz <= 500.0:
            raise ValueError(f"control_hz must be in [1, 500], got {self.control_hz}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


def _box_distance(point: np.ndarray, center: np.ndarray, rotation: np.ndarray, half: float) -> float:
    """Distance from a point to a cube (0 inside)."""
    local = rotation.T @ (point - center)
    return float(np.linalg.norm(np.maximum(np.abs(local) - half, 0.0)))


class PickCubeEnv:
    """The MuJoCo pick-cube task with offscreen rendering (``MUJOCO_GL=egl`` on a headless box)."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        urdf = self.config.urdf or str(default_urdf())
        self.kin = ArmKinematics(urdf, tcp_frame=self.config.tcp_frame)
        self.model, self.handles = build_scene(urdf, self.kin)
        self.data = mujoco.MjData(self.model)
        self.control_dt = 1.0 / self.config.control_hz
        self.substeps = max(1, int(round(self.control_dt / self.model.opt.timestep)))
        self._renderer: mujoco.Renderer | None = None
        self._max_opening = float(self.kin.gripper_limits.upper.max()) if self.kin.gripper_joint_names else 0.0
        self.color = "red"
        self.instruction = INSTRUCTION_TEMPLATE.format(color=self.color)
        self.seed = 0
        self.steps = 0
        self._lifted_steps = 0
        self.gripper_command = 1.0

    # --- episode ------------------------------------------------------------------------------
    def reset(self, seed: int, color: str | None = None) -> Observation:
        rng = np.random.default_rng(seed)
        self.seed = int(seed)
        self.color = color if color is not None else str(rng.choice(list(CUBE_COLORS)))
        if self.color not in CUBE_COLORS:
            raise ValueError(f"unknown cube colour '{self.color}'; choose from {', '.join(CUBE_COLORS)}")
        self.instruction = INSTRUCTION_TEMPLATE.format(color=self.color)
        mujoco.mj_resetData(self.model, self.data)

        q0 = self.kin.clamp(Q_HOME + rng.uniform(-1, 1, self.kin.n) * self.config.home_noise, Q_HOME, 1e9)
        self.data.qpos[self.handles.arm_qpos] = q0
        self.data.ctrl[self.handles.arm_actuators] = q0
        self.gripper_command = 1.0
        self.data.qpos[self.handles.finger_qpos] = self._max_opening
        self.data.ctrl[self.handles.finger_actuators] = self._max_opening

        placed: list[np.ndarray] = []
        for cube in CUBE_COLORS:
            while True:
                xy = np.array([rng.uniform(*CUBE_X_RANGE), rng.uniform(*CUBE_Y_RANGE)])
                if all(np.linalg.norm(xy - other) >= CUBE_MIN_SEPARATION for other in placed):
                    break
            placed.append(xy)
            yaw = rng.uniform(-CUBE_YAW_RANGE, CUBE_YAW_RANGE)
            adr = self.handles.cube_qpos[cube]
            self.data.qpos[adr : adr + 3] = (xy[0], xy[1], TABLE_TOP_Z + CUBE_HALF_SIZE)
            self.data.qpos[adr + 3 : adr + 7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        mujoco.mj_forward(self.model, self.data)
        for _ in range(25):  # let contacts settle before the first frame
            mujoco.mj_step(self.model, self.data)
        self.data.time = 0.0
        self.steps = 0
        self._lifted_steps = 0
        return self.observation()

    def step(self, action: np.ndarray) -> tuple[Observation, dict[str, Any]]:
        """Execute one action (7-D, OpenVLA convention) for one control period."""
        q_target, gripper = action_to_joint_targets(self.kin, self.joint_positions(), action, self.control_dt)
        self.apply_joint_targets(q_target, gripper)
        self.advance()
        return self.observation(), self.info()

    def apply_joint_targets(self, q_arm: np.ndarray, gripper_command: float) -> None:
        """Set the servo targets (the low-level path the ROS sim bridge uses too)."""
        q_arm = np.asarray(q_arm, dtype=float)
        if q_arm.shape != (self.kin.n,) or not np.all(np.isfinite(q_arm)):
            raise ValueError(f"joint targets must be {self.kin.n} finite numbers, got {q_arm}")
        self.data.ctrl[self.handles.arm_actuators] = np.clip(q_arm, self.kin.limits.lower, self.kin.limits.upper)
        self.gripper_command = float(np.clip(gripper_command, 0.0, 1.0))
        self.data.ctrl[self.handles.finger_actuators] = gripper_command_to_opening(
            self.gripper_command, self._max_opening
        )

    def advance(self) -> None:
        """Run one control period of physics and update the success bookkeeping."""
        mujoco.mj_step(self.model, self.data, nstep=self.substeps)
        self.steps += 1
        self._lifted_steps = self._lifted_steps + 1 if self._target_lifted() else 0

    # --- state --------------------------------------------------------------------------------
    @property
    def time(self) -> float:
        return float(self.data.time)

    @property
    def done(self) -> bool:
        return self.steps >= self.config.max_steps or self._lifted_steps >= self.config.success_hold_steps

    def success(self) -> bool:
        return self._lifted_steps >= self.config.success_hold_steps or (
            self.steps >= self.config.max_steps and self._target_lifted()
        )

    def _target_lifted(self) -> bool:
        bottom = self.cube_position(self.color)[2] - CUBE_HALF_SIZE
        return bottom - TABLE_TOP_Z >= self.config.lift_height

    def joint_positions(self) -> np.ndarray:
        return self.data.qpos[self.handles.arm_qpos].copy()

    def joint_velocities(self) -> np.ndarray:
        return self.data.qvel[self.handles.arm_dof].copy()

    def finger_positions(self) -> np.ndarray:
        return self.data.qpos[self.handles.finger_qpos].copy()

    def gripper_opening(self) -> float:
        """One finger's opening (m), the gripper value in the observation."""
        fingers = self.finger_positions()
        return float(fingers.mean()) if fingers.size else 0.0

    def cube_position(self, color: str) -> np.ndarray:
        return self.data.xpos[self.handles.cube_body[color]].copy()

    def cube_rotation(self, color: str) -> np.ndarray:
        return self.data.xmat[self.handles.cube_body[color]].reshape(3, 3).copy()

    def tcp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        body = self.handles.tcp_body
        return self.data.xpos[body].copy(), self.data.xmat[body].reshape(3, 3).copy()

    def target_clearance(self) -> float:
        """Distance from the gripper (TCP and both finger pads) to the target cube."""
        center, rotation = self.cube_position(self.color), self.cube_rotation(self.color)
        points = [self.tcp_pose()[0]]
        for body, side in zip(self.handles.finger_bodies, (1.0, -1.0)):
            finger_rot = self.data.xmat[body].reshape(3, 3)
            points.append(self.data.xpos[body] + finger_rot @ np.array([0.0, 0.008 * side, 0.025]))
        return min(_box_distance(p, center, rotation, CUBE_HALF_SIZE) for p in points)

    def info(self) -> dict[str, Any]:
        clearance = self.target_clearance()
        return {
            "success": self.success(),
            "near_contact": clearance < NEAR_CONTACT_DISTANCE,
            "target_clearance": clearance,
            "tcp_pos": self.tcp_pose()[0],
            "target_pos": self.cube_position(self.color),
            "step": self.steps,
        }

    # --- rendering ----------------------------------------------------------------------------
    def render(self, camera: str | None = None) -> np.ndarray:
        """RGB uint8 image (image_size x image_size x 3) from the front (or the wrist) camera."""
        if self._renderer is None:
            size = self.config.image_size
            self._renderer = mujoco.Renderer(self.model, height=size, width=size)
            # Shadows and reflections cost ~15x the render time on a software (CPU) GL.
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._renderer.update_scene(self.data, camera=camera or self.handles.camera)
        return self._renderer.render().copy()

    def observation(self) -> Observation:
        size = self.config.image_size
        image = self.render() if self.config.render else np.zeros((size, size, 3), np.uint8)
        return Observation(
            image=image,
            instruction=self.instruction,
            joint_pos=self.joint_positions(),
            gripper=self.gripper_opening(),
            stamp=self.time,
            extra_images=(self.render(self.handles.wrist_camera),) if self.config.wrist_image and self.config.render
            else (),
        )

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __enter__(self) -> PickCubeEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
