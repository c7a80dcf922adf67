"""What the launch files do with their arguments, as plain functions (unit-tested without launch).

- A launch argument left at its empty default means "what ``params_file`` says": only the
  arguments the user gives become parameter overrides (:func:`node_overrides`), typed and checked
  against the node's declared parameters, so ``decoder: ar`` in the file is the decoder that runs.
- A missing ``params_file`` ends the launch before any node starts (:func:`check_params_file`).
- An argument the launch file does not take is refused, listing the ones it takes
  (:func:`check_arguments`), when it names a parameter of its nodes or is a near miss of one of its
  arguments: ``kinematic_r_min:=2`` or ``decodr:=ar`` would otherwise be ignored in silence. Other
  launch configurations (those of a launch file that includes this one) are left alone.
- ``namespace`` and ``log_level`` become the node's namespace and ``--log-level`` (:func:`node_options`).
- A node that exits ends the launch; one that exits non-zero (a refusal to start, a crash) makes
  ``ros2 launch`` exit non-zero (:func:`exit_failure`).

Importable without launch, rclpy or torch.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vla_accel_ros.core.settings import ParamSpec, parameter_specs
from vla_accel_ros.ros.parameters import (
    InferenceNodeConfig,
    NodeConfig,
    SimBridgeConfig,
)

LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")
FROM_FILE = ""  # the default of every parameter argument: leave the parameter to params_file
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class LaunchArgument:
    """One DeclareLaunchArgument: its name, default, description and (when closed) choices."""

    name: str
    default: str
    description: str
    choices: tuple[str, ...] = ()


def _spec(config_type: type, name: str) -> ParamSpec:
    specs = {s.name: s for s in parameter_specs(config_type)}
    if name == "use_sim_time":  # declared by rclpy on every node
        return ParamSpec(name=name, kind=bool, default=False, description="Follow /clock (simulators, rosbag "
                         "play --clock)", range=None, choices=None, dynamic=False)
    return specs[name]


def parameter_argument(config_type: type, name: str) -> LaunchArgument:
    """The launch argument of a node parameter: empty by default (the file's value applies), its
    description the parameter's own, its choices the parameter's (plus the empty default)."""
    spec = _spec(config_type, name)
    choices: tuple[str, ...] = ()
    if spec.choices:
        choices = (FROM_FILE, *spec.choices)
    elif spec.kind is bool:
        choices = (FROM_FILE, "true", "false")
    text = f"{spec.description}. Left empty, the value in params_file applies"
    return LaunchArgument(name, FROM_FILE, text, choices)


def namespace_argument() -> LaunchArgument:
    return LaunchArgument("namespace", "", "Namespace of the nodes: their relative topics (joint_states, camera, "
                          "controller commands) resolve in it, so several arms run side by side; empty = root")


def log_level_argument() -> LaunchArgument:
    return LaunchArgument("log_level", "info", "Logging level of the nodes", LOG_LEVELS)


def _typed(spec: ParamSpec, text: str) -> Any:
    word = text.strip()
    if spec.kind is bool:
        if word.lower() in TRUE_WORDS:
            return True
        if word.lower() in FALSE_WORDS:
            return False
        raise ValueError(f"launch argument '{spec.name}:={text}' must be true or false")
    if spec.kind is float or spec.kind is int:
        try:
            value = float(word) if spec.kind is float else int(word)
        except ValueError:
            raise ValueError(f"launch argument '{spec.name}:={text}' "
                             f"must be a{'n integer' if spec.kind is int else ' number'}") from None
        if not math.isfinite(value):
            raise ValueError(f"launch argument '{spec.name}:={text}' must be finite")
        if spec.range is not None and not spec.range[0] <= value <= spec.range[1]:
            raise ValueError(f"launch argument '{spec.name}:={text}' is out of range "
                             f"[{spec.range[0]:g}, {spec.range[1]:g}]")
        return value
    if spec.kind is tuple:
        return [part.strip() for part in word.strip("[]").split(",") if part.strip()]
    if spec.choices and word not in spec.choices:
        raise ValueError(f"launch argument '{spec.name}:={text}': choose one of {', '.join(spec.choices)}")
    return text


def node_overrides(config_type: type, given: Mapping[str, str], names: tuple[str, ...]) -> dict[str, Any]:
    """The parameters the user set by launch argument (``names``, values in ``given``), typed as the
    node declares them; arguments left empty are absent, so the parameter file's values stand.
    Raises ValueError naming a bad value."""
    out: dict[str, Any] = {}
    for name in names:
        text = given.get(name, FROM_FILE)
        if text.strip() == FROM_FILE:
            continue
        out[name] = _typed(_spec(config_type, name), text)
    return out


def check_params_file(path: str) -> Path:
    """The parameter file, which must exist (ValueError naming it otherwise)."""
    file = Path(path).expanduser()
    if not path.strip():
        raise ValueError("launch argument params_file is empty: give a ROS 2 parameter file")
    if not file.is_file():
        raise ValueError(f"params_file '{path}' does not exist (launch argument params_file:=...)")
    return file


def node_options(namespace: str, log_level: str) -> dict[str, Any]:
    """``namespace`` and ``ros_arguments`` for a launch_ros Node."""
    level = log_level.strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"launch argument log_level:={log_level}: choose one of {', '.join(LOG_LEVELS)}")
    return {"namespace": namespace.strip().strip("/"), "ros_arguments": ["--log-level", level]}


def exit_failure(name: str, returncode: int | None) -> str:
    """Why the launch fails when node ``name`` exits with ``returncode``; '' for a clean exit (the
    launch then shuts down with exit status 0)."""
    if returncode in (0, None):
        return ""
    why = "refused to start (see its 'refusing to start' line)" if returncode == 2 else f"exited with {returncode}"
    return f"{name} {why}: ending the launch"


def check_arguments(given: Mapping[str, str], arguments: list[LaunchArgument],
                    config_types: tuple[type, ...]) -> None:
    """ValueError when ``given`` holds an argument that is not among ``arguments`` but names a
    parameter of the nodes (``config_types``) or is a near miss of an argument: the message lists
    the arguments the launch file takes."""
    known = [a.name for a in arguments]
    parameters = {spec.name for config_type in config_types for spec in parameter_specs(config_type)}
    unknown = sorted(name for name in given if name not in known
                     and (name in parameters or difflib.get_close_matches(name, known, n=1, cutoff=0.8)))
    if unknown:
        hints = [f"{name} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, n=1,
                                                                                          cutoff=0.8)) else name
                 for name in unknown]
        raise ValueError(f"unknown launch argument(s) {', '.join(hints)}: this launch file takes "
                         f"{', '.join(known)}; set other parameters in params_file")


# The parameter arguments of each launch file (a launch argument of the same name for each).
VLA_NODE_ARGUMENTS = ("control_rate_hz", "autostart", "checkpoint", "decoder", "temperature", "kf_fill_check",
                      "output", "controller", "image_topic", "joint_states_topic", "urdf_file", "tcp_frame",
                      "use_sim_time", "allow_unmatched_robot", "inference_mode", "instruction", "image_topics",
                      "chunk_execution", "chunk_blend", "chunk_refill_threshold")
INFERENCE_NODE_ARGUMENTS = ("robots", "checkpoint", "unnorm_key", "decoder", "temperature", "kf_fill_check",
                            "urdf_file", "tcp_frame", "allow_unmatched_robot", "device")
SIM_NODE_ARGUMENTS = ("control_rate_hz", "autostart", "checkpoint", "decoder", "temperature", "kf_fill_check",
                      "output", "use_sim_time", "chunk_execution", "chunk_blend", "chunk_refill_threshold")
SIM_BRIDGE_ARGUMENTS = ("seed",)


@dataclass(frozen=True)
class NodeLaunch:
    """Everything a launch_ros ``Node`` action needs for one of the package's nodes."""

    executable: str
    name: str
    namespace: str
    parameters: tuple[Any, ...]  # the parameter file, then the overrides (later wins)
    ros_arguments: tuple[str, ...]

    def node_kwargs(self) -> dict[str, Any]:
        return {"package": "vla_accel_ros", "executable": self.executable, "name": self.name,
                "namespace": self.namespace, "parameters": list(self.parameters),
                "ros_arguments": list(self.ros_arguments), "output": "screen"}


def expand_xacro(path: str) -> str:
    """The URDF XML of a xacro (or plain URDF) file (ValueError naming the file and the fault)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"xacro_file '{path}' does not exist")
    try:
        import xacro
    except ImportError as err:
        raise ValueError("xacro_file needs xacro (pip install xacro, or the ROS distribution's xacro "
                         "package)") from err
    try:
        return xacro.process_file(str(file)).toprettyxml(indent="  ")
    except Exception as err:  # xacro raises its own XacroException, and XML parse errors
        raise ValueError(f"xacro_file '{path}': {err}") from err


def _default_params_file(name: str) -> str:
    from vla_accel_ros.core.resources import share_dir

    return str(share_dir() / "config" / name)


def vla_accel_arguments() -> list[LaunchArgument]:
    """The arguments of vla_accel.launch.py."""
    return [
        LaunchArgument("params_file", _default_params_file("vla_accel.yaml"), "ROS 2 parameter file of "
                       "vla_accel_node (see config/vla_accel.yaml for every parameter); its values stand unless a "
                       "launch argument below is given"),
        namespace_argument(),
        log_level_argument(),
        LaunchArgument("xacro_file", "", "URDF or xacro file, expanded by xacro into the robot_description "
                       "parameter; empty = not used"),
        *(parameter_argument(NodeConfig, name) for name in VLA_NODE_ARGUMENTS),
    ]


def vla_accel_nodes(given: Mapping[str, str]) -> list[NodeLaunch]:
    """vla_accel.launch.py's node from its arguments (ValueError naming a bad one)."""
    check_arguments(given, vla_accel_arguments(), (NodeConfig,))
    params_file = check_params_file(given.get("params_file", ""))
    overrides = node_overrides(NodeConfig, given, VLA_NODE_ARGUMENTS)
    if given.get("xacro_file", "").strip():
        overrides["robot_description"] = expand_xacro(given["xacro_file"])
    options = node_options(given.get("namespace", ""), given.get("log_level", "info"))
    return [NodeLaunch("vla_accel_node", "vla_accel_node", options["namespace"], (str(params_file), overrides),
                       tuple(options["ros_arguments"]))]


def sim_arguments() -> list[LaunchArgument]:
    """The arguments of sim.launch.py."""
    return [
        LaunchArgument("params_file", _default_params_file("sim.yaml"), "ROS 2 parameter file with sections for "
                       "sim_node and vla_accel_node; its values stand unless a launch argument below is given"),
        namespace_argument(),
        log_level_argument(),
        *(parameter_argument(NodeConfig, name) for name in SIM_NODE_ARGUMENTS),
        *(parameter_argument(SimBridgeConfig, name) for name in SIM_BRIDGE_ARGUMENTS),
    ]


def sim_nodes(given: Mapping[str, str]) -> list[NodeLaunch]:
    """sim.launch.py's nodes: the MuJoCo bridge and vla_accel_node, in one namespace."""
    check_arguments(given, sim_arguments(), (NodeConfig, SimBridgeConfig))
    params_file = str(check_params_file(given.get("params_file", "")))
    options = node_options(given.get("namespace", ""), given.get("log_level", "info"))
    bridge = node_overrides(SimBridgeConfig, given, SIM_BRIDGE_ARGUMENTS)
    node = node_overrides(NodeConfig, given, SIM_NODE_ARGUMENTS)
    args = tuple(options["ros_arguments"])
    return [NodeLaunch("sim_node", "sim_node", options["namespace"], (params_file, bridge), args),
            NodeLaunch("vla_accel_node", "vla_accel_node", options["namespace"], (params_file, node), args)]


def inference_arguments() -> list[LaunchArgument]:
    """The arguments of inference.launch.py (the GPU host)."""
    return [
        LaunchArgument("params_file", _default_params_file("inference.yaml"), "ROS 2 parameter file of "
                       "vla_inference_node (see config/inference.yaml); its values stand unless a launch argument "
                       "below is given"),
        namespace_argument(),
        log_level_argument(),
        *(parameter_argument(InferenceNodeConfig, name) for name in INFERENCE_NODE_ARGUMENTS),
    ]


def inference_nodes(given: Mapping[str, str]) -> list[NodeLaunch]:
    """inference.launch.py's node: the policy, serving the robots in ``robots`` (a comma list)."""
    check_arguments(given, inference_arguments(), (InferenceNodeConfig,))
    params_file = check_params_file(given.get("params_file", ""))
    overrides = node_overrides(InferenceNodeConfig, given, INFERENCE_NODE_ARGUMENTS)
    options = node_options(given.get("namespace", ""), given.get("log_level", "info"))
    return [NodeLaunch("vla_inference_node", "vla_inference_node", options["namespace"],
                       (str(params_file), overrides), tuple(options["ros_arguments"]))]
