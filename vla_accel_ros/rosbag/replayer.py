"""Replay of a rosbag2 through the node, its commands compared with the recorded ones (``vla-accel replay``).

Two modes:

- ``deterministic`` (default) drives the node's own ROS-free core, :class:`LockstepCore` (the
  node's message converters, ``Controller`` and ``PolicyRunner`` built from the same
  ``NodeConfig``), synchronously in this process, in bag order. Joint states and the instruction
  update the controller; each camera frame gives exactly one inference on that observation, then
  one tick at the frame's own stamp, whose command is recorded. Messages sharing a log time are
  taken in a fixed order (description, clock, instruction, joint states, camera) whatever order
  the storage returns them in. torch runs on one thread with deterministic algorithms, and the
  decoders see a frozen clock, so a deadline-aware decoder decides the same way on any machine:
  two replays of one bag give bit-identical commands. No DDS delivery, executor scheduling or
  wall-clock timer enters, as a regression test requires; everything the policy and the safety
  logic compute is still the node's code.
- ``realtime`` plays the bag onto DDS at its own pace (``--rate``), publishing ``/clock`` from the
  bag (or from the log times when it has none), with the real node in a subprocess under
  ``use_sim_time``, and records the commands the node publishes, stamped with the bag time they
  arrived at. Timing-dependent by nature; the diff says how far it drifts.

Both write the produced commands (``/<controller>/commands`` and the gripper's) into ``--out``,
match them with the commands recorded in the input bag by stamp (nearest within half a control
period), and report per-joint max/mean absolute differences, the first divergent step, input
errors and a one-line verdict (``--summary DIR`` also writes ``DIR/summary.json``). A missing,
truncated or corrupt bag, or one lacking a required topic, exits non-zero with a message naming
the problem, and so does a replay that produces no command (:func:`no_command_cause` names the
likely reason); every wait has a timeout. ``--remap`` renames the bag's topics as they are read
and never reaches rcl.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.rosbag.io import (
    STORAGES,
    TOPICS,
    BagError,
    BagMessage,
    BagReader,
    BagWriter,
    float_seconds,
    make_float_array,
    make_string,
    open_bag,
    parse_remaps,
)
from vla_accel_ros.rosbag.lockstep import (
    Command,
    LockstepCore,
    ReplayTimeout,
    make_deterministic,
)

MODES = ("deterministic", "realtime")
DEFAULT_TOLERANCE = 1e-6  # rad
# Within one log time: the URDF first, then time, the task, the arm, and last the frame that
# triggers inference (so the frame sees the joint state stamped with it).
PRIORITY = {"robot_description": 0, "clock": 1, "instruction": 2, "joint_states": 3, "camera": 4}
READY_TIMEOUT_S = 90.0


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


def _joint_state_facts(bag: BagReader) -> dict[str, Any]:
    """How many joint states the bag holds and the names the first one carries (its first 12; None
    without one)."""
    topic = TOPICS["joint_states"][0]
    names = next((list(m.msg.name)[:12] for m in bag.messages([topic])), None) if bag.count(topic) else None
    return {"joint_states": bag.count(topic), "joint_state_names": names}


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
        facts = _joint_state_facts(bag)
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
                      time.monotonic() - started, inferences=core.inferences, checkpoint=str(core.checkpoint),
                      **facts)


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
        "decoder": cfg.decoder, "control_rate_hz": cfg.control_rate_hz, "wall_s": wall_s,
        "arm_joints": list(kin.joint_names), **extra,
    }
    return summary


def no_command_cause(s: dict[str, Any]) -> str:
    """The likely reason a replay produced no command, from what its summary saw."""
    if not s["frames"]:
        return f"no camera frames reached the node (topic {TOPICS['camera'][0]})"
    if not s.get("joint_states"):
        return f"no joint states reached the node (topic {TOPICS['joint_states'][0]})"
    names, arm = s.get("joint_state_names"), s["arm_joints"]
    missing = [j for j in arm if names is not None and j not in names]
    if missing:
        which = "none of them there" if len(missing) == len(arm) else f"missing {', '.join(missing)}"
        return (f"the joint states name {names} but the URDF's arm joints are {arm} ({which}): "
                f"a bag of another arm? The URDF comes from the bag's {TOPICS['robot_description'][0]}, "
                f"else the package's")
    if s["errors"]:
        return f"the node rejected its input: {s['errors'][0]}"
    if s.get("inferences") == 0:
        return "no inference ran (no joint state or instruction before the frames?)"
    log = f"; see {s['node_log']}" if s.get("node_log") else ""
    return f"the node published no command for {s['frames']} frames{log}"


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
class BagPlayer:
    """An rclpy node in this process that plays the bag's inputs and collects the node's commands."""

    def __init__(self, domain_id: int, bag: BagReader, kin: Any) -> None:
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float64MultiArray, String

        from vla_accel_ros.ros.rclpy_util import LATCHED_QOS, BackgroundNode

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

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.ros.launcher import ros_args, stop_process

    started = time.monotonic()
    deadline = started + opts.timeout_s
    remap = parse_remaps(opts.remap)
    camera, joints, instruction = (TOPICS[r][0] for r in ("camera", "joint_states", "instruction"))
    bag = open_bag(opts.bag, required=[camera, joints], remap=remap)
    node_proc: subprocess.Popen | None = None
    player: BagPlayer | None = None
    log_path = Path(opts.summary or ".") / "replay_node.log"
    try:
        cfg = node_config(opts, bag.custom)
        if not bag.count(instruction) and not cfg.instruction:
            raise BagError(f"bag {opts.bag} lacks topic {instruction} and no --instruction was given")
        urdf = _robot_description(bag)
        kin = ArmKinematics(urdf or str(default_urdf()))
        facts = _joint_state_facts(bag)
        recorded = [Command(m.log_ns, q) for m in bag.messages([TOPICS["commands"][0]])
                    if (q := parse_command(kin, kin.joint_names, m.msgtype, m.msg)) is not None]
        domain = opts.domain_id or (100 + (os.getpid() + 50) % 100)
        player = BagPlayer(domain, bag, kin)
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
            node_proc = subprocess.Popen([sys.executable, "-m", "vla_accel_ros.ros.node", *ros_args(params)], env=env,
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
            stop_process(node_proc)
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
                      node_log=str(log_path), **facts)




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


