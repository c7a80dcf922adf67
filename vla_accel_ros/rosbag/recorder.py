"""Recording of sim episodes with the node into a rosbag2 for regression tests (``vla-accel record``).

The bag holds the camera (``/camera/image_raw``), ``/joint_states``, the instruction topic, the
node's commands (``/arm_controller/commands`` and ``/gripper_controller/commands``), ``/clock``,
``/robot_description``, the node's ``~/stats`` and the bridge's episode reports; the recording's
settings (decoder, kf_fill_check, temperature, control rate, checkpoint, seed, mode) go into metadata.yaml's
custom_data, and ``vla-accel replay`` picks them up.

- ``--mode live`` (default) runs the sim bridge and the node as processes over DDS (the
  orchestration of ``vla-accel sim``) with a recorder node on the same domain: sensor topics
  best effort with deep keep-last queues, commands and the rest reliable, the description
  transient local; each message is written as received (CDR untouched) at its receive time on
  the sim clock. The commands come from the live, threaded node, so they depend on timing.
- ``--mode deterministic`` steps the same MuJoCo task in this process in lock-step with the
  node's core (:class:`~vla_accel_ros.rosbag.lockstep.LockstepCore`), mirroring the bridge (physics and
  joint states at 100 Hz, a frame every 5th step, commands applied from the next step, the
  same settling after a reset: :mod:`vla_accel_ros.sim.settle`), and writes the same topics with
  stamps on a fixed clock.
  ``vla-accel replay`` of such a bag reproduces its commands exactly.

Either way the summary counts each episode's ticks and policy ticks (``policy_tick_share``), and
``no_policy_tick`` says why when an episode had none: the recording never shows the policy driving.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.errors import RunFailed
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.models.load import check_checkpoint
from vla_accel_ros.ros.parameters import NodeConfig, PolicySettings, SimBridgeConfig
from vla_accel_ros.rosbag.io import (
    STORAGES,
    TOPICS,
    BagWriter,
    make_clock,
    make_image,
    make_joint_state,
    make_string,
)

MODES = ("live", "deterministic")
EPOCH_NS = 1_000_000_000_000  # deterministic recordings start at t = 1000 s
READY_ROLES = ("camera", "joint_states", "commands")  # what the live recorder must hear before the run starts


@dataclass(frozen=True)
class RecordOptions:
    episodes: int = 1
    out: str = "outputs/bags/sim"
    storage: str = "mcap"
    mode: str = "live"
    policy: PolicySettings = field(default_factory=PolicySettings)
    control_rate_hz: float = 20.0
    seed: int = 100_000
    duration_s: float = 8.0
    domain_id: int = 0
    cameras: int = 1  # 2: the wrist camera too (/wrist_camera/image_raw), the node's second image slot

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {self.episodes}")
        if self.storage not in STORAGES:
            raise ValueError(f"--storage must be one of {', '.join(STORAGES)}, got '{self.storage}'")
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got '{self.mode}'")
        if not 1.0 <= self.control_rate_hz <= 500.0:
            raise ValueError(f"--control-rate must be in [1, 500] Hz, got {self.control_rate_hz}")
        if self.duration_s <= 0:
            raise ValueError(f"--duration-s must be > 0, got {self.duration_s}")
        if self.cameras not in (1, 2):
            raise ValueError(f"--cameras must be 1 (scene) or 2 (scene and wrist), got {self.cameras}")
        if Path(self.out).exists():
            raise ValueError(f"--out {self.out} exists already; rosbag2 writes a new directory")

    def custom(self) -> dict[str, Any]:
        """The recording's settings for the bag's metadata, flat: these options and the policy's
        decoder, kf_fill_check, checkpoint (absolute) and sampling temperature, which a replay
        needs to reproduce the commands."""
        options = asdict(self)
        del options["policy"]
        policy = self.policy
        checkpoint = str(CheckpointRef.parse(policy.checkpoint).resolved()) if policy.checkpoint else ""
        return {"source": "record", **options, "decoder": policy.decoder, "kf_fill_check": policy.kf_fill_check,
                "checkpoint": checkpoint, "temperature": policy.temperature}


# --- deterministic ----------------------------------------------------------------------------
def record_deterministic(opts: RecordOptions, progress: bool = True) -> dict[str, Any]:
    """The bridge's loop and the node's core in one process, in lock-step (see the module doc)."""
    from vla_accel_ros.core.progress import progress_bar
    from vla_accel_ros.rosbag.lockstep import LockstepCore, make_deterministic
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
    from vla_accel_ros.sim.settle import settling_after_reset

    make_deterministic()
    bridge = SimBridgeConfig(episode_duration_s=opts.duration_s)
    rate = bridge.joint_state_rate_hz
    camera_every = max(1, int(round(rate / bridge.camera_rate_hz)))
    dt_ns = int(round(1e9 / rate))
    cfg = NodeConfig(control_rate_hz=opts.control_rate_hz, policy=opts.policy, autostart=True,
                     image_topics=(TOPICS["camera"][0], TOPICS["wrist_camera"][0]) if opts.cameras == 2 else ())
    env = PickCubeEnv(SimConfig(image_size=bridge.image_size, control_hz=rate,
                                max_steps=max(1, int(round(opts.duration_s * rate))),
                                success_hold_steps=max(1, int(round(bridge.success_hold_s * rate)))))
    kin = env.kin
    core = LockstepCore(cfg, urdf=kin.urdf_xml)
    names = list(kin.joint_names) + list(kin.gripper_joint_names)
    max_opening = float(kin.gripper_limits.upper.max()) if kin.gripper_joint_names else 0.0
    episodes: list[dict[str, Any]] = []
    t_ns = EPOCH_NS
    commands = 0
    started = time.monotonic()
    with BagWriter(opts.out, opts.storage, custom=opts.custom()) as writer:
        writer.write(TOPICS["robot_description"][0], t_ns, make_string(kin.urdf_xml))
        bar = progress_bar(range(opts.episodes), desc="record", unit="ep", disable=not progress)
        try:
            for i in bar:
                env.reset(opts.seed + i)
                reset_pose, settled = env.joint_positions(), False  # as the bridge (sim.settle)
                q_cmd: np.ndarray | None = None
                gripper_cmd: float | None = None
                step = ticks = policy_ticks = 0
                min_clearance = env.target_clearance()
                while not env.done:
                    settled = settled or not settling_after_reset(step / rate, q_cmd, reset_pose)
                    if settled and (q_cmd is not None or gripper_cmd is not None):
                        env.apply_joint_targets(q_cmd if q_cmd is not None else env.data.ctrl[
                            env.handles.arm_actuators].copy(), gripper_cmd if gripper_cmd is not None
                            else env.gripper_command)
                    env.advance()
                    step += 1
                    t_ns += dt_ns
                    # Order within one stamp = replay's PRIORITY: clock, instruction, joints, wrist camera, camera.
                    writer.write(TOPICS["clock"][0], t_ns, make_clock(t_ns))
                    if (step - 1) % int(round(rate)) == 0:  # the bridge repeats it every second
                        msg = make_string(env.instruction)
                        writer.write(TOPICS["instruction"][0], t_ns, msg)
                        core.feed("instruction", msg, t_ns)
                    msg = make_joint_state(names, env.joint_positions().tolist() + env.finger_positions().tolist(),
                                           t_ns, env.joint_velocities().tolist() + [0.0] * len(kin.gripper_joint_names))
                    writer.write(TOPICS["joint_states"][0], t_ns, msg)
                    core.feed("joint_states", msg, t_ns)
                    if step % camera_every == 0:
                        if opts.cameras == 2:  # before the scene camera, whose frame completes the observation
                            msg = make_image(env.render(env.handles.wrist_camera), t_ns, frame_id="wrist")
                            writer.write(TOPICS["wrist_camera"][0], t_ns, msg)
                            core.feed("wrist_camera", msg, t_ns)
                        msg = make_image(env.render(), t_ns)
                        writer.write(TOPICS["camera"][0], t_ns, msg)
                        tick = core.feed("camera", msg, t_ns)
                        if tick is not None:
                            ticks += 1
                            policy_ticks += tick.source == "policy"
                        cmd = core.command(tick, t_ns)
                        if cmd is not None:
                            core.write_command(writer, cmd)
                            commands += 1
                            q_cmd = cmd.q
                            if cmd.fingers.size and max_opening > 0:
                                gripper_cmd = float(np.clip(np.mean(cmd.fingers) / max_opening, 0.0, 1.0))
                    if step % int(round(rate)) == 0:  # ~/stats at 1 Hz, as the node's default
                        writer.write(TOPICS["stats"][0], t_ns, make_string(core.stats_json()))
                    min_clearance = min(min_clearance, env.target_clearance())
                report = {"seed": opts.seed + i, "color": env.color, "instruction": env.instruction,
                          "success": bool(env.success()), "steps": int(env.steps), "duration_s": step / rate,
                          "min_clearance_m": float(min_clearance), "ticks": ticks, "policy_ticks": policy_ticks}
                writer.write(TOPICS["stats"][0], t_ns, make_string(core.stats_json()))
                writer.write(TOPICS["episode"][0], t_ns, make_string(json.dumps(report)))
                episodes.append(report)
                bar.success(sum(bool(e["success"]) for e in episodes), len(episodes))
        finally:
            env.close()
        counts = dict(writer.counts)
    stats = core.controller.stats
    return _summary(opts, episodes, counts, commands, time.monotonic() - started, errors=dict(core.errors),
                    no_policy_tick=_no_policy_tick(episodes, core.cfg.action_timeout_s, stats.actions_expired))


# --- live -------------------------------------------------------------------------------------
class BagRecorder:
    """An rclpy node writing the recorded topics to a bag as they arrive (a ``run_sim`` attachment)."""

    def __init__(self, domain_id: int, writer: BagWriter) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.parameter import Parameter
        from rclpy.qos import (
            DurabilityPolicy,
            HistoryPolicy,
            QoSProfile,
            ReliabilityPolicy,
        )
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float64MultiArray, String

        self._rclpy = rclpy
        self.writer = writer
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        # Receive stamps on the sim clock, like `ros2 bag record --use-sim-time`.
        self.node = rclpy.create_node("vla_accel_recorder", context=self.context,
                                      parameter_overrides=[Parameter("use_sim_time", value=True)])
        sensor = QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST)
        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        classes = {"sensor_msgs/msg/Image": Image, "sensor_msgs/msg/JointState": JointState,
                   "std_msgs/msg/String": String, "std_msgs/msg/Float64MultiArray": Float64MultiArray,
                   "rosgraph_msgs/msg/Clock": Clock}
        qos = {"camera": sensor, "joint_states": sensor, "robot_description": latched, "instruction": latched}
        self._pending: list[tuple[str, str, bytes]] = []
        self._lock = threading.Lock()
        self.errors: list[str] = []
        self._subscriptions = {role: self.node.create_subscription(classes[msgtype], topic,
                                                                   self._callback(topic, msgtype),
                                                                   qos.get(role, reliable), raw=True)
                               for role, (topic, msgtype) in TOPICS.items()}
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, name="bag_recorder", daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        """Whether the camera, the joint states and the commands each have a publisher matched."""
        return all(self._subscriptions[role].get_publisher_count() > 0 for role in READY_ROLES)

    def _callback(self, topic: str, msgtype: str) -> Any:
        def write(raw: bytes) -> None:
            now = self.node.get_clock().now().nanoseconds
            with self._lock:
                if self.writer.closed:
                    return
                if now == 0:  # no /clock yet: keep it for the first sim time
                    self._pending.append((topic, msgtype, bytes(raw)))
                    return
                for item in self._pending:
                    self.writer.write_raw(item[0], item[1], now, item[2])
                self._pending.clear()
                self.writer.write_raw(topic, msgtype, now, raw)

        return write

    def _spin(self) -> None:
        while not self._stop.is_set() and self._rclpy.ok(context=self.context):
            try:
                self.executor.spin_once(timeout_sec=0.05)
            except Exception as err:  # a failed write must not kill the run silently
                if self._rclpy.ok(context=self.context):
                    self.errors.append(f"{type(err).__name__}: {err}")
                break

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self._rclpy.try_shutdown(context=self.context)
        with self._lock:
            self.writer.close()


def record_live(opts: RecordOptions, progress: bool = True) -> dict[str, Any]:
    """``vla-accel sim``'s processes plus a :class:`BagRecorder` on their domain."""
    from vla_accel_ros.ros.launcher import SimRunOptions, run_sim

    out = Path(opts.out)
    run_dir = out.parent / f"{out.name}_sim"
    writer = BagWriter(out, opts.storage, custom=opts.custom())
    recorders: list[BagRecorder] = []

    def attach(domain: int) -> BagRecorder:
        recorders.append(BagRecorder(domain, writer))
        return recorders[-1]

    started = time.monotonic()
    try:
        sim = run_sim(SimRunOptions(episodes=opts.episodes, control_rate_hz=opts.control_rate_hz, policy=opts.policy,
                                    out=str(run_dir), seed=opts.seed, duration_s=opts.duration_s,
                                    domain_id=opts.domain_id, cameras=opts.cameras), progress=progress,
                     attach=attach)
    finally:
        writer.close()
    errors = recorders[0].errors if recorders else []
    if errors:
        raise RunFailed(f"the recorder failed: {errors[0]}")
    commands = writer.counts.get(TOPICS["commands"][0], 0)
    return _summary(opts, sim["per_episode"], dict(writer.counts), commands, time.monotonic() - started,
                    sim_summary=str(run_dir / "summary.json"), no_policy_tick=sim["no_policy_tick"])


