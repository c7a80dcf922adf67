"""``vla-accel replay``: feed a rosbag2 into the node and compare its commands with the recorded ones.

Two modes:

- ``deterministic`` (default) drives the node's own ROS-free core, :class:`LockstepCore` (the
  node's message converters, ``Controller`` and ``PolicyRunner`` built from the same
  ``NodeConfig``), synchronously in this process, in bag order. Joint states and the instruction
  update the controller; each camera frame gives exactly one inference on that observation, then
  one tick at the frame's own stamp, whose command is recorded. Messages sharing a log time are
  taken in a fixed order (description, clock, instruction, joint states, camera) whatever order
  the storage returns them in. torch runs on one thread with deterministic algorithms, and the
  decoders see a frozen clock, so a deadline-aware decoder decides the same way on any machine:
  two replays of one bag give bit-identical commands. This path was chosen over a lock-stepped
  rclpy graph because DDS delivery, executor scheduling and wall-clock timers are exactly what a
  regression test must not depend on; everything the policy and the safety logic compute is
  still the node's code.
- ``realtime`` plays the bag onto DDS at its own pace (``--rate``), publishing ``/clock`` from the
  bag (or from the log times when it has none), with the real node in a subprocess under
  ``use_sim_time``, and records the commands the node publishes, stamped with the bag time they
  arrived at. Timing-dependent by nature; the diff says how far it drifts.

Both write the produced commands (``/<controller>/commands`` and the gripper's) into ``--out``,
match them with the commands recorded in the input bag by stamp (nearest within half a control
period), and report per-joint max/mean absolute differences, the first divergent step, input
errors and a one-line verdict (``--summary DIR`` also writes ``DIR/summary.json``). A missing,
truncated or corrupt bag, or one lacking a required topic, exits non-zero with a message naming
the problem; every wait has a timeout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.bag import (STORAGES, TOPICS, BagError, BagMessage, BagReader, BagWriter, float_seconds,
                               make_float_array, make_string, open_bag, parse_remaps)
from vla_accel_ros.config import NodeConfig
from vla_accel_ros.sampling import SamplingConfig

MODES = ("deterministic", "realtime")
DEFAULT_TOLERANCE = 1e-6  # rad
# Within one log time: the URDF first, then time, the task, the arm, and last the frame that
# triggers inference (so the frame sees the joint state stamped with it).
PRIORITY = {"robot_description": 0, "clock": 1, "instruction": 2, "joint_states": 3, "camera": 4}
READY_TIMEOUT_S = 90.0


class ReplayTimeout(RuntimeError):
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


class LockstepCore:
    """The node's decision path without ROS: converters -> Controller -> PolicyRunner -> tick.

    ``feed(role, msg, stamp_ns)`` takes deserialised messages (``rosbags`` or rclpy objects with the
    same fields); a camera frame returns that step's :class:`~vla_accel_ros.controller.TickResult`.
    The recorder and the replay both go through ``feed``, so a deterministic recording is
    reproduced bit for bit.
    """

    def __init__(self, cfg: NodeConfig, urdf: str | None = None) -> None:
        from vla_accel_ros.controller import Controller
        from vla_accel_ros.inference import PolicyRunner
        from vla_accel_ros.kinematics import ArmKinematics
        from vla_accel_ros.resources import default_checkpoint, default_urdf

        self.cfg = cfg
        source = urdf if urdf else (cfg.urdf_file or str(default_urdf()))
        try:
            self.kin = ArmKinematics(source, tcp_frame=cfg.tcp_frame)
        except ValueError as err:
            raise ValueError(f"bad URDF ({'from the bag' if urdf else source}): {err}") from err
        self.controller_joints = tuple(cfg.controller_joints) or self.kin.joint_names
        self.controller = Controller(self.kin, cfg.controller_config())
        self.controller.set_enabled(True)
        if cfg.instruction.strip():
            self.controller.set_instruction(cfg.instruction)
        checkpoint = Path(cfg.checkpoint) if cfg.checkpoint else default_checkpoint()
        try:
            self.runner = PolicyRunner.load(checkpoint, cfg.decoder, self.kin, action_dt_s=cfg.action_dt_s,
                                            period_s=cfg.period_s, clock=frozen_clock, vision=cfg.vision_config(),
                                            sampling=SamplingConfig(cfg.temperature))
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"cannot load policy checkpoint '{checkpoint}' with decoder '{cfg.decoder}': {err}") from err
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
        from vla_accel_ros.node import compressed_to_rgb, image_to_rgb, joint_state_to_arm

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
        elif role == "camera":
            self.frames += 1
            try:
                compressed = hasattr(msg, "format") and not hasattr(msg, "encoding")
                rgb = compressed_to_rgb(msg, self.image_size) if compressed else image_to_rgb(msg, self.image_size)
            except ValueError as err:
                self._error(f"image rejected: {err}")
                rgb = None
            if rgb is not None:
                if (error := self.controller.on_image(rgb, t)) is not None:
                    self._error(error)  # a rejection, or the notice of a clock reset (image kept)
                self._infer(t)  # as the node's worker: whenever the controller has a new observation
            return self.controller.tick(t)
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
        message = self.controller.on_action(np.asarray(result.action, dtype=float), obs.stamp, t,
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


def grouped(messages: Iterable[BagMessage], roles: dict[str, str]) -> Iterator[tuple[str, BagMessage]]:
    """(role, message) in log-time order; messages sharing a log time in ``PRIORITY`` order."""
    batch: list[tuple[int, int, str, BagMessage]] = []
    for i, m in enumerate(messages):
        if batch and m.log_ns != batch[0][3].log_ns:
            yield from ((role, msg) for _, _, role, msg in sorted(batch, key=lambda x: (x[0], x[1])))
            batch = []
        role = roles.get(m.topic, "other")
        batch.append((PRIORITY.get(role, 9), i, role, m))
    yield from ((role, msg) for _, _, role, msg in sorted(batch, key=lambda x: (x[0], x[1])))


# --- comparing commands ----------------------------------------------------------------------
def parse_command(kin: Any, controller_joints: tuple[str, ...], msgtype: str, msg: Any) -> np.ndarray | None:
    """Arm positions (URDF order) of a recorded command message in any of the node's formats."""
    try:
        if msgtype.endswith("Float64MultiArray"):
            data = np.asarray(msg.data, dtype=float)
            return kin.from_named(controller_joints, data) if data.size == len(controller_joints) else None
        if msgtype.endswith("JointTrajectory"):
            return kin.from_named(msg.joint_names, np.asarray(msg.points[-1].positions, float)) if msg.points else None
        if msgtype.endswith("JointState"):
            names = list(msg.name)
            arm = [(n, p) for n, p in zip(names, msg.position) if n in kin.joint_names]
            return kin.from_named([n for n, _ in arm], [p for _, p in arm])
    except ValueError:
        return None
    return None


