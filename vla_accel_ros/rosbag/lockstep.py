"""The deterministic lock-step core of record and replay: the controller and the runner driven message by
message on the bag's clock, with no DDS and no threads, so the same bag gives the same commands.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from vla_accel_ros.core.errors import RunFailed
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.rosbag.io import TOPICS, BagWriter, float_seconds, make_float_array


class ReplayTimeout(RunFailed):
    """The replay ran past ``--timeout-s``."""


def frozen_clock() -> float:
    """The decoders' clock in deterministic runs: time does not pass, so no deadline is ever hit."""
    return 0.0


def make_deterministic() -> None:
    """One torch thread and deterministic kernels (bit-identical results run to run)."""
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)


@dataclass
class Command:
    """One produced or recorded command: arm positions in URDF order and finger positions."""

    t_ns: int
    q: np.ndarray
    fingers: np.ndarray = field(default_factory=lambda: np.zeros(0))
    source: str = ""


def arm_urdf(cfg: NodeConfig, bag_urdf: str | None = None) -> tuple[str, str]:
    """(URDF path or XML, where it comes from) in the node's order: the ``robot_description``
    parameter, ``urdf_file``, the bag's /robot_description (the topic), the package's URDF."""
    from vla_accel_ros.core.resources import default_urdf

    if cfg.robot_description.strip():
        return cfg.robot_description, "parameter robot_description"
    if cfg.urdf_file:
        return cfg.urdf_file, f"urdf_file {cfg.urdf_file}"
    if bag_urdf:
        return bag_urdf, f"the bag's {TOPICS['robot_description'][0]}"
    path = str(default_urdf())
    return path, f"the package's {path}"


