"""The node's settings in a replay (``vla-accel replay``) and how they reach a node process.

The node's parameters come from, each over the one before: the node's defaults, the settings the
recording stored (decoder, checkpoint, control rate, temperature, kf_fill_check), ``--params-file``
(the node's own ROS 2 parameter YAML) and the explicit flags (``--urdf``, ``--tcp-frame``,
``--controller-joints``, ``--decoder``, ...): :func:`node_settings`. The bag's topics are the ones
these parameters name (:func:`node_topics`). The realtime replay's node gets them in the same order
(:func:`node_arguments`), the flags in a parameter file of their own (:func:`overrides_yaml`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vla_accel_ros.core.params_file import ROS_BUILTIN_PARAMETERS, read_node_parameters
from vla_accel_ros.core.settings import ConfigError, from_params, parameter_specs
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.ros.parameters import NodeConfig, PolicySettings
from vla_accel_ros.ros.processes import parameter_arguments
from vla_accel_ros.rosbag.io import STORAGES, TOPICS, parse_remaps

MODES = ("deterministic", "realtime")
NODE_NAME = "vla_accel_node"  # its section in a --params-file; the node runs in the root namespace


@dataclass(frozen=True)
class ReplayOptions:
    bag: str
    out: str = ""
    mode: str = "deterministic"
    remap: tuple[str, ...] = ()
    summary: str = ""
    # PolicySettings parameters given as flags (decoder, checkpoint), by name: over the recording's
    # and the params file's
    policy: Mapping[str, Any] = field(default_factory=dict)
    control_rate_hz: float = 0.0  # 0 = from the params file, else the recording's, else 20
    instruction: str = ""
    storage: str = "mcap"
    tolerance: float | None = None  # None: the recording's default (compare.default_tolerance)
    timeout_s: float = 600.0
    rate: float = 1.0  # realtime playback speed
    domain_id: int = 0
    params_file: str = ""  # the node's ROS 2 parameter YAML
    urdf: str = ""  # URDF file of the arm
    tcp_frame: str = ""  # URDF frame of the policy's end-effector deltas
    controller_joints: tuple[str, ...] = ()  # joint order of the recorded and written commands
    allow_unmatched_robot: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got '{self.mode}'")
        if self.storage not in STORAGES:
            raise ValueError(f"--storage must be one of {', '.join(STORAGES)}, got '{self.storage}'")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout-s must be > 0, got {self.timeout_s}")
        if not 0.01 <= self.rate <= 100.0:
            raise ValueError(f"--rate must be in [0.01, 100], got {self.rate}")
        if self.tolerance is not None and not self.tolerance >= 0:
            raise ValueError(f"--tolerance must be >= 0, got {self.tolerance}")
        if not 0 <= self.domain_id <= 232:
            raise ValueError(f"--domain-id must be in [0, 232], got {self.domain_id}")
        if self.urdf and not Path(self.urdf).is_file():
            raise ValueError(f"--urdf {self.urdf}: no such file")
        if self.params_file and not Path(self.params_file).is_file():
            raise ValueError(f"--params-file {self.params_file}: no such file")
        if len(set(self.controller_joints)) != len(self.controller_joints) or not all(self.controller_joints):
            raise ValueError(f"--controller-joints must name each joint once, got {list(self.controller_joints)}")
        parse_remaps(self.remap)  # fail early on a malformed remap
        unknown = sorted(set(self.policy) - {spec.name for spec in parameter_specs(PolicySettings)})
        if unknown:
            raise ValueError(f"ReplayOptions.policy: no policy setting(s) {', '.join(unknown)}")


@dataclass(frozen=True)
class NodeSettings:
    """The node's parameters in a replay by where they come from, each over the one before (after
    the node's defaults), and the NodeConfig they make."""

    recording: dict[str, Any]  # the settings the recording stored
    file: dict[str, Any]  # --params-file's for the node
    cli: dict[str, Any]  # the explicit flags'
    config: NodeConfig


