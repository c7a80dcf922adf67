"""The soak of ``vla-accel soak``: does the node's memory stay flat over a long run?

Starts the node as ``ros2 run`` would (``python -m vla_accel_ros.ros.node``: its own process, the
policy in the inference child, the camera in the intake child) at ``rate_hz`` with the shipped
policy or ``checkpoint`` (a chunked one executed as ``chunk_execution`` says), plays the robot
(joint states at 100 Hz that follow the commands, a camera at 20 Hz whose frame changes), and
samples each process's resident set size every ``sample_s`` seconds. The summary gives, for the
node and each child, the RSS at the start and at the end and the slope (least squares, MB/min) of
the samples after the warm-up, plus the ticks, their publication, the commands received and, for a
chunked policy, the chunks planned and the ticks that waited for one. Imports rclpy only when it
runs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.chunks import ChunkSettings
from vla_accel_ros.core.errors import RunFailed
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.decoding.specs import DEFAULT
from vla_accel_ros.models.load import check_checkpoint

PROCESSES = ("node", "inference", "camera")
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SoakOptions:
    minutes: float = 30.0
    rate_hz: float = 50.0
    warmup_min: float = 5.0
    sample_s: float = 10.0
    decoder: str = DEFAULT
    checkpoint: str = ""  # empty: the shipped policy
    chunk_execution: str = ChunkSettings().chunk_execution  # the node's, for a chunked policy
    domain_id: int = 97
    image_size: int = 128


def rss_mb(pid: int) -> float:
    """Resident set size (MiB) of a live process; NaN when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def slope_mb_per_min(times_s: np.ndarray, rss: np.ndarray) -> float:
    """Least-squares slope of ``rss`` (MiB) over ``times_s`` (s), in MiB per minute."""
    keep = np.isfinite(rss)
    if keep.sum() < 3:
        return float("nan")
    return float(np.polyfit(times_s[keep] / 60.0, rss[keep], 1)[0])


class Robot:
    """The robot the node drives: joint states that follow the commands, and a camera."""

    def __init__(self, domain_id: int, image_size: int) -> None:
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float64MultiArray, String

        from vla_accel_ros.core.kinematics import ArmKinematics
        from vla_accel_ros.core.resources import default_urdf
        from vla_accel_ros.ros.rclpy_util import BackgroundNode

        self._joint_state = JointState
        self.kin = ArmKinematics(default_urdf())
        self.q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
        self.target = self.q.copy()
        self.ros = BackgroundNode("soak_robot", domain_id)
        node = self.ros.node
        self.joints = node.create_publisher(JointState, "/joint_states", qos_profile_sensor_data)
        self.camera = node.create_publisher(Image, "/camera/image_raw", qos_profile_sensor_data)
        self.image = Image(height=image_size, width=image_size, encoding="rgb8", step=3 * image_size)
        self.size = image_size
        self.commands = 0
        self.stats: dict[str, Any] = {}
        self._lock = threading.Lock()
        node.create_subscription(Float64MultiArray, "/arm_controller/commands", self._on_command, 10)
        node.create_subscription(String, "/vla_accel_node/stats", self._on_stats, 10)
        self.ros.spin(0.05)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_command(self, msg: Any) -> None:
        with self._lock:
            self.target = np.asarray(msg.data, dtype=float)
            self.commands += 1

    def _on_stats(self, msg: Any) -> None:
        self.stats = json.loads(msg.data)

    def _frame(self, t: float) -> bytes:
        """A grey scene with a square that moves: the policy sees a new image every frame."""
        frame = np.full((self.size, self.size, 3), 110, np.uint8)
        side = self.size // 4
        x = int((np.sin(t) * 0.5 + 0.5) * (self.size - side))
        frame[side:2 * side, x:x + side] = (200, 40, 40)
        return frame.tobytes()

    def _run(self) -> None:
        names = list(self.kin.joint_names) + list(self.kin.gripper_joint_names)
        start, k = time.monotonic(), 0
        while not self.stop.is_set():
            now = self.ros.node.get_clock().now()
            with self._lock:
                self.q += 0.3 * (self.target - self.q)  # a servo following the commands
                q = self.q.tolist()
            msg = self._joint_state(name=names, position=q + [0.04] * len(self.kin.gripper_joint_names))
            msg.header.stamp = now.to_msg()
            self.joints.publish(msg)
            if k % 5 == 0:
                self.image.header.stamp = now.to_msg()
                self.image.data = self._frame(time.monotonic() - start)
                self.camera.publish(self.image)
            k += 1
            self.stop.wait(max(0.0, start + k * 0.01 - time.monotonic()))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2.0)
        self.ros.close()