def compare(produced: list[Command], recorded: list[Command], joint_names: tuple[str, ...], period_s: float,
            tolerance: float) -> dict[str, Any]:
    """Match each produced command with the recorded one nearest in time (within half a period)."""
    out: dict[str, Any] = {"recorded_commands": len(recorded), "matched": 0, "max_abs_diff": None,
                           "mean_abs_diff": None, "first_divergent_step": None, "first_divergent_stamp_s": None,
                           "per_joint": {}, "gripper_max_abs_diff": None, "identical": False,
                           "within_tolerance": False, "tolerance": tolerance}
    if not produced or not recorded:
        return out
    rec_t = np.array([c.t_ns for c in recorded], dtype=np.int64)
    half = int(period_s * 0.5e9)
    diffs, finger_diffs = [], []
    for step, cmd in enumerate(produced):
        i = int(np.searchsorted(rec_t, cmd.t_ns))
        near = [j for j in (i - 1, i) if 0 <= j < len(rec_t)]
        j = min(near, key=lambda k: abs(int(rec_t[k]) - cmd.t_ns))
        if abs(int(rec_t[j]) - cmd.t_ns) > half:
            continue
        d = np.abs(cmd.q - recorded[j].q)
        diffs.append(d)
        if cmd.fingers.size and recorded[j].fingers.size == cmd.fingers.size:
            finger_diffs.append(float(np.abs(cmd.fingers - recorded[j].fingers).max()))
        if out["first_divergent_step"] is None and float(d.max()) > tolerance:
            out["first_divergent_step"], out["first_divergent_stamp_s"] = step, float_seconds(cmd.t_ns)
    if not diffs:
        return out
    d = np.array(diffs)
    out.update({
        "matched": len(diffs),
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "per_joint": {name: {"max_abs_diff": float(d[:, k].max()), "mean_abs_diff": float(d[:, k].mean())}
                      for k, name in enumerate(joint_names)},
        "gripper_max_abs_diff": max(finger_diffs) if finger_diffs else None,
    })
    complete = len(diffs) == len(produced) == len(recorded)
    out["identical"] = bool(complete and float(d.max()) == 0.0 and not any(finger_diffs))
    out["within_tolerance"] = bool(complete and float(d.max()) <= tolerance)
    return out


