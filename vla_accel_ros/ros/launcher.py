"""The sim bridge and the VLA node as separate processes talking over DDS (what ``vla-accel sim`` runs).

The same two nodes ``sim.launch.py`` starts, without the ros2 CLI: each is a
``python -m ... --ros-args`` subprocess (``ros/processes.py``) on a private ROS_DOMAIN_ID, its
parameters those of its settings (:meth:`SimRunOptions.node_config`, ...) that differ from the
defaults. This process drives episodes
through the bridge's ``~/reset`` and ``~/episode`` topics, then stops the node (SIGINT; it writes
its statistics), and writes ``DIR/summary.json``, ``DIR/tick_jitter.png`` and
``DIR/joint_tracking.png``. The summary counts each episode's ticks and policy ticks
(``policy_tick_share``); an episode without a policy tick is a run that never drove the arm, and
``no_policy_tick`` says why in one line (``runtime/health.py``'s :func:`starved_advice`).

A ``--params-file`` (a ROS 2 parameter YAML, as the launch files take) gives the node any parameter;
the run's own settings apply over it where they differ from the node's defaults, and the sim's
robot, topics, rate, inference mode and lifecycle (:data:`SIM_PARAMETERS`) always apply.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vla_accel_ros.core.chunks import ChunkSettings
from vla_accel_ros.core.errors import RunFailed
from vla_accel_ros.core.params_file import ROS_BUILTIN_PARAMETERS, read_node_parameters
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.settings import ConfigError, changed_params, from_params, to_params
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.load import check_checkpoint
from vla_accel_ros.ros.netns import NetworkNamespace
from vla_accel_ros.ros.parameters import (
    INFERENCE_MODES,
    OUTPUT_FORMATS,
    InferenceNodeConfig,
    NodeConfig,
    PolicySettings,
    SimBridgeConfig,
)
from vla_accel_ros.ros.processes import NodeProcess, NodeRefused, parameter_arguments
from vla_accel_ros.ros.run_summary import SOURCE_CODES, chunk_metrics, episode_tick_counts
from vla_accel_ros.runtime.health import starved_advice

READY_TIMEOUT_S = 90.0
CAMERA_TOPICS = ("camera/image_raw", "wrist_camera/image_raw")  # the bridge's scene and wrist cameras
NODE_NAME = "vla_accel_node"  # its section in a --params-file
# The node's parameters the run sets whatever a --params-file says: the sim's robot and topics, the
# rate its reports are computed at, the inference mode it starts processes for, and the lifecycle.
SIM_PARAMETERS = ("control_rate_hz", "output", "controller", "controller_joints", "gripper_controller",
                  "joint_command_topic", "image_topic", "compressed_image", "image_topics", "image_transports",
                  "joint_states_topic", "instruction", "robot_description", "robot_description_timeout_s",
                  "urdf_file", "tcp_frame", "inference", "inference_mode", "autostart", "stats_file")


@dataclass(frozen=True)
class SimRunOptions:
    episodes: int = 3
    control_rate_hz: float = 20.0
    policy: PolicySettings = field(default_factory=PolicySettings)
    out: str = "outputs/sim"
    seed: int = 100_000
    inference_python: str = ""
    netns: bool = False  # remote mode: the inference node in a network namespace of its own
    duration_s: float = 6.0  # = `vla-accel eval`'s 120 steps at 20 Hz, so success rates compare
    output: str = "forward_position"
    executor: str = "single"
    inference_mode: str = "process"
    realtime_priority: int = 20
    domain_id: int = 0  # 0 = derived from the process id (a private domain per run)
    real_time_factor: float = 1.0
    inference: bool = True
    vision: VisionReuseConfig | None = None  # the node's vision_* parameters; None: its defaults (every patch)
    allow_unmatched_robot: bool = False  # the node's: run a checkpoint made for another arm of the same DOF
    chunks: ChunkSettings = field(default_factory=ChunkSettings)  # the node's chunk_* parameters
    cameras: int = 1  # 2: the bridge publishes the wrist camera too, and the node takes both (image_topics)
    stand_in_images: bool = False  # the node's allow_stand_in_images
    params_file: str = ""  # the node's ROS 2 parameter YAML (see the module doc)
    action_timeout_s: float | None = None  # the node's action_timeout_s; None: the params file's, else its default

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {self.episodes}")
        if not 1.0 <= self.control_rate_hz <= 500.0:
            raise ValueError(f"--control-rate must be in [1, 500] Hz, got {self.control_rate_hz}")
        if self.duration_s <= 0:
            raise ValueError(f"--duration-s must be > 0, got {self.duration_s}")
        if self.output not in OUTPUT_FORMATS:
            raise ValueError(f"--output must be one of {', '.join(OUTPUT_FORMATS)}, got {self.output}")
        if self.cameras not in (1, 2):
            raise ValueError(f"--cameras must be 1 (scene) or 2 (scene and wrist), got {self.cameras}")
        if not 0 <= self.domain_id <= 232:
            raise ValueError(f"--domain-id must be in [0, 232], got {self.domain_id}")
        if self.inference_mode not in INFERENCE_MODES:
            raise ValueError(f"--inference-mode must be one of {', '.join(INFERENCE_MODES)}, got {self.inference_mode}")
        if self.netns and self.inference_mode != "remote":
            raise ValueError("--netns needs --inference-mode remote (it puts the inference node in a namespace)")
        if self.action_timeout_s is not None and not 0.0 < self.action_timeout_s <= 60.0:
            raise ValueError(f"--action-timeout-s must be in (0, 60] s, got {self.action_timeout_s}")
        if self.params_file and not Path(self.params_file).is_file():
            raise ValueError(f"--params-file {self.params_file}: no such file")
        if self.vision is not None and self.inference_mode == "remote":
            raise ValueError("--vision needs --inference-mode thread or process: vla_inference_node encodes every "
                             "patch of every frame")
        self.node_config()  # what the nodes would refuse (ConfigError naming the parameter), refused here
        self.bridge_config()

    @property
    def stats_file(self) -> Path:
        return Path(self.out) / "node_stats.json"

    def node_config(self) -> NodeConfig:
        """vla_accel_node's settings for the run: the params file's, the run's over them (see the
        module doc), and the policy's checkpoint made absolute, since the node runs in another
        working directory."""
        config = NodeConfig(control_rate_hz=self.control_rate_hz, policy=self.policy, autostart=True,
                            output=self.output, executor=self.executor, stats_file=str(self.stats_file.resolve()),
                            inference=self.inference, robot_description_timeout_s=10.0,
                            inference_mode=self.inference_mode, realtime_priority=self.realtime_priority,
                            inference_python=self.inference_python, allow_unmatched_robot=self.allow_unmatched_robot,
                            chunks=self.chunks, image_topics=CAMERA_TOPICS if self.cameras == 2 else (),
                            allow_stand_in_images=self.stand_in_images)
        config = config if self.vision is None else replace(config, vision=self.vision)
        if self.params_file or self.action_timeout_s is not None:
            own = to_params(config)
            params = {**self.file_parameters(), **changed_params(config),
                      **{name: own[name] for name in SIM_PARAMETERS}}
            if self.action_timeout_s is not None:
                params["action_timeout_s"] = self.action_timeout_s
            try:
                config = from_params(NodeConfig, params)
            except ConfigError as err:
                where = f" (with --params-file {self.params_file})" if self.params_file else ""
                raise ConfigError(f"sim settings{where}: {err}") from err
        if config.policy.checkpoint:
            config = replace(config, policy=replace(
                config.policy, checkpoint=str(CheckpointRef.parse(config.policy.checkpoint).resolved())))
        return config

    def file_parameters(self) -> dict[str, Any]:
        """The parameters ``params_file`` gives the node (none without one), less ROS's own."""
        if not self.params_file:
            return {}
        return {name: value for name, value in read_node_parameters(self.params_file, NODE_NAME).items()
                if name not in ROS_BUILTIN_PARAMETERS and not name.startswith("qos_overrides.")}

    def inference_config(self) -> InferenceNodeConfig:
        """vla_inference_node's settings in remote mode: the node's policy, at its control period."""
        return InferenceNodeConfig(policy=self.node_config().policy, control_period_s=1.0 / self.control_rate_hz)

    def bridge_config(self) -> SimBridgeConfig:
        """sim_node's settings: episodes start on this run's resets."""
        return SimBridgeConfig(start_episode=False, episode_duration_s=self.duration_s,
                               real_time_factor=self.real_time_factor,
                               wrist_image_topic=CAMERA_TOPICS[1] if self.cameras == 2 else "")

    def to_json(self) -> dict[str, Any]:
        """The options as summary.json records them: flat, the policy's settings beside the others
        and its kinematic bounds as ``kinematic_r_bounds`` (None: the decoder's own)."""
        options = asdict(self)
        policy = options.pop("policy")
        options.update(options.pop("chunks"))
        del policy["kinematic_r_min"], policy["kinematic_r_max"]
        return {**options, **policy, "kinematic_r_bounds": self.policy.kinematic_r_bounds}