class LockstepCore:
    """The node's decision path without ROS: converters -> Controller -> PolicyRunner -> tick.

    ``feed(role, msg, stamp_ns)`` takes deserialised messages (``rosbags`` or rclpy objects with the
    same fields); a camera frame returns that step's :class:`~vla_accel_ros.core.controller.TickResult`.
    The recorder and the replay both go through ``feed``, so a deterministic recording is
    reproduced bit for bit.
    """

    def __init__(self, cfg: NodeConfig, urdf: str | None = None) -> None:
        """``urdf``: the URDF XML (a bag's /robot_description) when ``cfg`` names none. Before the
        policy loads, the arm is checked against the robot the checkpoint was made for, as the node
        does (:func:`~vla_accel_ros.core.robot_record.check_robot`): RobotMismatch for another DOF,
        and for another arm of the same DOF unless ``cfg.allow_unmatched_robot`` (then the warning
        is ``robot_warning``)."""
        from vla_accel_ros.core.convert import controller_joint_order
        from vla_accel_ros.core.kinematics import ArmKinematics
        from vla_accel_ros.core.robot_record import check_checkpoint_robot
        from vla_accel_ros.models.load import resolve_checkpoint
        from vla_accel_ros.runtime.builder import build_controller, build_runner

        self.cfg = cfg
        source, label = arm_urdf(cfg, urdf)
        try:
            self.kin = ArmKinematics(source, tcp_frame=cfg.tcp_frame)
        except ValueError as err:
            raise ValueError(f"bad URDF ({label}): {err}") from err
        self.urdf_source = label
        self.controller_joints = controller_joint_order(self.kin, cfg.controller_joints)
        runner_config = replace(cfg.runner_config(), torch_threads=1)  # one thread: bit-identical runs
        checkpoint = runner_config.checkpoint_path
        self.robot_warning = check_checkpoint_robot(checkpoint, self.kin.joint_names, self.kin.tcp_frame,
                                                    action_dt_s=cfg.action_dt_s, image_size=cfg.image_size,
                                                    allow_unmatched=cfg.allow_unmatched_robot)
        try:
            resolved = resolve_checkpoint(runner_config.checkpoint_ref, unnorm_key=runner_config.unnorm_key,
                                          device=runner_config.device)
            self.controller = build_controller(replace(cfg.controller_config(), action_space=resolved.action_space),
                                               self.kin, enabled=True, instruction=cfg.instruction)
            self.runner = build_runner(replace(runner_config, resolved=resolved), self.kin, clock=frozen_clock)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"cannot load policy checkpoint '{checkpoint}' with decoder '{cfg.policy.decoder}': "
                             f"{err}") from err
        self.image_size = cfg.image_size or self.runner.image_size
        self.checkpoint = checkpoint
        self.errors: Counter[str] = Counter()
        self.frames = 0
        self.inferences = 0
        self._seq = 0

    def _error(self, message: str) -> None:
        self.errors[message] += 1

    def feed(self, role: str, msg: Any, stamp_ns: int) -> Any:
        """Apply one message; returns the tick's TickResult for a camera frame, else None."""
        from vla_accel_ros.core.convert import joint_state_to_arm

        t = float_seconds(stamp_ns)
        if role == "joint_states":
            try:
                q, gripper = joint_state_to_arm(self.kin, msg.name, msg.position)
            except ValueError as err:
                self._error(f"joint state rejected: {err}")
                return None
            if (error := self.controller.on_joint_state(q, gripper, t)) is not None:
                self._error(error)
        elif role == "instruction":
            if (error := self.controller.set_instruction(str(msg.data))) is not None:
                self._error(error)
        elif role == "wrist_camera":  # the second image slot: stored, the scene camera's frame ticks
            rgb = self._rgb(msg)
            if rgb is not None and (error := self.controller.on_image(rgb, t, camera=1, stamp=t)) is not None:
                self._error(error)
        elif role == "camera":
            self.frames += 1
            rgb = self._rgb(msg)
            if rgb is not None:
                if (error := self.controller.on_image(rgb, t, stamp=t)) is not None:
                    self._error(error)  # a rejection, or the notice of a clock reset (image kept)
                self._infer(t)  # as the node's worker: whenever the controller has a new observation
            return self.controller.tick(t)
        return None

    def _rgb(self, msg: Any) -> np.ndarray | None:
        """A camera message as RGB at the model's size; None (the error counted) when it is refused."""
        from vla_accel_ros.core.convert import compressed_to_rgb, image_to_rgb

        try:
            compressed = hasattr(msg, "format") and not hasattr(msg, "encoding")
            return compressed_to_rgb(msg, self.image_size) if compressed else image_to_rgb(msg, self.image_size)
        except ValueError as err:
            self._error(f"image rejected: {err}")
            return None

    def _infer(self, t: float) -> None:
        got = self.controller.wait_observation(self._seq, timeout=0.0)
        if got is None:  # no joint state or instruction yet: the tick holds
            return
        self._seq, obs = got
        try:
            result = self.runner(obs)
        except Exception as err:  # the node's worker survives this too; the tick falls back
            self._error(f"inference failed: {type(err).__name__}: {err}")
            return
        self.inferences += 1
        actions = result.action[None] if result.chunk is None else result.chunk  # a chunked policy's whole chunk
        message = self.controller.on_action_chunk(np.asarray(actions, dtype=float), obs.stamp, t,
                                                  instruction=obs.instruction)
        if message:
            self._error(message)

    def command(self, result: Any, t_ns: int) -> Command | None:
        if result is None or result.q_command is None:
            return None
        return Command(t_ns, np.asarray(result.q_command, dtype=float).copy(),
                       np.asarray(result.finger_positions, dtype=float).copy(), result.source)

    def write_command(self, writer: BagWriter, cmd: Command) -> None:
        """The node's forward_position output: arm in controller-joint order, then the fingers."""
        positions = self.kin.to_named(cmd.q, self.controller_joints)
        writer.write(TOPICS["commands"][0], cmd.t_ns, make_float_array(positions))
        if cmd.fingers.size:
            writer.write(TOPICS["gripper"][0], cmd.t_ns, make_float_array(cmd.fingers))

    def stats_json(self) -> str:
        stats = dict(self.controller.stats.__dict__, frames=self.frames, inferences=self.inferences,
                     input_errors=int(sum(self.errors.values())))
        return json.dumps(stats)
