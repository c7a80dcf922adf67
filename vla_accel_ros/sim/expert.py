"""A scripted expert for the pick-cube task, in the OpenVLA action convention.

It reads the privileged sim state (cube pose, TCP pose) and moves through four phases: above the
cube, down to it, close the gripper, lift. Each action is an end-effector delta for one control
step, executed by the environment through the same IK path the node uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pinocchio as pin

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.sim.env import NEAR_CONTACT_DISTANCE, PickCubeEnv

# The TCP's home orientation: gripper pointing straight down.
R_DOWN = np.diag([1.0, -1.0, -1.0])


@dataclass(frozen=True)
class ExpertConfig:
    max_translation: float = 0.02  # m per step (0.4 m/s at 20 Hz)
    # No rotation: the 5-px cubes of the 128-px camera show no usable yaw, so aligning the gripper
    # to it would teach an action the policy cannot infer; the open fingers grasp any yaw.
    max_rotation: float = 0.0  # rad per step
    gain: float = 0.7  # fraction of the remaining error removed per step
    hover_height: float = 0.10  # above the cube centre before descending
    grasp_height: float = 0.0  # TCP height over the cube centre when closing
    lift_height: float = 0.16
    xy_tolerance: float = 0.008
    z_tolerance: float = 0.008
    close_steps: int = 6
    # Back to "approach" when the cube is this far (xy) from the TCP after the approach, or has been
    # left behind during the lift: labels stay right in states the expert itself never visits,
    # which policy-in-the-loop collection (DAgger) reaches.
    recover_distance: float = 0.03
    drop_height: float = 0.04


def _yaw_target(cube_rotation: np.ndarray, tcp_rotation: np.ndarray) -> float:
    """Gripper yaw aligned with the cube, choosing the closest of its 90-degree symmetric faces."""
    cube_yaw = np.arctan2(cube_rotation[1, 0], cube_rotation[0, 0])
    tcp_yaw = np.arctan2(tcp_rotation[1, 0], tcp_rotation[0, 0])
    return tcp_yaw + (cube_yaw - tcp_yaw + np.pi / 4) % (np.pi / 2) - np.pi / 4


def _rz(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


class ScriptedExpert:
    """Phase machine: approach -> descend -> close -> lift."""

    def __init__(self, env: PickCubeEnv, config: ExpertConfig | None = None) -> None:
        self.env = env
        self.config = config or ExpertConfig()
        self.reset()

    def reset(self) -> None:
        self.phase = "approach"
        self._closed_steps = 0
        self._yaw: float | None = None

    def act(self, obs: Observation | None = None) -> np.ndarray:
        cfg = self.config
        env = self.env
        cube = env.cube_position(env.color)
        tcp, tcp_rot = env.tcp_pose()
        if self._yaw is None:
            self._yaw = _yaw_target(env.cube_rotation(env.color), tcp_rot)
        gripper = 1.0
        if self.phase != "approach":
            lost = np.linalg.norm((cube - tcp)[:2]) > cfg.recover_distance
            dropped = self.phase == "lift" and tcp[2] - cube[2] > cfg.drop_height
            if lost or dropped:
                self.phase, self._closed_steps = "approach", 0
        if self.phase == "approach":
            goal = cube + np.array([0.0, 0.0, cfg.hover_height])
            if np.linalg.norm((goal - tcp)[:2]) < cfg.xy_tolerance and abs(goal[2] - tcp[2]) < 0.02:
                self.phase = "descend"
        if self.phase == "descend":
            goal = cube + np.array([0.0, 0.0, cfg.grasp_height])
            if np.linalg.norm((goal - tcp)[:2]) < 1.5 * cfg.xy_tolerance and abs(goal[2] - tcp[2]) < cfg.z_tolerance:
                self.phase = "close"
        if self.phase == "close":
            goal = tcp.copy()
            gripper = 0.0
            self._closed_steps += 1
            if self._closed_steps >= cfg.close_steps:
                self.phase = "lift"
        if self.phase == "lift":
            goal = np.array([tcp[0], tcp[1], cube[2] + cfg.lift_height])
            gripper = 0.0

        translation = cfg.gain * (goal - tcp)
        norm = np.linalg.norm(translation)
        if norm > cfg.max_translation:
            translation *= cfg.max_translation / norm
        rotation = pin.log3(_rz(self._yaw) @ R_DOWN @ tcp_rot.T)
        rotation = np.clip(cfg.gain * rotation, -cfg.max_rotation, cfg.max_rotation)
        return np.concatenate([translation, rotation, [gripper]]).astype(np.float32)


def run_expert_episode(
    env: PickCubeEnv,
    seed: int,
    record: bool = False,
    action_noise: float = 0.0,
    policy_action: Callable[[Observation], np.ndarray] | None = None,
    policy_share: float = 0.0,
) -> dict:
    """Run one expert episode; return success and, if ``record``, every step's data.

    ``action_noise`` > 0 executes a perturbed action (Gaussian, that fraction of the per-step
    translation/rotation limits) while recording the expert's clean action. Training on such
    episodes teaches the policy to recover from its own small errors (noise injection, "DART").

    ``policy_action`` with ``policy_share`` > 0 executes, at that share of the steps (seeded), the
    policy's own action instead of the expert's, still recording the expert's label (DAgger): the
    data then covers the states the policy drives itself into, which expert-only data never shows.
    """
    if not 0.0 <= policy_share <= 1.0:
        raise ValueError(f"policy_share must be in [0, 1], got {policy_share}")
    if policy_share > 0 and policy_action is None:
        raise ValueError("policy_share > 0 needs a policy_action")
    expert = ScriptedExpert(env)
    noise_rng = np.random.default_rng([seed, 1])
    mix_rng = np.random.default_rng([seed, 2])
    noise_scale = action_noise * np.array([expert.config.max_translation] * 3 + [expert.config.max_rotation] * 3
                                          + [0.0])
    obs = env.reset(seed)
    steps: dict[str, list] = {k: [] for k in ("images", "joint_pos", "gripper", "actions", "near_contact",
                                              "target_clearance", "tcp_pos", "target_pos")}
    while not env.done:
        action = expert.act(obs)
        if record:
            steps["images"].append(obs.image)
            if obs.extra_images:
                steps.setdefault("wrist_images", []).append(obs.extra_images[0])
            steps["joint_pos"].append(obs.joint_pos.astype(np.float32))
            steps["gripper"].append(np.float32(obs.gripper))
            steps["actions"].append(action)
            clearance = env.target_clearance()  # at the observation, the label a contact head learns
            steps["near_contact"].append(clearance < NEAR_CONTACT_DISTANCE)
            steps["target_clearance"].append(np.float32(clearance))
            steps["tcp_pos"].append(env.tcp_pose()[0])
            steps["target_pos"].append(env.cube_position(env.color))
        executed = action + noise_scale * noise_rng.standard_normal(7) if action_noise > 0 else action
        if policy_share > 0 and mix_rng.random() < policy_share:
            executed = policy_action(obs)
        obs, _ = env.step(executed)
    return {"success": env.success(), "steps": env.steps, "color": env.color, "instruction": env.instruction,
            "policy_in_loop": policy_share > 0, **steps}