class _Monitor:
    """A small rclpy node in this process: sends resets, collects episode reports and stats."""

    def __init__(self, domain_id: int) -> None:
        from std_msgs.msg import String

        from vla_accel_ros.ros.rclpy_util import BackgroundNode

        self._ros = BackgroundNode("vla_accel_sim_runner", domain_id)
        self.node = self._ros.node
        self.episodes: list[dict[str, Any]] = []
        self.stats: dict[str, Any] = {}
        self.joint_states = 0
        self._cv = threading.Condition()
        self.node.create_subscription(String, "/sim_node/episode", self._on_episode, 10)
        self.node.create_subscription(String, "/vla_accel_node/stats", self._on_stats, 10)
        self.inference_stats: dict[str, Any] = {}  # vla_inference_node's, in remote mode
        self.node.create_subscription(String, "/vla_inference_node/stats", self._on_inference_stats, 10)
        from sensor_msgs.msg import JointState

        self.node.create_subscription(JointState, "/joint_states", self._on_joints, 10)
        self.reset_pub = self.node.create_publisher(String, "/sim_node/reset", 10)
        self._String = String
        self._ros.spin(timeout_sec=0.1)

    def _on_episode(self, msg: Any) -> None:
        with self._cv:
            self.episodes.append(json.loads(msg.data))
            self._cv.notify_all()

    def inference_connected(self) -> bool:
        """vla_inference_node is up and its endpoints are discovered from this side (across the
        veth pair in --netns), so the first episode's observations reach it."""
        from vla_accel_ros.ros import remote_protocol

        return (bool(self.inference_stats) and self.node.count_subscribers(f"/{remote_protocol.STATE_TOPIC}") >= 1
                and self.node.count_publishers(f"/{remote_protocol.ACTION_TOPIC}") >= 1)

    def _on_inference_stats(self, msg: Any) -> None:
        with self._cv:
            self.inference_stats = json.loads(msg.data)
            self._cv.notify_all()

    def _on_stats(self, msg: Any) -> None:
        with self._cv:
            self.stats = json.loads(msg.data)
            self._cv.notify_all()

    def _on_joints(self, msg: Any) -> None:
        with self._cv:
            self.joint_states += 1
            self._cv.notify_all()

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(predicate, timeout)

    def reset(self, seed: int) -> None:
        self.reset_pub.publish(self._String(data=json.dumps({"seed": seed})))

    def close(self) -> None:
        self._ros.close()


