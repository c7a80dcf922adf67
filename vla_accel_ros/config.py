"""Settings of the VLA node and the sim bridge: frozen dataclasses, one mapping to/from ROS
parameters and YAML, validation with messages that name the parameter.

Every field carries its ROS documentation in ``metadata``: a ``description`` and either a numeric
``range`` (lo, hi) or a set of ``choices``. ``node.py`` and ``sim/sim_node.py`` declare their
parameters from :func:`parameter_specs`, so the ROS interface, the YAML files and the validation
cannot drift apart. Importable without rclpy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import yaml

from vla_accel_ros.sampling import DEFAULT_TEMPERATURE, MAX_TEMPERATURE

OUTPUT_FORMATS = ("forward_position", "joint_trajectory", "joint_state")
EXECUTORS = ("single", "multi")
INFERENCE_MODES = ("thread", "process")


class ConfigError(ValueError):
    """A setting is missing, of the wrong type or out of range; the message names it."""


def _p(default: Any, description: str, *, range: tuple[float, float] | None = None,
       choices: tuple[str, ...] | None = None, dynamic: bool = False) -> Any:
    """A dataclass field documented for ROS: description, numeric range or choices."""
    meta = {"description": description, "range": range, "choices": choices, "dynamic": dynamic}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ParamSpec:
    """What a node needs to declare one parameter."""

    name: str
    kind: type  # bool, int, float, str or tuple (string array)
    default: Any
    description: str
    range: tuple[float, float] | None
    choices: tuple[str, ...] | None
    dynamic: bool


def _check_fields(cfg: Any) -> None:
    """Type and range checks shared by every config class (called from ``__post_init__``)."""
    hints = get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        kind = _kind(hints[f.name])
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"parameter '{f.name}' must be a number, got {value!r}")
            object.__setattr__(cfg, f.name, float(value))
            if not math.isfinite(value):
                raise ConfigError(f"parameter '{f.name}' must be finite, got {value!r}")
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"parameter '{f.name}' must be an integer, got {value!r}")
        elif kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"parameter '{f.name}' must be true or false, got {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                raise ConfigError(f"parameter '{f.name}' must be a string, got {value!r}")
        else:
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"parameter '{f.name}' must be a list of strings, got {value!r}")
            object.__setattr__(cfg, f.name, tuple(value))
        lo_hi = f.metadata.get("range")
        if lo_hi is not None and not (lo_hi[0] <= getattr(cfg, f.name) <= lo_hi[1]):
            raise ConfigError(f"parameter '{f.name}' = {value!r} is out of range [{lo_hi[0]}, {lo_hi[1]}]: "
                              f"{f.metadata['description']}")
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"parameter '{f.name}' = {value!r} is not one of {', '.join(choices)}")


def _kind(hint: Any) -> type:
    return tuple if getattr(hint, "__origin__", None) is tuple else hint


@dataclass(frozen=True)
class NodeConfig:
    """Parameters of ``vla_accel_node`` (see config/vla_accel.yaml for a documented example)."""

    control_rate_hz: float = _p(20.0, "Control loop rate; one joint command is published per tick", range=(1.0, 500.0))
    output: str = _p("forward_position", "Command format: forward_position (Float64MultiArray on "
                     "/<controller>/commands), joint_trajectory (/<controller>/joint_trajectory) or "
                     "joint_state (sensor_msgs/JointState on /joint_command)", choices=OUTPUT_FORMATS)
    controller: str = _p("arm_controller", "ros2_control controller name of the arm (topic prefix)")
    controller_joints: tuple[str, ...] = _p((), "Joint order of the arm controller (its 'joints' parameter); "
                                             "empty = the URDF arm order")
    gripper_controller: str = _p("gripper_controller", "Controller for the fingers (Float64MultiArray on "
                                 "/<gripper_controller>/commands); empty = do not publish a gripper command")
    joint_command_topic: str = _p("/joint_command", "Topic of the joint_state output format")
    image_topic: str = _p("/camera/image_raw", "Camera topic (sensor_msgs/Image, or CompressedImage when "
                          "compressed_image is true)")
    compressed_image: bool = _p(False, "Subscribe to sensor_msgs/CompressedImage instead of Image")
    joint_states_topic: str = _p("/joint_states", "sensor_msgs/JointState topic (names in any order)")
    instruction: str = _p("", "Task instruction for the policy (also settable on ~/instruction)", dynamic=True)
    robot_description: str = _p("", "URDF XML; empty = /robot_description topic, then urdf_file")
    robot_description_timeout_s: float = _p(2.0, "How long to wait for /robot_description when neither "
                                            "robot_description nor urdf_file is set", range=(0.0, 60.0))
    urdf_file: str = _p("", "URDF file; empty = the package's urdf/arm7.urdf (after the topic)")
    tcp_frame: str = _p("tcp", "URDF frame the policy's end-effector deltas refer to")
    checkpoint: str = _p("", "Policy checkpoint directory; empty = the package's checkpoints/default")
    decoder: str = _p("kerv", "Action decoder (ar, speculative, kerv, world_aware, ...)")
    temperature: float = _p(DEFAULT_TEMPERATURE, "Action-token sampling temperature, 0 = greedy (every decoder "
                            "samples the same way; see README, The policy)", range=(0.0, MAX_TEMPERATURE))
    vision_reuse: bool = _p(False, "Re-encode only the image patches that changed since the frame that produced "
                            "their cached encoding (incremental vision); false = encode every patch of every frame")
    vision_threshold: float = _p(8.0, "Incremental vision: mean |pixel change| (0..255) that makes a patch dynamic",
                                 range=(0.0, 255.0))
    vision_refresh_steps: int = _p(20, "Incremental vision: re-encode every patch at least every N frames",
                                   range=(1, 100000))
    vision_max_drift: float = _p(2.0, "Incremental vision: mean sub-threshold change of the cached patches that "
                                 "forces a full refresh", range=(0.0, 255.0))
    vision_reuse_kv: bool = _p(False, "Incremental vision also reuses the global-layer and decoder keys/values of "
                               "unchanged prefix tokens (faster prefill, approximate; needs vision_reuse)")
    inference: bool = _p(True, "Run the policy; false = bring-up mode that only tracks and holds")
    image_size: int = _p(0, "Model input size in pixels; 0 = from the checkpoint", range=(0, 2048))
    camera_timeout_s: float = _p(0.5, "Watchdog: hold the arm when the newest image is older", range=(0.001, 60.0))
    joint_state_timeout_s: float = _p(0.25, "Watchdog: hold the arm when the newest joint state is older",
                                      range=(0.001, 60.0))
    action_timeout_s: float = _p(0.5, "Drop a policy action whose observation is older than this at a tick",
                                 range=(0.0, 60.0))
    action_dt_s: float = _p(0.05, "Duration of one policy action step (the policy's training control period)",
                            range=(0.001, 1.0))
    deadline_tolerance: float = _p(0.5, "A tick later than this fraction of the period is a deadline miss",
                                   range=(0.0, 10.0))
    gripper_initial: float = _p(1.0, "Gripper command before the first action (1 = open, 0 = closed)",
                                range=(0.0, 1.0))
    autostart: bool = _p(False, "Start enabled; otherwise the arm holds until ~/enable is called with true")
    executor: str = _p("single", "single: SingleThreadedExecutor + inference thread; multi: "
                       "MultiThreadedExecutor + inference thread", choices=EXECUTORS)
    switch_interval_s: float = _p(0.001, "Python thread switch interval (sys.setswitchinterval): smaller lets "
                                  "the control timer preempt inference sooner", range=(1e-5, 0.1))
    torch_threads: int = _p(1, "torch intra-op threads of the inference worker", range=(1, 256))
    inference_mode: str = _p("process", "Where the policy runs: thread (beside the control timer, sharing the "
                             "Python interpreter) or process (a child process fed through shared memory; its "
                             "Python never delays a tick)", choices=INFERENCE_MODES)
    realtime_priority: int = _p(20, "SCHED_FIFO priority (1-98) of the thread that spins the executor and so runs "
                                "the control timer; 0 = normal scheduling. Other busy processes otherwise delay "
                                "ticks by a scheduler slice (3-5 ms). Needs root, CAP_SYS_NICE or an rtprio limit; "
                                "when refused the node warns and runs with normal scheduling", range=(0, 98))
    inference_restarts: int = _p(3, "process mode: how often a dead inference process is restarted (the arm "
                                 "holds meanwhile) before the node stays in hold and reports it", range=(0, 1000))
    stats_rate_hz: float = _p(1.0, "Rate of /diagnostics and ~/stats", range=(0.05, 50.0))
    stats_file: str = _p("", "If set, write the run's statistics and tick log (JSON) here at shutdown")

    def __post_init__(self) -> None:
        _check_fields(self)
        period = 1.0 / self.control_rate_hz
        for name in ("camera_timeout_s", "joint_state_timeout_s"):
            if getattr(self, name) <= period:
                raise ConfigError(f"parameter '{name}' = {getattr(self, name)} must exceed one control period "
                                  f"({period:.4f} s at control_rate_hz={self.control_rate_hz}), else every tick holds")
        if self.output != "joint_state" and not self.controller.strip("/"):
            raise ConfigError(f"parameter 'controller' must name a controller for output '{self.output}'")
        if len(set(self.controller_joints)) != len(self.controller_joints):
            raise ConfigError(f"parameter 'controller_joints' has duplicates: {list(self.controller_joints)}")
        if not self.decoder.strip():
            raise ConfigError("parameter 'decoder' must name a decoder")

    @property
    def period_s(self) -> float:
        return 1.0 / self.control_rate_hz

    def vision_config(self) -> "VisionReuseConfig | None":
        """The incremental-vision settings, None when ``vision_reuse`` is off."""
        from vla_accel_ros.vision_reuse import VisionReuseConfig

        if not self.vision_reuse:
            return None
        return VisionReuseConfig(self.vision_threshold, self.vision_refresh_steps, self.vision_max_drift,
                                 reuse_kv=self.vision_reuse_kv)

    def controller_config(self) -> "ControllerConfig":
        return ControllerConfig(
            period_s=self.period_s,
            camera_timeout_s=self.camera_timeout_s,
            joint_state_timeout_s=self.joint_state_timeout_s,
            action_timeout_s=self.action_timeout_s,
            action_dt_s=self.action_dt_s,
            deadline_tolerance=self.deadline_tolerance,
            gripper_initial=self.gripper_initial,
        )


@dataclass(frozen=True)
class ControllerConfig:
    """The ROS-free control core's settings (derived from :class:`NodeConfig`)."""

    period_s: float = _p(0.05, "Control period", range=(0.001, 1.0))
    camera_timeout_s: float = _p(0.5, "Image watchdog", range=(0.001, 60.0))
    joint_state_timeout_s: float = _p(0.25, "Joint-state watchdog", range=(0.001, 60.0))
    action_timeout_s: float = _p(0.5, "Maximum observation age of a usable action", range=(0.0, 60.0))
    action_dt_s: float = _p(0.05, "Duration of one policy action step", range=(0.001, 1.0))
    deadline_tolerance: float = _p(0.5, "Late-tick threshold as a fraction of the period", range=(0.0, 10.0))
    gripper_initial: float = _p(1.0, "Gripper command before the first action", range=(0.0, 1.0))
    jitter_window: int = _p(4096, "Ticks kept for the jitter percentiles", range=(16, 1_000_000))

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True)
class SimBridgeConfig:
    """Parameters of ``sim_node`` (the MuJoCo bridge)."""

    joint_state_rate_hz: float = _p(100.0, "Physics stepping and /joint_states rate", range=(10.0, 1000.0))
    camera_rate_hz: float = _p(20.0, "Camera image rate (/camera/image_raw)", range=(1.0, 120.0))
    image_size: int = _p(128, "Rendered image size in pixels (square)", range=(16, 1024))
    real_time_factor: float = _p(1.0, "Sim seconds per wall second; 0 = as fast as possible (lock-step via "
                                 "/clock)", range=(0.0, 100.0))
    seed: int = _p(0, "Seed of the first episode", range=(0, 2**31 - 1))
    color: str = _p("", "Target cube colour of the first episode; empty = chosen by the seed")
    start_episode: bool = _p(True, "Start an episode at start-up (otherwise wait for ~/reset)")
    episode_duration_s: float = _p(6.0, "Episode time limit in sim seconds", range=(0.1, 3600.0))
    success_hold_s: float = _p(0.15, "How long the task must stay solved before the episode ends",
                               range=(0.0, 60.0))
    instruction_topic: str = _p("/vla_accel_node/instruction", "Where the episode's instruction is published")
    controller: str = _p("arm_controller", "Arm controller name (listens on /<controller>/commands and "
                         "/<controller>/joint_trajectory)")
    controller_joints: tuple[str, ...] = _p((), "Joint order of /<controller>/commands; empty = URDF arm order")
    gripper_controller: str = _p("gripper_controller", "Gripper controller name (/<gripper_controller>/commands)")
    joint_command_topic: str = _p("/joint_command", "JointState command topic")
    wrist_camera: bool = _p(False, "Render from the wrist camera instead of the scene camera")

    def __post_init__(self) -> None:
        _check_fields(self)

    @property
    def physics_dt(self) -> float:
        return 1.0 / self.joint_state_rate_hz


