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
  logic compute is still the node's code, the check of the arm against the checkpoint's robot
  included.
- ``realtime`` plays the bag onto DDS at its own pace (``--rate``), publishing ``/clock`` from the
  bag (or from the log times when it has none), with the real node in a subprocess under
  ``use_sim_time``, and records the commands the node publishes, stamped with the bag time they
  arrived at. Timing-dependent by nature; the diff says how far it drifts. A node that refuses to
  start (another arm than the checkpoint's, say) ends the replay at once, quoting its reason.

The node's parameters are the recording's, ``--params-file``'s and the flags', each over the one
before (:mod:`~vla_accel_ros.rosbag.replay_settings`). The arm's URDF is, in the node's order, the
``robot_description`` parameter, ``urdf_file`` (``--urdf``), the bag's ``/robot_description``, the
package's. ``--remap`` renames the bag's topics as they are read and never reaches rcl.

Both write the produced commands (``/arm_controller/commands`` in controller-joint order and the
gripper's) into ``--out``, compare them with the commands recorded in the input bag
(:mod:`~vla_accel_ros.rosbag.compare`: per-joint max/mean absolute differences, the first divergent
step, a one-line verdict) and report the input errors of each kind (``--summary DIR`` also writes
``DIR/summary.json``). A missing, truncated or corrupt bag, or one lacking a required topic, exits
non-zero with a message naming the problem, and so does a replay that produces no command
(:func:`~vla_accel_ros.rosbag.compare.no_command_cause` names the likely reason); every wait has a
timeout.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.convert import controller_joint_order
from vla_accel_ros.core.input_errors import InputErrorCounts
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.models.load import check_checkpoint
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.processes import NodeProcess
from vla_accel_ros.rosbag.compare import (
    compare,
    count_unsafe,
    default_tolerance,
    grouped,
    parse_command,
    recording_kind,
)
from vla_accel_ros.rosbag.io import (
    TOPICS,
    BagError,
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
    arm_urdf,
    make_deterministic,
)
from vla_accel_ros.rosbag.replay_report import write_report
from vla_accel_ros.rosbag.replay_settings import (
    NodeSettings,
    ReplayOptions,
    node_arguments,
    node_settings,
    node_topics,
    overrides_yaml,
)

READY_TIMEOUT_S = 90.0
# The node's report rate in realtime replay: frequent reports keep apart the kinds of input error.
STATS_RATE_HZ = 10.0


def _roles(topics: dict[str, str]) -> dict[str, str]:
    return {topic: role for role, topic in topics.items()}


def _joint_state_facts(bag: BagReader, topic: str) -> dict[str, Any]:
    """How many joint states the bag holds and the names the first one carries (its first 12; None
    without one)."""
    names = next((list(m.msg.name)[:12] for m in bag.messages([topic])), None) if bag.count(topic) else None
    return {"joint_states": bag.count(topic), "joint_state_names": names}


def _timeline(bag: BagReader) -> dict[str, Any]:
    """What the comparison and the report need to know of the recording: its kind (live or
    deterministic), its start and its episode boundaries (the log times of the episode reports)."""
    topic = TOPICS["episode"][0]
    boundaries = [m.log_ns for m in bag.messages([topic], raw=True)] if bag.count(topic) else []
    return {"recording": recording_kind(bag.custom), "start_ns": bag.start_ns, "boundaries_ns": boundaries}


def _robot_description(bag: BagReader) -> str | None:
    topic = TOPICS["robot_description"][0]
    if not bag.count(topic):
        return None
    for m in bag.messages([topic]):
        return str(m.msg.data)
    return None


def _open_checked(opts: ReplayOptions) -> tuple[BagReader, NodeSettings, dict[str, str]]:
    """The bag, the node's settings and its topics; BagError when the bag lacks an input, ValueError
    naming a checkpoint that cannot load."""
    bag = open_bag(opts.bag, remap=parse_remaps(opts.remap))
    try:
        settings = node_settings(opts, bag.custom)
        policy = settings.config.policy
        if settings.config.inference:  # named before the node or its core start to load it
            check_checkpoint(policy.checkpoint or default_checkpoint(), unnorm_key=policy.unnorm_key)
        topics = node_topics(settings.config)
        bag.require([topics["camera"], topics["joint_states"]])
        if not bag.count(topics["instruction"]) and not settings.config.instruction:
            raise BagError(f"bag {opts.bag} lacks topic {topics['instruction']} and no --instruction was given: "
                           f"the policy has no task")
    except BaseException:
        bag.close()
        raise
    return bag, settings, topics


# --- deterministic ---------------------------------------------------------------------------
def replay_deterministic(opts: ReplayOptions, progress: bool = True) -> dict[str, Any]:
    from vla_accel_ros.core.progress import progress_bar

    make_deterministic()
    started = time.monotonic()
    deadline = started + opts.timeout_s
    bag, settings, topics = _open_checked(opts)
    with bag:
        cfg = settings.config
        core = LockstepCore(cfg, urdf=_robot_description(bag))  # checks the arm against the checkpoint's robot
        roles = _roles(topics)
        facts = {**_joint_state_facts(bag, topics["joint_states"]), **_timeline(bag)}
        produced: list[Command] = []
        recorded: list[Command] = []
        inputs = [topics[r] for r in ("camera", "wrist_camera", "joint_states", "instruction", "commands", "gripper")
                  if r in topics]
        total = sum(bag.count(t) for t in inputs)
        writer = BagWriter(opts.out, opts.storage, custom=_out_custom(opts, cfg)) if opts.out else None
        last_fingers: dict[int, np.ndarray] = {}
        try:
            for role, m in progress_bar(grouped(bag.messages(inputs), roles), total=total, desc="replay",
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
    tally = InputErrorCounts()
    for message, n in core.errors.items():
        tally.add(message, n)
    return _summarise(opts, cfg, core.kin, produced, recorded, core.frames, tally, time.monotonic() - started,
                      inferences=core.inferences, checkpoint=str(core.checkpoint), urdf=core.urdf_source,
                      controller_joints=list(core.controller_joints), robot_warning=core.robot_warning,
                      input_topics=topics, **facts)


def _out_custom(opts: ReplayOptions, cfg: NodeConfig) -> dict[str, Any]:
    policy = cfg.policy
    return {"source": "replay", "mode": opts.mode, "input_bag": str(Path(opts.bag).resolve()),
            "decoder": policy.decoder, "checkpoint": policy.checkpoint, "control_rate_hz": cfg.control_rate_hz,
            "temperature": policy.temperature, "kf_fill_check": policy.kf_fill_check, "tcp_frame": cfg.tcp_frame,
            "params_file": opts.params_file}


def _summarise(opts: ReplayOptions, cfg: NodeConfig, kin: Any, produced: list[Command], recorded: list[Command],
               frames: int, tally: InputErrorCounts, wall_s: float, *, recording: str, start_ns: int,
               boundaries_ns: list[int], inference_errors: Sequence[str] = (), **extra: Any) -> dict[str, Any]:
    """The replay's summary (see :mod:`~vla_accel_ros.rosbag.compare` for the tolerance); with
    ``--summary DIR``, also its step-by-step CSV and plot (:mod:`~vla_accel_ros.rosbag.replay_report`)."""
    tolerance = opts.tolerance if opts.tolerance is not None else default_tolerance(recording, kin, cfg.period_s)
    summary: dict[str, Any] = {
        "bag": str(opts.bag), "out": opts.out, "mode": opts.mode, "frames": frames, "commands": len(produced),
        "sources": dict(Counter(c.source for c in produced if c.source)),
        "unsafe_commands": count_unsafe(kin, produced),
        **compare(produced, recorded, kin.joint_names, cfg.period_s, tolerance, start_ns, recording),
        "recording": recording, "tolerance_source": "--tolerance" if opts.tolerance is not None else "recording",
        "bag_start_s": float_seconds(start_ns), "episode_boundaries_s": [float_seconds(b - start_ns)
                                                                       for b in boundaries_ns],
        "errors": tally.lines() + list(inference_errors),
        "input_errors": tally.total, "input_errors_by_kind": dict(tally.by_kind),
        "decoder": cfg.policy.decoder, "control_rate_hz": cfg.control_rate_hz, "wall_s": wall_s,
        "arm_joints": list(kin.joint_names), "tcp_frame": kin.tcp_frame, "params_file": opts.params_file,
        "robot_warning": "", **extra,
    }
    if opts.summary and produced:
        summary.update(write_report(Path(opts.summary), produced, recorded, kin, cfg.period_s, start_ns,
                                    summary["tolerance"], boundaries_ns))
    return summary


# --- realtime --------------------------------------------------------------------------------
class BagPlayer:
    """An rclpy node in this process that plays the bag's inputs on ``TOPICS`` and collects the
    node's commands (``command_topic``, in ``controller_joints`` order) and its reports."""

    def __init__(self, domain_id: int, bag: BagReader, kin: Any, *, camera_type: str = "",
                 command_topic: str = TOPICS["commands"][0], gripper_topic: str = TOPICS["gripper"][0],
                 controller_joints: Sequence[str] = ()) -> None:
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float64MultiArray, String

        from vla_accel_ros.ros.rclpy_util import LATCHED_QOS, BackgroundNode

        self._ros = BackgroundNode("vla_accel_replay", domain_id)
        self.node = self._ros.node
        camera_type = camera_type or bag.topics.get(TOPICS["camera"][0], ("sensor_msgs/msg/Image", 0))[0]
        self.pubs: dict[str, Any] = {
            "camera": self.node.create_publisher(CompressedImage if camera_type.endswith("CompressedImage") else Image,
                                                 TOPICS["camera"][0], 10),
            "joint_states": self.node.create_publisher(JointState, TOPICS["joint_states"][0], 10),
            "instruction": self.node.create_publisher(String, TOPICS["instruction"][0], LATCHED_QOS),
            "clock": self.node.create_publisher(Clock, TOPICS["clock"][0], 10),
            "robot_description": self.node.create_publisher(String, TOPICS["robot_description"][0], LATCHED_QOS),
        }
        if bag.count(TOPICS["wrist_camera"][0]):  # the second image slot, as recorded
            self.pubs["wrist_camera"] = self.node.create_publisher(Image, TOPICS["wrist_camera"][0], 10)
        self._Clock = Clock
        self.kin = kin
        self.controller_joints = tuple(controller_joints) or tuple(kin.joint_names)
        self.bag_ns = 0  # bag time of the newest /clock published
        self.commands: list[Command] = []
        self.fingers: list[tuple[int, np.ndarray]] = []
        self._lock = threading.Lock()
        self.node.create_subscription(Float64MultiArray, command_topic, self._on_command, 100)
        if gripper_topic:
            self.node.create_subscription(Float64MultiArray, gripper_topic, self._on_gripper, 100)
        self.stats: dict[str, Any] = {}
        self.tally = InputErrorCounts()  # the node's own counts, from its newest ~/stats
        self.reports = 0  # ~/stats reports received
        self.node.create_subscription(String, TOPICS["stats"][0], self._on_stats, 10)
        self._ros.spin(timeout_sec=0.05)

    def _on_command(self, msg: Any) -> None:
        if len(msg.data) == self.kin.n:
            q = self.kin.from_named(self.controller_joints, np.asarray(msg.data, dtype=float))
            with self._lock:
                self.commands.append(Command(self.bag_ns, q))

    def _on_gripper(self, msg: Any) -> None:
        with self._lock:
            self.fingers.append((self.bag_ns, np.asarray(msg.data, dtype=float)))

    def _on_stats(self, msg: Any) -> None:
        try:
            stats = json.loads(msg.data)
        except ValueError:
            return
        with self._lock:
            self.stats = stats
            self.tally = InputErrorCounts.from_json(stats)
            self.reports += 1

    def inference_errors(self) -> list[str]:
        """The node's account of failed inference (from its ~/stats)."""
        s = self.stats
        if s.get("inference_errors"):
            return [f"inference failed, last: {s.get('inference_last_error', '')} (x{int(s['inference_errors'])})"]
        return []

    def publish(self, role: str, raw: bytes) -> None:
        self.pubs[role].publish(raw)  # CDR bytes straight from the bag

    def publish_clock(self, t_ns: int) -> None:
        from builtin_interfaces.msg import Time

        self.bag_ns = t_ns
        self.pubs["clock"].publish(self._Clock(clock=Time(sec=t_ns // 1_000_000_000, nanosec=t_ns % 1_000_000_000)))

    def close(self) -> None:
        self._ros.close()


def _robot_warning(stats: dict[str, Any], log_path: Path) -> str:
    """The node's warning that it runs on another arm than its checkpoint's (~/stats, else its log)."""
    if stats.get("robot_warning"):
        return str(stats["robot_warning"])
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in lines if "running with allow_unmatched_robot" in line), "")


def replay_realtime(opts: ReplayOptions, progress: bool = True) -> dict[str, Any]:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.progress import progress_bar

    started = time.monotonic()
    deadline = started + opts.timeout_s
    bag, settings, topics = _open_checked(opts)
    cfg = settings.config
    node: NodeProcess | None = None
    player: BagPlayer | None = None
    log_path = Path(opts.summary or ".") / "replay_node.log"
    try:
        bag_urdf = _robot_description(bag)
        source, label = arm_urdf(cfg, bag_urdf)
        from_bag = source == bag_urdf
        try:
            kin = ArmKinematics(source, tcp_frame=cfg.tcp_frame)
        except ValueError as err:
            raise ValueError(f"bad URDF ({label}): {err}") from err
        controller_joints = controller_joint_order(kin, cfg.controller_joints)
        facts = {**_joint_state_facts(bag, topics["joint_states"]), **_timeline(bag)}
        recorded = [Command(m.log_ns, q) for m in bag.messages([topics["commands"]])
                    if (q := parse_command(kin, controller_joints, m.msgtype, m.msg)) is not None]
        camera_type = bag.topics[topics["camera"]][0]
        domain = opts.domain_id or (100 + (os.getpid() + 50) % 100)
        # The player publishes on TOPICS and reads the forward_position commands: the node is set so.
        fixed: dict[str, Any] = {"use_sim_time": True, "autostart": True, "image_topic": TOPICS["camera"][0],
                                 "compressed_image": camera_type.endswith("CompressedImage"),
                                 "joint_states_topic": TOPICS["joint_states"][0], "output": "forward_position",
                                 "robot_description_timeout_s": 10.0 if from_bag else 0.0,
                                 "stats_rate_hz": STATS_RATE_HZ}
        if "wrist_camera" in topics:  # both cameras, in slot order, on the topics the player publishes
            fixed["image_topics"] = [TOPICS["camera"][0], TOPICS["wrist_camera"][0]]
        forward = replace(cfg, output="forward_position")
        player = BagPlayer(domain, bag, kin, camera_type=camera_type, command_topic=node_topics(forward)["commands"],
                           gripper_topic=node_topics(forward).get("gripper", ""), controller_joints=controller_joints)
        if from_bag:
            from std_msgs.msg import String

            player.pubs["robot_description"].publish(String(data=bag_urdf))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        overrides = log_path.with_name("replay_node_params.yaml")
        if opts.params_file:
            overrides.write_text(overrides_yaml(settings, fixed))
        args = node_arguments(settings, fixed, str(overrides), str(Path(opts.params_file).resolve())
                              if opts.params_file else "")
        env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONUNBUFFERED="1")
        node = NodeProcess.start("vla_accel_ros.ros.node", args, log_path, env)
        ready_by = time.monotonic() + min(READY_TIMEOUT_S, opts.timeout_s)
        while (player.pubs["camera"].get_subscription_count() == 0
               or player.pubs["joint_states"].get_subscription_count() == 0):
            if node.returncode is not None:
                raise node.exit_error("before playback")
            if time.monotonic() > ready_by:
                raise ReplayTimeout(f"the node did not subscribe to {TOPICS['camera'][0]} ({camera_type}) and "
                                    f"{TOPICS['joint_states'][0]} within {READY_TIMEOUT_S:g} s; see {log_path}")
            time.sleep(0.05)
        time.sleep(0.3)  # let the node's other subscriptions match too
        has_clock = bag.count(TOPICS["clock"][0]) > 0
        roles = _roles(topics)
        inputs = [topics["camera"], topics["joint_states"], topics["instruction"]] + (
            [TOPICS["clock"][0]] if has_clock else []) + ([topics["wrist_camera"]] if "wrist_camera" in topics else [])
        total = sum(bag.count(t) for t in inputs)
        frames = 0
        wall0, bag0 = time.monotonic(), None
        for role, m in progress_bar(grouped(bag.messages(inputs, raw=True), roles), total=total, desc="replay",
                                    unit="msg", disable=not progress):
            if time.monotonic() > deadline:
                raise ReplayTimeout(f"replay of {opts.bag} ran past --timeout-s {opts.timeout_s:g} s")
            if node.returncode is not None:
                raise node.exit_error("during playback")
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
        # Two more reports: the second one was made after the node took the last message.
        reports_by, wanted = time.monotonic() + 10.0 / STATS_RATE_HZ, player.reports + 2
        while player.reports < wanted and time.monotonic() < reports_by and node.returncode is None:
            time.sleep(0.02)
    finally:
        if node is not None:
            node.stop()
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
                writer.write(TOPICS["commands"][0], cmd.t_ns, make_float_array(kin.to_named(cmd.q, controller_joints)))
                if cmd.fingers.size:
                    writer.write(TOPICS["gripper"][0], cmd.t_ns, make_float_array(cmd.fingers))
            writer.write(TOPICS["stats"][0], player.bag_ns or 1, make_string(json.dumps({"commands": len(produced)})))
    return _summarise(opts, cfg, kin, produced, recorded, frames, player.tally, time.monotonic() - started,
                      inference_errors=player.inference_errors(), node_log=str(log_path), urdf=label,
                      controller_joints=list(controller_joints),
                      robot_warning=_robot_warning(player.stats, log_path), input_topics=topics, **facts)


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