class Attachment(Protocol):
    """Something ``run_sim`` starts on the run's domain beside its processes (the bag recorder)."""

    def ready(self) -> bool:
        """Whether it hears the processes' topics: the first episode waits for it, so that under
        load DDS discovery cannot cost it the episode's start."""
        ...

    def close(self) -> None: ...


def run_sim(opts: SimRunOptions, progress: bool = True,
            attach: Callable[[int], Attachment] | None = None) -> dict[str, Any]:
    """Run ``opts.episodes`` episodes through ROS topics; returns the summary (also written to disk).

    ``attach(domain_id)`` starts an :class:`Attachment` on the run's domain once the processes are
    launched; the first episode starts when it is ready, and its ``close()`` is called before they
    are stopped."""
    policy = opts.node_config().policy
    if opts.inference:  # a checkpoint the node would refuse is named here, before any process starts
        check_checkpoint(policy.checkpoint or default_checkpoint(), unnorm_key=policy.unnorm_key)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    domain = opts.domain_id or (100 + os.getpid() % 100)
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"),
               PYTHONUNBUFFERED="1")
    stats_file = opts.stats_file
    stats_file.unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        remote = None
        if opts.inference_mode == "remote":
            host = stack.enter_context(NetworkNamespace(f"vla_accel_{domain}")) if opts.netns else None
            env = dict(env, **host.peers_env()) if host is not None else env
            remote = _start_inference_node(opts, out, env, host)
            stack.callback(remote.stop)
        episodes, peak_rss, windows = _run_episodes(opts, progress, attach, out, env, domain, remote)
    if not stats_file.is_file():
        raise RunFailed(f"the node wrote no statistics to {stats_file}; see {out}/vla_accel_node.log")
    node_stats = json.loads(stats_file.read_text())
    summary = _summarise(opts, episodes, node_stats, peak_rss, domain)
    summary.update(episode_tick_counts(node_stats["tick_log"], windows[0][0]))
    summary.update(policy_tick_counts(opts, episodes, node_stats, windows))
    summary["plots"] = _plot(node_stats, opts.control_rate_hz, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _ros_args(config: Any) -> list[str]:
    """A node's command line for ``config``: the parameters that differ from their defaults."""
    return ["--ros-args", *parameter_arguments(changed_params(config))]


def _start_inference_node(opts: SimRunOptions, out: Path, env: dict[str, str],
                          host: NetworkNamespace | None) -> NodeProcess:
    """The policy as vla_inference_node (in the namespace ``host`` when given) for the robot."""
    node_env = dict(env, **host.peers_env(inside=True)) if host is not None else env
    return NodeProcess.start("vla_accel_ros.ros.inference_node", _ros_args(opts.inference_config()),
                             out / "vla_inference_node.log", node_env, wrap=host.command if host is not None else None)


def _run_episodes(opts: SimRunOptions, progress: bool, attach: Callable[[int], Attachment] | None, out: Path,
                  env: dict[str, str], domain: int,
                  remote: NodeProcess | None) -> tuple[list[dict[str, Any]], float, list[tuple[float, float]]]:
    """The bridge and the node up, then the episodes: their reports, the node's peak RSS and when
    each episode started and ended (its reset sent, its report received: ``time.monotonic``, the
    clock of the node's tick log)."""
    from vla_accel_ros.core.progress import progress_bar

    sim = NodeProcess.start("vla_accel_ros.ros.sim_node", _ros_args(opts.bridge_config()), out / "sim_node.log", env)
    node = NodeProcess.start("vla_accel_ros.ros.node", _ros_args(opts.node_config()), out / "vla_accel_node.log", env)
    monitor = _Monitor(domain)
    attached = None

    def ended() -> bool:
        return any(p.returncode is not None for p in (node, sim, remote) if p is not None)

    try:
        attached = attach(domain) if attach is not None else None
        # the node's camera child delivers a frame before the first episode, so no episode pays its start-up
        ready = monitor.wait_for(lambda: bool(monitor.stats) and monitor.joint_states > 0 and
                                 monitor.stats.get("camera_frames", 1) > 0 and
                                 (remote is None or monitor.inference_connected()) and
                                 (attached is None or attached.ready()) or ended(), READY_TIMEOUT_S)
        if remote is not None and remote.returncode is not None:
            raise RunFailed(f"vla_inference_node exited (rc={remote.returncode}); see {remote.log}")
        if node.refused:
            raise NodeRefused(node.refusal() or f"vla_accel_node refused to start; see {node.log}")
        if not ready or ended():
            raise RunFailed(f"nodes did not come up (node rc={node.returncode}, sim rc={sim.returncode}); "
                               f"see {node.log} and {sim.log}")
        bar = progress_bar(range(opts.episodes), desc="sim", unit="ep", disable=not progress)
        windows: list[tuple[float, float]] = []
        for i in bar:
            n_before = len(monitor.episodes)
            started = time.monotonic()
            monitor.reset(opts.seed + i)
            done = monitor.wait_for(
                lambda n_before=n_before: len(monitor.episodes) > n_before or node.returncode is not None,
                opts.duration_s / max(opts.real_time_factor, 0.05) + 30.0)
            if not done or len(monitor.episodes) <= n_before:
                raise RunFailed(f"episode {i} (seed {opts.seed + i}) did not finish; node rc={node.returncode}")
            windows.append((started, time.monotonic()))
            bar.success(sum(bool(e["success"]) for e in monitor.episodes), len(monitor.episodes))
        return monitor.episodes, node.peak_rss_mb(), windows
    finally:
        if attached is not None:
            attached.close()
        node.stop()
        sim.stop()
        monitor.close()


def _summarise(opts: SimRunOptions, episodes: list[dict[str, Any]], node: dict[str, Any], peak_rss: float,
               domain: int) -> dict[str, Any]:
    keys = ("ticks", "ticks_published", "deadline_misses", "policy_ticks", "fallback_ticks", "hold_ticks",
            "actions_received", "actions_used", "actions_expired", "guard_trips", "inputs_rejected",
            "period_jitter_ms_p50", "period_jitter_ms_p99", "period_jitter_ms_max", "rate_hz",
            "inference_latency_ms_p50", "inference_latency_ms_p99", "inference_acceptance",
            "inference_target_passes_mean", "inference_errors", "inference_lost", "inference_dropped_late",
            "inference_round_trip_ms_p50", "inference_round_trip_ms_p99", "chunks_planned", "chunk_steps_dropped",
            "chunk_steps_blended", "chunk_replans", "obs_to_action_ms_p50", "obs_to_action_ms_p99")
    policy, waits = int(node.get("policy_ticks") or 0), int(node.get("chunk_wait_ticks") or 0)
    episode_s = float(sum(e.get("duration_s", 0.0) for e in episodes))
    return {
        "episodes": len(episodes),
        "success_rate": float(np.mean([e["success"] for e in episodes])) if episodes else 0.0,
        **{k: node.get(k) for k in keys},
        # the ticks a policy was expected whose command came from no plan (the fallback, or its hold)
        "chunk_wait_tick_share": waits / (policy + waits) if policy + waits else 0.0,
        "actions_per_s": policy / episode_s if episode_s else 0.0,
        "inferences_per_action": int(node.get("chunks_planned") or 0) / policy if policy else 0.0,
        **chunk_metrics(node["tick_log"], 1.0 / opts.control_rate_hz),
        # The node's footprint includes its inference child process when there is one.
        "peak_rss_mb": (peak_rss if np.isfinite(peak_rss) else node.get("peak_rss_mb", 0.0))
        + float(node.get("inference_child_peak_rss_mb") or 0.0),
        "node_process_peak_rss_mb": peak_rss if np.isfinite(peak_rss) else node.get("peak_rss_mb"),
        "inference_child_peak_rss_mb": node.get("inference_child_peak_rss_mb"),
        "per_episode": episodes,
        "options": opts.to_json(),
        "ros_domain_id": domain,
    }


def policy_tick_counts(opts: SimRunOptions, episodes: list[dict[str, Any]], node: dict[str, Any],
                       windows: list[tuple[float, float]]) -> dict[str, Any]:
    """Each episode's ``ticks`` and ``policy_ticks`` (into its report in ``episodes``: the node's
    ticks between its reset and its report), ``policy_tick_share`` over the episodes, and
    ``no_policy_tick``: '' when every episode had a policy tick, else why the policy never drove the arm."""
    wall = np.asarray(node["tick_log"]["wall"], dtype=float)
    policy = np.asarray(node["tick_log"]["source"], dtype=int) == SOURCE_CODES["policy"]
    for report, (start, end) in zip(episodes, windows, strict=True):
        inside = (wall >= start) & (wall <= end)
        report.update(ticks=int(inside.sum()), policy_ticks=int((inside & policy).sum()))
    ticks = sum(e["ticks"] for e in episodes)
    share = sum(e["policy_ticks"] for e in episodes) / ticks if ticks else 0.0
    idle = [str(e["seed"]) for e in episodes if e["policy_ticks"] == 0]
    reason = ""
    if idle and not opts.inference:
        reason = f"no policy tick in the episode(s) of seed {', '.join(idle)}: the node ran without inference"
    elif idle:
        cfg = opts.node_config()
        actions, errors = int(node.get("inference_actions") or 0), int(node.get("inference_errors") or 0)
        latency = node.get("inference_latency_ms_p50") if actions else None
        why = starved_advice(starved_s=float(opts.duration_s), inference_ms=latency,
                             action_timeout_s=cfg.action_timeout_s, fallback_max_s=cfg.fallback_max_s,
                             expired=int(node.get("actions_expired") or 0), failing=errors > 0 and not actions,
                             last_error=str(node.get("inference_last_error") or ""),
                             timeout_name="action_timeout_s (--action-timeout-s)")
        reason = f"no policy tick in the episode(s) of seed {', '.join(idle)}: {why}"
    return {"policy_tick_share": share, "no_policy_tick": reason}


def _plot(node: dict[str, Any], rate_hz: float, out: Path) -> list[str]:
    """The tick periods and the commanded against the measured joints, drawn into ``out``; their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = node["tick_log"]
    ros = np.asarray(log["ros"], dtype=float)
    period_ms = np.diff(ros) * 1e3
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(period_ms, lw=0.6)
    ax1.axhline(1e3 / rate_hz, color="k", ls="--", lw=0.8, label="nominal")
    ax1.set(xlabel="tick", ylabel="period (ms)", title=f"tick period at {rate_hz:g} Hz")
    ax1.legend()
    jitter = np.abs(period_ms - 1e3 / rate_hz)
    ax2.hist(jitter, bins=50)
    ax2.set(xlabel="|period - nominal| (ms)", ylabel="ticks", yscale="log", title="jitter")
    fig.tight_layout()
    fig.savefig(out / "tick_jitter.png", dpi=100)
    plt.close(fig)

    cmd = np.asarray(log["command"], dtype=float)
    meas = np.asarray(log["measured"], dtype=float)
    t = ros - ros[0] if ros.size else ros
    names = node.get("joint_names", [f"joint{i + 1}" for i in range(cmd.shape[1] if cmd.ndim == 2 else 0)])
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.4 * len(names)), sharex=True, squeeze=False)
    for j, name in enumerate(names):
        ax = axes[j, 0]
        ax.plot(t, meas[:, j], lw=0.8, label="measured")
        ax.plot(t, cmd[:, j], lw=0.8, ls="--", label="commanded")
        ax.set_ylabel(name, fontsize=8)
    axes[0, 0].legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(out / "joint_tracking.png", dpi=90)
    plt.close(fig)
    return ["tick_jitter.png", "joint_tracking.png"]


def run_sim_decoders(opts: SimRunOptions, decoders: list[str], progress: bool = True) -> dict[str, Any]:
    """The node with each decoder in turn, on the same seeds (``opts.out/DECODER``): each one's
    success and inference latency, and that latency's ratio to the first decoder's (``ar`` first
    for ratios against it). Also written to ``opts.out/decoders.json``. ``opts.policy``'s
    kf_fill_check and kinematic bounds go to the decoders that take them
    (:meth:`~vla_accel_ros.ros.parameters.PolicySettings.for_decoder`)."""
    if not decoders:
        raise ValueError("--decoders names no decoder")
    rows = []
    for decoder in decoders:
        summary = run_sim(replace(opts, policy=opts.policy.for_decoder(decoder), out=str(Path(opts.out) / decoder)),
                          progress=progress)
        rows.append({"decoder": decoder, "success_rate": summary["success_rate"],
                     "inference_latency_ms_p50": summary["inference_latency_ms_p50"],
                     "inference_latency_ms_p99": summary["inference_latency_ms_p99"],
                     "inference_target_passes_mean": summary["inference_target_passes_mean"],
                     "fallback_ticks": summary["fallback_ticks"], "ticks": summary["ticks"]})
    base = rows[0]["inference_latency_ms_p50"] or float("nan")
    for row in rows:
        latency = row["inference_latency_ms_p50"]
        row[f"latency_ratio_vs_{rows[0]['decoder']}"] = latency / base if latency else float("nan")
    result = {"decoders": rows, "baseline": rows[0]["decoder"], "options": opts.to_json()}
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    (Path(opts.out) / "decoders.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