def count_unsafe(kin: Any, commands: list[Command]) -> int:
    """Commands with NaN/inf or outside the URDF position limits (must be 0)."""
    return sum(1 for c in commands if not (np.all(np.isfinite(c.q)) and kin.within_limits(c.q)
                                           and np.all(np.isfinite(c.fingers))))


# --- options -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayOptions:
    bag: str
    out: str = ""
    mode: str = "deterministic"
    remap: tuple[str, ...] = ()
    summary: str = ""
    checkpoint: str = ""
    decoder: str = ""
    control_rate_hz: float = 0.0  # 0 = from the bag's recording settings, else 20
    instruction: str = ""
    storage: str = "mcap"
    tolerance: float = DEFAULT_TOLERANCE
    timeout_s: float = 600.0
    rate: float = 1.0  # realtime playback speed
    domain_id: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got '{self.mode}'")
        if self.storage not in STORAGES:
            raise ValueError(f"--storage must be one of {', '.join(STORAGES)}, got '{self.storage}'")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout-s must be > 0, got {self.timeout_s}")
        if not 0.01 <= self.rate <= 100.0:
            raise ValueError(f"--rate must be in [0.01, 100], got {self.rate}")
        if not self.tolerance >= 0:
            raise ValueError(f"--tolerance must be >= 0, got {self.tolerance}")
        if not 0 <= self.domain_id <= 232:
            raise ValueError(f"--domain-id must be in [0, 232], got {self.domain_id}")
        parse_remaps(self.remap)  # fail early on a malformed remap


def node_config(opts: ReplayOptions, custom: dict[str, Any]) -> NodeConfig:
    """Command line first, then the settings the recording stored, then the node's defaults."""
    values: dict[str, Any] = {"autostart": True}
    for key, cli in (("decoder", opts.decoder), ("checkpoint", opts.checkpoint),
                     ("control_rate_hz", opts.control_rate_hz)):
        value = cli or custom.get(key)
        if value:
            values[key] = float(value) if key == "control_rate_hz" else str(value)
    if opts.instruction:
        values["instruction"] = opts.instruction
    if "temperature" in custom:  # else (an older bag) the node's default
        values["temperature"] = float(custom["temperature"])
    return NodeConfig(**values)


def _roles(bag: BagReader) -> dict[str, str]:
    return {topic: role for role, (topic, _) in TOPICS.items()}