C = TypeVar("C")


def parameter_specs(cls: type) -> list[ParamSpec]:
    """One :class:`ParamSpec` per field of a config dataclass, in declaration order."""
    hints = get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        specs.append(ParamSpec(f.name, _kind(hints[f.name]), default, f.metadata["description"],
                               f.metadata.get("range"), f.metadata.get("choices"), f.metadata.get("dynamic", False)))
    return specs


def from_params(cls: type[C], params: Mapping[str, Any]) -> C:
    """Build a config from a ``{name: value}`` mapping (ROS parameters or YAML); unknown names are errors."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(params) - names)
    if unknown:
        raise ConfigError(f"unknown parameter(s) for {cls.__name__}: {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(names))}")
    values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items()}
    return cls(**values)


def to_params(cfg: Any) -> dict[str, Any]:
    """The config as plain ROS/YAML values (string arrays as lists)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


def load_yaml_params(path: str | Path, node_name: str) -> dict[str, Any]:
    """Parameters of ``node_name`` from a ros2 parameter file (``node: {ros__parameters: ...}``,
    ``/**`` applies to every node) or from a flat mapping."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read parameter file {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"parameter file {path} must hold a mapping, got {type(data).__name__}")
    sections = [v for k, v in data.items() if isinstance(v, dict) and "ros__parameters" in v
                and k.strip("/") in ("**", node_name)]
    if not sections and any(isinstance(v, dict) and "ros__parameters" in v for v in data.values()):
        return {}
    if not sections:
        return dict(data)
    merged: dict[str, Any] = {}
    for section in sections:
        merged.update(section["ros__parameters"] or {})
    return merged


def dump_yaml_params(cfg: Any, node_name: str) -> str:
    """A ros2 parameter file for one node holding every setting of ``cfg``."""
    return yaml.safe_dump({node_name: {"ros__parameters": to_params(cfg)}}, sort_keys=False)
