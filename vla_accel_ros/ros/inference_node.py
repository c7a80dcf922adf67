"""``vla_inference_node``: the policy as a ROS 2 node, for a GPU host that serves robots.

For each robot (``robots``: their namespaces), it subscribes to the observations that robot's
control node publishes in ``inference_mode: remote`` and answers each with its actions, in the
standard messages of ``ros/remote_protocol.py``: observations best effort, depth 1; actions
reliable, depth 1. Every robot has its own :class:`~vla_accel_ros.runtime.runner.PolicyRunner`
(its Kalman filter, token history and sampling noise) over one shared policy, and a daemon thread
decodes the newest complete observation of every robot that has one together, in rounds: one
batched prefill (which also verifies the proposals of the decoders that verify inside it) per
round (:class:`~vla_accel_ros.runtime.fleet.FleetRunner`). The subscriptions only store.

The policy runs where parameter ``device`` says (``cuda`` or ``cuda:N`` on the GPU host; empty: the
CPU); a family that does not run there, or a GPU this process's torch does not see, is refused
before the node starts, in one line.

``/diagnostics`` and ``~/stats`` report, per robot, the observations answered and the decode
latency.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from vla_accel_ros.core.actions import EE_DELTA
from vla_accel_ros.core.convert import compressed_to_rgb, image_to_rgb
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.core.robot_record import check_checkpoint_robot
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.models.load import resolve_checkpoint
from vla_accel_ros.ros import remote_protocol
from vla_accel_ros.ros.parameters import InferenceNodeConfig
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS, declare_config, run_node
from vla_accel_ros.runtime.builder import build_runner
from vla_accel_ros.runtime.fleet import FleetRunner
from vla_accel_ros.runtime.thread_worker import StepReport, percentile

NODE_NAME = "vla_inference_node"
OBSERVATION_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST)
ACTION_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)


@dataclass
class Robot:
    """One served robot: its runner, the newest half-received observation and counters."""

    name: str
    runner: Any
    publisher: Any
    image: Image | CompressedImage | None = None
    state: JointState | None = None
    instruction: str = ""
    answered: int = 0
    errors: int = 0
    last_error: str = ""
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1000))

    def complete(self) -> tuple[Image | CompressedImage, JointState] | None:
        """The image and state of one observation (equal stamps), once the task is known."""
        if self.image is None or self.state is None or not self.instruction:
            return None
        if remote_protocol.stamp_key(self.image.header.stamp) != remote_protocol.stamp_key(self.state.header.stamp):
            return None
        return self.image, self.state


class VlaInferenceNode(Node):
    """See the module docstring. Raises ConfigError (a ValueError) naming a bad parameter, URDF,
    checkpoint or a robot the checkpoint was not made for."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.cfg: InferenceNodeConfig = declare_config(self, InferenceNodeConfig)
        cfg = self.cfg
        try:
            self.kin = ArmKinematics(cfg.urdf_file or default_urdf(), tcp_frame=cfg.tcp_frame)
        except ValueError as err:
            raise ConfigError(f"bad URDF {cfg.urdf_file or default_urdf()}: {err}") from err
        runner_config = cfg.runner_config()
        self.robot_warning = check_checkpoint_robot(runner_config.checkpoint_path, self.kin.joint_names,
                                                    self.kin.tcp_frame, action_dt_s=cfg.action_dt_s,
                                                    allow_unmatched=cfg.allow_unmatched_robot)
        if self.robot_warning:
            self.get_logger().warn(self.robot_warning)
        # its family runs on the device, and for CUDA this torch sees it: refused here, before any load
        resolved = resolve_checkpoint(runner_config.checkpoint_ref, unnorm_key=runner_config.unnorm_key,
                                      device=runner_config.device)
        runner_config = replace(runner_config, resolved=resolved)  # every robot's runner loads it as resolved here
        space = resolved.action_space
        if space != EE_DELTA:
            raise ConfigError(f"checkpoint '{runner_config.checkpoint_source}' acts in {space}; remote inference "
                              f"carries end-effector deltas ({EE_DELTA}): run it in the node (inference_mode "
                              "thread or process)")
        names = list(cfg.robots) or [""]
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.robots: list[Robot] = []
        policy = None
        try:
            for name in names:
                runner = build_runner(runner_config, self.kin, policy=policy)
                policy = runner.policy
                self.robots.append(self._serve_robot(name, runner))
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(f"cannot load policy checkpoint '{runner_config.checkpoint_source}' with decoder "
                              f"'{cfg.policy.decoder}': {err}") from err
        self.fleet = FleetRunner([r.runner for r in self.robots])
        self.image_size = self.robots[0].runner.image_size
        self._pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._pub_stats = self.create_publisher(String, "~/stats", 10)
        self.create_timer(1.0 / cfg.stats_rate_hz, self._publish_stats)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._decode_loop, name="vla_inference_decoder", daemon=True)
        self._thread.start()
        served = ", ".join(self._topic(r.name, remote_protocol.ACTION_TOPIC) for r in self.robots)
        self.get_logger().info(f"ready: {len(self.robots)} robot(s), decoder {cfg.policy.decoder}, on "
                               f"{runner_config.device or 'cpu'}, image {self.image_size}px; answering on {served}")

    def _topic(self, robot: str, topic: str) -> str:
        return self.resolve_topic_name(f"/{robot.strip('/')}/{topic}" if robot.strip("/") else topic)

    def _serve_robot(self, name: str, runner: Any) -> Robot:
        robot = Robot(name, runner, self.create_publisher(JointTrajectory,
                                                          self._topic(name, remote_protocol.ACTION_TOPIC), ACTION_QOS))

        def on_image(msg: Image | CompressedImage) -> None:
            with self._lock:
                robot.image = msg
            self._wake.set()

        def on_state(msg: JointState) -> None:
            with self._lock:
                robot.state = msg
            self._wake.set()

        def on_instruction(msg: String) -> None:
            with self._lock:
                robot.instruction = msg.data

        self.create_subscription(Image, self._topic(name, remote_protocol.IMAGE_TOPIC), on_image, OBSERVATION_QOS)
        self.create_subscription(CompressedImage, self._topic(name, remote_protocol.COMPRESSED_IMAGE_TOPIC), on_image,
                                 OBSERVATION_QOS)
        self.create_subscription(JointState, self._topic(name, remote_protocol.STATE_TOPIC), on_state,
                                 OBSERVATION_QOS)
        self.create_subscription(String, self._topic(name, remote_protocol.INSTRUCTION_TOPIC), on_instruction,
                                 LATCHED_QOS)
        return robot

    # --- decoding (own thread) ------------------------------------------------------------------
    def _decode_loop(self) -> None:
        import torch

        torch.set_num_threads(self.cfg.torch_threads)
        while not self._stop.is_set():
            self._wake.wait(0.05)
            self._wake.clear()
            self._round()

    def _round(self) -> None:
        """Every robot with a complete observation, decoded together."""
        t0 = time.perf_counter()
        ready: list[tuple[int, Robot, JointState, Any]] = []
        with self._lock:
            pending = []
            for index, robot in enumerate(self.robots):
                pair = robot.complete()
                if pair is not None:
                    robot.image = robot.state = None  # each observation is answered once
                    pending.append((index, robot, pair, robot.instruction))
        for index, robot, (image, state), instruction in pending:
            try:
                to_rgb = compressed_to_rgb if isinstance(image, CompressedImage) else image_to_rgb
                rgb = to_rgb(image, robot.runner.image_size)
                ready.append((index, robot, state, remote_protocol.observation_from(rgb, state, instruction,
                                                                                     self.kin.joint_names)))
            except ValueError as err:  # a bad observation: that robot falls back, the others go on
                self._failed(robot, err)
        if not ready:
            return
        try:
            results = self.fleet.step([(index, obs) for index, _, _, obs in ready])
        except Exception as err:  # a failing decoder: the robots fall back, the node keeps serving
            for _, robot, _, _ in ready:
                self._failed(robot, err)
            return
        decode_ms = (time.perf_counter() - t0) * 1e3
        for (_, robot, state, _), result in zip(ready, results):
            report = StepReport.of(result)
            stats = {"target_passes": report.target_passes, "accepted_len": report.accepted_len,
                     "drafted": report.drafted, "decode_ms": decode_ms}
            robot.publisher.publish(remote_protocol.action_message(report.actions, state.header.stamp, stats,
                                                                   self.cfg.action_dt_s))
            robot.answered += 1
            robot.latency_ms.append(decode_ms)

    @staticmethod
    def _failed(robot: Robot, err: Exception) -> None:
        robot.errors += 1
        robot.last_error = f"{type(err).__name__}: {err}"

    # --- reporting --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        robots = {}
        for r in self.robots:
            lat = np.asarray(r.latency_ms, dtype=float)
            robots[r.name or "/"] = {"answered": r.answered, "errors": r.errors, "last_error": r.last_error,
                                     "decode_ms_p50": percentile(lat, 50), "decode_ms_p99": percentile(lat, 99)}
        return {"decoder": self.cfg.policy.decoder, "robot_warning": self.robot_warning, "robots": robots}

    def _publish_stats(self) -> None:
        stats = self.stats()
        self._pub_stats.publish(String(data=json.dumps(stats)))
        status = DiagnosticStatus(name=f"{self.get_fully_qualified_name()}: inference", hardware_id="vla_accel_ros")
        failing = [name for name, s in stats["robots"].items() if s["errors"] and not s["answered"]]
        if failing:
            status.level, status.message = DiagnosticStatus.ERROR, f"no answer for {failing}: " + "; ".join(
                stats["robots"][n]["last_error"] for n in failing)
        elif self.robot_warning:
            status.level, status.message = DiagnosticStatus.WARN, self.robot_warning
        else:
            status.level, status.message = DiagnosticStatus.OK, f"serving {len(self.robots)} robot(s)"
        status.values = [KeyValue(key=f"{name}.{k}", value=str(v)) for name, s in stats["robots"].items()
                         for k, v in s.items()]
        self._pub_diag.publish(DiagnosticArray(status=[status]))

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5.0)


def main(args: list[str] | None = None) -> int:
    return run_node(NODE_NAME, VlaInferenceNode, lambda node: SingleThreadedExecutor(), args)


if __name__ == "__main__":
    sys.exit(main())