def _robot_description(bag: BagReader) -> str | None:
    topic = TOPICS["robot_description"][0]
    if not bag.count(topic):
        return None
    for m in bag.messages([topic]):
        return str(m.msg.data)
    return None


# --- deterministic ---------------------------------------------------------------------------
def replay_deterministic(opts: ReplayOptions, progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    make_deterministic()
    started = time.monotonic()
    deadline = started + opts.timeout_s
    remap = parse_remaps(opts.remap)
    camera, joints, instruction = (TOPICS[r][0] for r in ("camera", "joint_states", "instruction"))
    with open_bag(opts.bag, required=[camera, joints], remap=remap) as bag:
        cfg = node_config(opts, bag.custom)
        if not bag.count(instruction) and not cfg.instruction:
            raise BagError(f"bag {opts.bag} lacks topic {instruction} and no --instruction was given: "
                           f"the policy has no task")
        core = LockstepCore(cfg, urdf=_robot_description(bag))
        roles = _roles(bag)
        produced: list[Command] = []
        recorded: list[Command] = []
        inputs = [camera, joints, instruction, TOPICS["commands"][0], TOPICS["gripper"][0]]
        total = sum(bag.count(t) for t in inputs)
        writer = BagWriter(opts.out, opts.storage, custom=_out_custom(opts, cfg)) if opts.out else None
        last_fingers: dict[int, np.ndarray] = {}
        try:
            for role, m in tqdm(grouped(bag.messages(inputs), roles), total=total, desc="replay",
                                disable=not progress, unit="msg"):
                if time.monotonic() > deadline:
                    raise ReplayTimeout(f"replay of {opts.bag} ran past --timeout-s {opts.timeout_s:g} s")
                if role == "commands":
                    q = parse_command(core.kin, core.controller_joints, m.msgtype, m.msg)
                    if q is not None:
                        recorded.append(Command(m.log_ns, q))
                    continue
                if role == "gripper":
                    last_fingers[m.log_ns] = np.asarray(m.msg.data, dtype=float)
                    continue
                result = core.feed(role, m.msg, m.stamp_ns)
                cmd = core.command(result, m.stamp_ns)
                if cmd is not None:
                    produced.append(cmd)
                    if writer is not None:
                        core.write_command(writer, cmd)
        finally:
            if writer is not None:
                writer.close()
        for cmd in recorded:
            cmd.fingers = last_fingers.get(cmd.t_ns, np.zeros(0))
    return _summarise(opts, cfg, core.kin, produced, recorded, core.frames, dict(core.errors),
                      time.monotonic() - started, inferences=core.inferences, checkpoint=str(core.checkpoint))


def _out_custom(opts: ReplayOptions, cfg: NodeConfig) -> dict[str, Any]:
    return {"source": "replay", "mode": opts.mode, "input_bag": str(Path(opts.bag).resolve()),
            "decoder": cfg.decoder, "checkpoint": cfg.checkpoint, "control_rate_hz": cfg.control_rate_hz,
            "temperature": cfg.temperature}


def _summarise(opts: ReplayOptions, cfg: NodeConfig, kin: Any, produced: list[Command], recorded: list[Command],
               frames: int, errors: dict[str, int], wall_s: float, **extra: Any) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "bag": str(opts.bag), "out": opts.out, "mode": opts.mode, "frames": frames, "commands": len(produced),
        "sources": dict(Counter(c.source for c in produced if c.source)),
        "unsafe_commands": count_unsafe(kin, produced),
        **compare(produced, recorded, kin.joint_names, cfg.period_s, opts.tolerance),
        "errors": [f"{message} (x{n})" for message, n in errors.items()],
        "decoder": cfg.decoder, "control_rate_hz": cfg.control_rate_hz, "wall_s": wall_s, **extra,
    }
    return summary