def node_settings(opts: ReplayOptions, custom: dict[str, Any]) -> NodeSettings:
    """The parameters of the recording (``custom``), the params file and the command line, merged
    in that order into a NodeConfig; ConfigError (a ValueError) naming the bad parameter."""
    recording: dict[str, Any] = {}
    for key in ("decoder", "checkpoint"):
        if custom.get(key):
            recording[key] = str(custom[key])
    if custom.get("control_rate_hz"):
        recording["control_rate_hz"] = float(custom["control_rate_hz"])
    if "temperature" in custom:  # else (an older bag) the node's default
        recording["temperature"] = float(custom["temperature"])
    if "kf_fill_check" in custom:  # as stored: NodeConfig names it if it is not a bool
        recording["kf_fill_check"] = custom["kf_fill_check"]
    if custom.get("cameras") == 2:  # recorded with the wrist camera: the node takes both
        recording["image_topics"] = [TOPICS["camera"][0], TOPICS["wrist_camera"][0]]
    file: dict[str, Any] = {}
    if opts.params_file:
        file = {name: value for name, value in read_node_parameters(opts.params_file, NODE_NAME).items()
                if name not in ROS_BUILTIN_PARAMETERS and not name.startswith("qos_overrides.")}
    cli: dict[str, Any] = dict(opts.policy)
    if opts.policy.get("checkpoint"):
        cli["checkpoint"] = str(CheckpointRef.parse(opts.policy["checkpoint"]).resolved())
    if opts.control_rate_hz:
        cli["control_rate_hz"] = float(opts.control_rate_hz)
    if opts.instruction:
        cli["instruction"] = opts.instruction
    if opts.urdf:  # over a robot_description parameter too, which the node would take first
        cli.update(urdf_file=str(Path(opts.urdf).resolve()), robot_description="")
    if opts.tcp_frame:
        cli["tcp_frame"] = opts.tcp_frame
    if opts.controller_joints:
        cli["controller_joints"] = list(opts.controller_joints)
    if opts.allow_unmatched_robot:
        cli["allow_unmatched_robot"] = True
    try:
        config = from_params(NodeConfig, {**recording, **file, **cli, "autostart": True})
    except ConfigError as err:
        where = f" (with --params-file {opts.params_file})" if opts.params_file else ""
        raise ConfigError(f"replay settings{where}: {err}") from err
    return NodeSettings(recording, file, cli, config)


def node_config(opts: ReplayOptions, custom: dict[str, Any]) -> NodeConfig:
    """The NodeConfig of :func:`node_settings`."""
    return node_settings(opts, custom).config


def resolve_topic(name: str) -> str:
    """A topic name of the node's parameters as the node resolves it (root namespace)."""
    if name.startswith("~/"):
        return f"/{NODE_NAME}/{name[2:]}"
    return name if name.startswith("/") else f"/{name}"


def node_topics(cfg: NodeConfig) -> dict[str, str]:
    """role -> topic: the inputs and the command topics the node's parameters name ("gripper" only
    with a gripper controller); the others as ``TOPICS``."""
    topics = {role: topic for role, (topic, _) in TOPICS.items()}
    controller = cfg.controller.strip("/")
    commands = {"forward_position": f"{controller}/commands",
                "joint_trajectory": f"{controller}/joint_trajectory"}.get(cfg.output, cfg.joint_command_topic)
    topics.update(camera=resolve_topic(cfg.image_topic), joint_states=resolve_topic(cfg.joint_states_topic),
                  commands=resolve_topic(commands))
    if len(cfg.camera_topics) > 1:  # the image slots in order: the scene camera, then the wrist camera
        topics.update(camera=resolve_topic(cfg.camera_topics[0]), wrist_camera=resolve_topic(cfg.camera_topics[1]))
    else:
        del topics["wrist_camera"]
    gripper = cfg.gripper_controller.strip("/")
    if gripper:
        topics["gripper"] = resolve_topic(f"{gripper}/commands")
    else:
        del topics["gripper"]
    return topics


def node_arguments(settings: NodeSettings, fixed: dict[str, Any], overrides_file: str = "",
                   params_file: str = "") -> list[str]:
    """The node's ``--ros-args``, each over the one before: the recording's settings (``-p``),
    ``--params-file``, then the explicit flags and the replay's own ``fixed`` settings: in
    ``overrides_file`` (written by the caller: -p values apply to every node, so they lose to a
    params file's section for this node) and as ``-p``."""
    explicit = {**settings.cli, **fixed}
    args = ["--ros-args", *parameter_arguments(settings.recording)]
    if params_file:
        args += ["--params-file", params_file]
        if overrides_file:
            args += ["--params-file", overrides_file]
    return args + parameter_arguments(explicit)


def overrides_yaml(settings: NodeSettings, fixed: dict[str, Any]) -> str:
    """The ROS 2 parameter file of the explicit flags and ``fixed``, for the node's own section."""
    values = {name: list(v) if isinstance(v, tuple) else v for name, v in {**settings.cli, **fixed}.items()}
    return yaml.safe_dump({f"/{NODE_NAME}": {"ros__parameters": values}}, sort_keys=False)