def _no_policy_tick(episodes: list[dict[str, Any]], action_timeout_s: float, expired: int) -> str:
    """Why some lock-step episode had no policy tick ('' when each had one)."""
    idle = [str(e["seed"]) for e in episodes if e["policy_ticks"] == 0]
    if not idle:
        return ""
    return (f"no policy tick in the episode(s) of seed {', '.join(idle)}: {expired} policy action(s) expired "
            f"before use (action_timeout_s = {action_timeout_s:g} s) or none came")


def _summary(opts: RecordOptions, episodes: list[dict[str, Any]], counts: dict[str, int], commands: int,
             wall_s: float, **extra: Any) -> dict[str, Any]:
    ticks = sum(e["ticks"] for e in episodes)
    return {"bag": opts.out, "mode": opts.mode, "storage": opts.storage, "episodes": len(episodes),
            "success_rate": float(np.mean([e["success"] for e in episodes])) if episodes else 0.0,
            "policy_tick_share": sum(e["policy_ticks"] for e in episodes) / ticks if ticks else 0.0,
            "frames": counts.get(TOPICS["camera"][0], 0), "commands": commands, "messages": counts,
            "per_episode": episodes, "wall_s": wall_s, **extra}


def record(opts: RecordOptions, progress: bool = True) -> dict[str, Any]:
    """Record ``opts.episodes`` episodes in ``opts.mode``; a checkpoint that cannot load is named
    (ValueError) before the bag is created."""
    check_checkpoint(opts.policy.checkpoint or default_checkpoint(), unnorm_key=opts.policy.unnorm_key)
    return (record_deterministic if opts.mode == "deterministic" else record_live)(opts, progress)