def verdict(s: dict[str, Any]) -> str:
    head = f"replay ({s['mode']}): {s['frames']} frames -> {s['commands']} commands"
    if not s["recorded_commands"]:
        tail = "the bag holds no recorded commands to compare with"
    elif not s["matched"]:
        tail = f"none of them matches one of the {s['recorded_commands']} recorded commands in time"
    else:
        word = "IDENTICAL" if s["identical"] else ("MATCH" if s["within_tolerance"] else "DIVERGED")
        tail = (f"{word} vs {s['recorded_commands']} recorded ({s['matched']} matched): max |diff| "
                f"{s['max_abs_diff']:.3g} rad, mean {s['mean_abs_diff']:.3g} rad")
        if s["first_divergent_step"] is not None:
            tail += f", first divergent step {s['first_divergent_step']} (t={s['first_divergent_stamp_s']:.3f} s)"
    errors = f"; {len(s['errors'])} kinds of input error" if s["errors"] else ""
    unsafe = f"; {s['unsafe_commands']} UNSAFE commands" if s["unsafe_commands"] else ""
    return f"{head}; {tail}{errors}{unsafe}"


# --- realtime --------------------------------------------------------------------------------
class _Player:
    """An rclpy node in this process that plays the bag's inputs and collects the node's commands."""

    def __init__(self, domain_id: int, bag: BagReader, kin: Any) -> None:
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float64MultiArray, String

        from vla_accel_ros.ros_util import LATCHED_QOS, BackgroundNode

        self._ros = BackgroundNode("vla_accel_replay", domain_id)
        self.node = self._ros.node
        camera_type = bag.topics.get(TOPICS["camera"][0], ("sensor_msgs/msg/Image", 0))[0]
        self.pubs: dict[str, Any] = {
            "camera": self.node.create_publisher(CompressedImage if camera_type.endswith("CompressedImage") else Image,
                                                 TOPICS["camera"][0], 10),
            "joint_states": self.node.create_publisher(JointState, TOPICS["joint_states"][0], 10),
            "instruction": self.node.create_publisher(String, TOPICS["instruction"][0], LATCHED_QOS),
            "clock": self.node.create_publisher(Clock, TOPICS["clock"][0], 10),
            "robot_description": self.node.create_publisher(String, TOPICS["robot_description"][0], LATCHED_QOS),
        }
        self._Clock = Clock
        self.kin = kin
        self.bag_ns = 0  # bag time of the newest /clock published
        self.commands: list[Command] = []
        self.fingers: list[tuple[int, np.ndarray]] = []
        self._lock = threading.Lock()
        self.node.create_subscription(Float64MultiArray, TOPICS["commands"][0], self._on_command, 100)
        self.node.create_subscription(Float64MultiArray, TOPICS["gripper"][0], self._on_gripper, 100)
        self.stats: dict[str, Any] = {}
        self.node.create_subscription(String, TOPICS["stats"][0], self._on_stats, 10)
        self._ros.spin(timeout_sec=0.05)

    def _on_command(self, msg: Any) -> None:
        if len(msg.data) == self.kin.n:
            with self._lock:
                self.commands.append(Command(self.bag_ns, np.asarray(msg.data, dtype=float)))

    def _on_gripper(self, msg: Any) -> None:
        with self._lock:
            self.fingers.append((self.bag_ns, np.asarray(msg.data, dtype=float)))

    def _on_stats(self, msg: Any) -> None:
        try:
            self.stats = json.loads(msg.data)
        except ValueError:
            pass

    def errors(self) -> dict[str, int]:
        """The node's own account of rejected input and failed inference (from its ~/stats)."""
        s = self.stats
        out = {}
        if s.get("input_errors"):
            out[f"input rejected, last: {s.get('last_input_error', '')}"] = int(s["input_errors"])
        if s.get("inference_errors"):
            out[f"inference failed, last: {s.get('inference_last_error', '')}"] = int(s["inference_errors"])
        return out

    def publish(self, role: str, raw: bytes) -> None:
        self.pubs[role].publish(raw)  # CDR bytes straight from the bag

    def publish_clock(self, t_ns: int) -> None:
        from builtin_interfaces.msg import Time

        self.bag_ns = t_ns
        self.pubs["clock"].publish(self._Clock(clock=Time(sec=t_ns // 1_000_000_000, nanosec=t_ns % 1_000_000_000)))

    def close(self) -> None:
        self._ros.close()


def replay_realtime(opts: ReplayOptions, progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    from vla_accel_ros.kinematics import ArmKinematics
    from vla_accel_ros.resources import default_urdf
    from vla_accel_ros.sim_runner import _ros_args, _stop

    started = time.monotonic()
    deadline = started + opts.timeout_s
    remap = parse_remaps(opts.remap)
    camera, joints, instruction = (TOPICS[r][0] for r in ("camera", "joint_states", "instruction"))
    bag = open_bag(opts.bag, required=[camera, joints], remap=remap)
    node_proc: subprocess.Popen | None = None
    player: _Player | None = None
    log_path = Path(opts.summary or ".") / "replay_node.log"
    try:
        cfg = node_config(opts, bag.custom)
        if not bag.count(instruction) and not cfg.instruction:
            raise BagError(f"bag {opts.bag} lacks topic {instruction} and no --instruction was given")
        urdf = _robot_description(bag)
        kin = ArmKinematics(urdf or str(default_urdf()))
        recorded = [Command(m.log_ns, q) for m in bag.messages([TOPICS["commands"][0]])
                    if (q := parse_command(kin, kin.joint_names, m.msgtype, m.msg)) is not None]
        domain = opts.domain_id or (100 + (os.getpid() + 50) % 100)
        player = _Player(domain, bag, kin)
        if urdf:
            from std_msgs.msg import String

            player.pubs["robot_description"].publish(String(data=urdf))
        params: dict[str, Any] = {"use_sim_time": True, "autostart": True, "decoder": cfg.decoder,
                                  "control_rate_hz": cfg.control_rate_hz,
                                  "robot_description_timeout_s": 10.0 if urdf else 0.0}
        if cfg.checkpoint:
            params["checkpoint"] = str(Path(cfg.checkpoint).resolve())
        if cfg.instruction:
            params["instruction"] = cfg.instruction
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONUNBUFFERED="1")
        with open(log_path, "w") as log:
            node_proc = subprocess.Popen([sys.executable, "-m", "vla_accel_ros.node", *_ros_args(params)], env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        ready_by = time.monotonic() + min(READY_TIMEOUT_S, opts.timeout_s)
        while player.pubs["camera"].get_subscription_count() == 0 or player.pubs["joint_states"].get_subscription_count() == 0:
            if node_proc.poll() is not None:
                raise RuntimeError(f"the node exited with code {node_proc.returncode} before playback; see {log_path}")
            if time.monotonic() > ready_by:
                raise ReplayTimeout(f"the node did not subscribe within {READY_TIMEOUT_S:g} s; see {log_path}")
            time.sleep(0.05)
        time.sleep(0.3)  # let the node's other subscriptions match too
        has_clock = bag.count(TOPICS["clock"][0]) > 0
        roles = _roles(bag)
        inputs = [camera, joints, instruction] + ([TOPICS["clock"][0]] if has_clock else [])
        total = sum(bag.count(t) for t in inputs)
        frames = 0
        wall0, bag0 = time.monotonic(), None
        for role, m in tqdm(grouped(bag.messages(inputs, raw=True), roles), total=total, desc="replay", unit="msg",
                            disable=not progress):
            if time.monotonic() > deadline:
                raise ReplayTimeout(f"replay of {opts.bag} ran past --timeout-s {opts.timeout_s:g} s")
            if node_proc.poll() is not None:
                raise RuntimeError(f"the node exited with code {node_proc.returncode} during playback; see {log_path}")
            bag0 = m.log_ns if bag0 is None else bag0
            delay = wall0 + (m.log_ns - bag0) * 1e-9 / opts.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if role == "clock":
                player.publish_clock(m.log_ns)
                continue
            if not has_clock and m.log_ns > player.bag_ns:
                player.publish_clock(m.log_ns)
            player.publish(role, m.msg)
            frames += role == "camera"
        time.sleep(3.0 * cfg.period_s / opts.rate)  # the last frame's command
    finally:
        if node_proc is not None:
            _stop(node_proc)
        if player is not None:
            player.close()
        bag.close()
    produced = list(player.commands)
    finger_at = dict(player.fingers)
    for cmd in produced:
        cmd.fingers = finger_at.get(cmd.t_ns, np.zeros(0))
    if opts.out:
        with BagWriter(opts.out, opts.storage, custom=_out_custom(opts, cfg)) as writer:
            for cmd in produced:
                writer.write(TOPICS["commands"][0], cmd.t_ns, make_float_array(cmd.q))
                if cmd.fingers.size:
                    writer.write(TOPICS["gripper"][0], cmd.t_ns, make_float_array(cmd.fingers))
            writer.write(TOPICS["stats"][0], player.bag_ns or 1, make_string(json.dumps({"commands": len(produced)})))
    return _summarise(opts, cfg, kin, produced, recorded, frames, player.errors(), time.monotonic() - started,
                      node_log=str(log_path))


# --- command line ----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", help="input rosbag2 directory (mcap or sqlite3)")
    parser.add_argument("--out", default="", help="write the produced commands into this new bag")
    parser.add_argument("--mode", default="deterministic", choices=MODES,
                        help="deterministic: the node's core in lock-step in bag order; realtime: the node "
                             "process over DDS following the bag's clock")
    parser.add_argument("--remap", nargs="*", default=[], metavar="FROM:=TO", help="rename bag topics on input")
    parser.add_argument("--summary", default="", metavar="DIR", help="write DIR/summary.json")
    parser.add_argument("--checkpoint", default="", help="policy checkpoint (default: the recording's, "
                        "else the package's)")
    parser.add_argument("--decoder", default="", help="decoder (default: the recording's, else kerv)")
    parser.add_argument("--control-rate", type=float, default=0.0, help="control rate in Hz (default: the "
                        "recording's, else 20)")
    parser.add_argument("--instruction", default="", help="task instruction when the bag has none")
    parser.add_argument("--storage", default="mcap", choices=STORAGES, help="storage of --out")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="max |diff| (rad) that still counts as reproduced")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the commands reproduce the "
                        "recorded ones within --tolerance")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long")
    parser.add_argument("--rate", type=float, default=1.0, help="realtime playback speed factor")
    parser.add_argument("--domain-id", type=int, default=0, help="ROS_DOMAIN_ID for realtime (0 = private)")


def replay(opts: ReplayOptions, progress: bool = True) -> dict[str, Any]:
    summary = (replay_deterministic if opts.mode == "deterministic" else replay_realtime)(opts, progress)
    if opts.summary:
        out = Path(opts.summary)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n")
    return summary


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def run(args: argparse.Namespace) -> int:
    try:
        opts = ReplayOptions(bag=args.bag, out=args.out, mode=args.mode, remap=tuple(args.remap),
                             summary=args.summary, checkpoint=args.checkpoint, decoder=args.decoder,
                             control_rate_hz=args.control_rate, instruction=args.instruction, storage=args.storage,
                             tolerance=args.tolerance, timeout_s=args.timeout_s, rate=args.rate,
                             domain_id=args.domain_id)
        summary = replay(opts)
    except (BagError, ValueError, OSError, RuntimeError) as err:  # ReplayTimeout is a RuntimeError
        print(f"replay: error: {err}", file=sys.stderr, flush=True)
        return 2
    print(verdict(summary), flush=True)
    if args.check and not summary["within_tolerance"]:
        return 1
    return 0