def node_parameters(opts: SoakOptions) -> dict[str, Any]:
    """The node's parameters for the soak ``opts`` describes."""
    return {"autostart": True, "control_rate_hz": opts.rate_hz, "instruction": "pick up the red cube",
            "decoder": opts.decoder, "checkpoint": opts.checkpoint, "chunk_execution": opts.chunk_execution,
            "robot_description_timeout_s": 0.0, "stats_rate_hz": 1.0}


def run_soak(opts: SoakOptions, out: Path, on_sample: Callable[[dict[str, Any]], None] = lambda s: None,
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the soak; its summary and samples. ``on_sample`` sees each sample as it is taken; the
    node's log goes to ``out/node.log``. RunFailed (ConfigError when it refused to start) when the node
    ends or never reports its children."""
    from vla_accel_ros.ros.processes import NodeProcess, parameter_arguments

    check_checkpoint(opts.checkpoint or default_checkpoint())  # a bad one is one line, not a refusing node

    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ROS_DOMAIN_ID=str(opts.domain_id))
    node = NodeProcess.start("vla_accel_ros.ros.node", ["--ros-args", *parameter_arguments(node_parameters(opts))],
                             out / "node.log", env)
    robot = Robot(opts.domain_id, opts.image_size)
    samples: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not robot.stats.get("inference_pid") or not robot.stats.get("camera_pid"):
            if node.returncode is not None:
                raise node.exit_error("at start-up")
            if time.monotonic() > deadline:
                raise RunFailed(f"the node did not report its children within {START_TIMEOUT_S:.0f} s "
                                   f"(see {node.log})")
            time.sleep(0.5)
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < opts.minutes * 60.0:
            if node.returncode is not None:
                raise node.exit_error("during the soak")
            stats = robot.stats
            pids = {"node": node.process.pid, "inference": int(stats.get("inference_pid", 0)),
                    "camera": int(stats.get("camera_pid", 0))}
            sample = {"t_s": elapsed, **{f"{p}_rss_mb": rss_mb(pid) for p, pid in pids.items()},
                      **{f"{p}_pid": pid for p, pid in pids.items()},
                      "ticks": stats.get("ticks", 0), "ticks_published": stats.get("ticks_published", 0),
                      "commands_received": robot.commands, "policy_ticks": stats.get("policy_ticks", 0)}
            samples.append(sample)
            on_sample(sample)
            time.sleep(opts.sample_s)
        final = dict(robot.stats)
    finally:
        node.stop()
        robot.close()
    return summarize(samples, final, opts), samples


def summarize(samples: list[dict[str, Any]], final: dict[str, Any], opts: SoakOptions) -> dict[str, Any]:
    t = np.array([s["t_s"] for s in samples])
    after = t >= opts.warmup_min * 60.0
    summary: dict[str, Any] = {**asdict(opts), "samples": len(samples)}
    for p in PROCESSES:
        rss = np.array([s[f"{p}_rss_mb"] for s in samples])
        summary[p] = {"rss_start_mb": float(rss[0]), "rss_end_mb": float(rss[-1]),
                      "rss_after_warmup_mb": float(rss[after][0]) if after.any() else float("nan"),
                      "slope_mb_per_min": slope_mb_per_min(t[after], rss[after]),
                      "restarted": len({s[f"{p}_pid"] for s in samples}) > 1}
    # over the samples: the ticks of the soak, not of the start-up before it
    first, last = samples[0], samples[-1]
    for key in ("ticks", "ticks_published", "policy_ticks", "commands_received"):
        summary[key] = last[key] - first[key]
    summary["ticks_expected"] = int(round((last["t_s"] - first["t_s"]) * opts.rate_hz))
    for key, default in (("stalls", 0), ("longest_tick_gap_s", 0.0), ("jitter_ms_p99", 0.0),
                         ("inference_actions", 0), ("chunks_planned", 0), ("chunk_wait_ticks", 0)):
        summary[key] = final.get(key, default)
    return summary
