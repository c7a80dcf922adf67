"""What launch/gazebo.launch.py starts, as plain functions (unit-tested without launch, ROS or Gazebo).

The launch brings up gz sim (ros_gz_sim's gz_sim.launch.py) on ``world`` and then:

- robot_state_publisher with arm7.urdf.xacro expanded for Gazebo (ros2_control tags, the
  gz_ros2_control plugin reading config/gazebo_controllers.yaml, the front camera sensor), whose
  ``robot_description`` topic ros_gz_sim's ``create`` spawns from and gz_ros2_control's
  controller manager reads;
- three cubes, the MuJoCo scene's (colours and size from ``vla_accel_ros.sim.scene``);
- once the arm is spawned, the controller_manager spawner for joint_state_broadcaster, then one
  for the arm and gripper forward position controllers;
- ros_gz_bridge's parameter_bridge with config/gazebo_bridge.yaml (/clock and the camera);
- vla_accel_node with ``use_sim_time``, driving those controllers: its controller names, joint
  order and image topic come from the two YAML files, so the node and the simulation cannot
  disagree. Its exit ends the launch, as in vla_accel.launch.py.

Executables, arguments and parameter names are those of ros_gz 1.0.5 (jazzy) / 2.1.1,
controller_manager 4.46.0 (jazzy) / 6.8.0 and robot_state_publisher 3.3.3 (see
docs/gazebo_and_arms.md for the files they were checked against). Importable without launch,
rclpy or xacro (xacro is imported when the description is expanded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vla_accel_ros.core.resources import share_dir
from vla_accel_ros.ros.launch_args import (
    LaunchArgument,
    check_params_file,
    log_level_argument,
    node_options,
    node_overrides,
    parameter_argument,
)
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.sim.scene import CUBE_COLORS, CUBE_HALF_SIZE, TABLE_TOP_Z

XACRO_FILE = "urdf/arm7.urdf.xacro"
CONTROLLERS_FILE = "config/gazebo_controllers.yaml"
BRIDGE_FILE = "config/gazebo_bridge.yaml"
PARAMS_FILE = "config/vla_accel.yaml"
# ros_gz_sim installs its gz_sim.launch.py (configured from gz_sim.launch.py.in) here.
GZ_SIM_LAUNCH = ("ros_gz_sim", "launch/gz_sim.launch.py")
DEFAULT_WORLD = "empty.sdf"  # gz-sim's own; its ground plane at z = 0 is the MuJoCo table top

ROBOT_NAME = "arm7"
ROBOT_DESCRIPTION_TOPIC = "robot_description"
JOINT_STATE_BROADCASTER = "joint_state_broadcaster"
ARM_CONTROLLER = "arm_controller"
GRIPPER_CONTROLLER = "gripper_controller"
# ros2_controllers plugin names (forward_command_plugin.xml, joint_state_plugin.xml).
FORWARD_COMMAND_CONTROLLER = "forward_command_controller/ForwardCommandController"
JOINT_STATE_BROADCASTER_TYPE = "joint_state_broadcaster/JointStateBroadcaster"
IMAGE_TYPE = "sensor_msgs/msg/Image"
CLOCK_TYPE = "rosgraph_msgs/msg/Clock"

CUBE_MASS = 0.05  # kg, as in the MuJoCo scene
# Where the cubes start: inside the MuJoCo task's placement ranges (sim/env.py CUBE_X_RANGE,
# CUBE_Y_RANGE) and at least CUBE_MIN_SEPARATION apart, in front of the arm and the camera.
CUBE_POSITIONS: dict[str, tuple[float, float]] = {"red": (0.45, -0.12), "green": (0.55, 0.0), "blue": (0.45, 0.12)}

GAZEBO_NODE_ARGUMENTS = ("control_rate_hz", "autostart", "checkpoint", "decoder", "temperature", "instruction",
                         "allow_unmatched_robot")


@dataclass(frozen=True)
class GazeboFiles:
    """The package files gazebo.launch.py reads (all installed under share/vla_accel_ros)."""

    xacro: Path
    controllers: Path
    bridge: Path
    params: Path

    def all(self) -> tuple[Path, ...]:
        return (self.xacro, self.controllers, self.bridge, self.params)


def gazebo_files(share: Path | None = None) -> GazeboFiles:
    """The files in ``share`` (default: the package's share directory)."""
    root = share_dir() if share is None else share
    return GazeboFiles(root / XACRO_FILE, root / CONTROLLERS_FILE, root / BRIDGE_FILE, root / PARAMS_FILE)


@dataclass(frozen=True)
class Process:
    """One launch_ros ``Node`` of the Gazebo launch. ``after`` names the process whose exit starts
    it (empty: at once); ``ends_launch`` makes its exit end the launch."""

    package: str
    executable: str
    name: str
    arguments: tuple[str, ...] = ()
    parameters: tuple[Any, ...] = ()
    ros_arguments: tuple[str, ...] = ()
    after: str = ""
    ends_launch: bool = False

    def node_kwargs(self) -> dict[str, Any]:
        return {"package": self.package, "executable": self.executable, "name": self.name,
                "arguments": list(self.arguments), "parameters": list(self.parameters),
                "ros_arguments": list(self.ros_arguments), "output": "screen"}


@dataclass(frozen=True)
class ForwardController:
    """A controller of the controllers file: its plugin type and, for command controllers, joints
    and interface."""

    name: str
    type: str
    joints: tuple[str, ...] = ()
    interface_name: str = ""


def read_controllers(path: Path | str) -> dict[str, ForwardController]:
    """The controllers a ros2_control controllers file declares (``controller_manager: type``),
    with their ``joints`` and ``interface_name``; ValueError naming the file for anything else."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
        manager = data["controller_manager"]["ros__parameters"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise ValueError(f"controllers file {path}: no controller_manager ros__parameters ({err})") from err
    out: dict[str, ForwardController] = {}
    for name, value in manager.items():
        if not isinstance(value, dict) or "type" not in value:
            continue  # update_rate and the manager's other parameters
        params = (data.get(name) or {}).get("ros__parameters") or {}
        out[name] = ForwardController(name, str(value["type"]), tuple(params.get("joints") or ()),
                                      str(params.get("interface_name", "")))
    return out


@dataclass(frozen=True)
class BridgedTopic:
    """One entry of a ros_gz_bridge configuration file."""

    ros_topic_name: str
    gz_topic_name: str
    ros_type_name: str
    gz_type_name: str
    direction: str = "BIDIRECTIONAL"  # ros_gz_bridge's default


def read_bridge(path: Path | str) -> list[BridgedTopic]:
    """The entries of a ros_gz_bridge YAML (a sequence of maps; ``topic_name`` sets both names)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"bridge file {path}: {err}") from err
    if not isinstance(data, list):  # a bad file, as any other: ValueError
        raise ValueError(f"bridge file {path}: the top level must be a YAML sequence")  # noqa: TRY004
    out = []
    for entry in data:
        if not isinstance(entry, dict) or not {"ros_type_name", "gz_type_name"} <= set(entry):
            raise ValueError(f"bridge file {path}: each entry must be a map with ros_type_name and gz_type_name, "
                             f"got {entry!r}")
        both = entry.get("topic_name", "")
        out.append(BridgedTopic(entry.get("ros_topic_name", both), entry.get("gz_topic_name", both),
                                entry["ros_type_name"], entry["gz_type_name"],
                                entry.get("direction", "BIDIRECTIONAL")))
    return out


def bridged_to_ros(path: Path | str, ros_type: str) -> str:
    """The ROS topic that the bridge file fills with ``ros_type`` from Gazebo (ValueError if none)."""
    for topic in read_bridge(path):
        if topic.ros_type_name == ros_type and topic.direction in ("GZ_TO_ROS", "BIDIRECTIONAL"):
            return topic.ros_topic_name
    raise ValueError(f"bridge file {path} bridges no {ros_type} from Gazebo to ROS")


def robot_description(files: GazeboFiles) -> str:
    """arm7.urdf.xacro expanded for Gazebo: ros2_control on gz_ros2_control, the plugin reading
    the controllers file, the camera sensor (ValueError naming the file and the fault)."""
    try:
        import xacro
    except ImportError as err:
        raise ValueError("gazebo.launch.py needs xacro (the ROS distribution's xacro package)") from err
    mappings = {"ros2_control": "true", "gazebo": "true", "controllers_file": str(files.controllers)}
    try:
        return xacro.process_file(str(files.xacro), mappings=mappings).toprettyxml(indent="  ")
    except Exception as err:  # xacro raises its own XacroException, and XML parse errors
        raise ValueError(f"{files.xacro}: {err}") from err


def _box_inertia(mass: float, half: float) -> float:
    return mass * (2 * half) ** 2 / 6.0  # solid cube, about any axis through its centre


def cube_sdf(color: str) -> str:
    """The SDF model of one cube of the MuJoCo scene (``ros_gz_sim create -string``)."""
    r, g, b, a = CUBE_COLORS[color]
    side = 2 * CUBE_HALF_SIZE
    inertia = _box_inertia(CUBE_MASS, CUBE_HALF_SIZE)
    rgba = f"{r} {g} {b} {a}"
    return (f'<?xml version="1.0"?><sdf version="1.9"><model name="cube_{color}"><link name="link">'
            f"<inertial><mass>{CUBE_MASS}</mass><inertia><ixx>{inertia:.6g}</ixx><iyy>{inertia:.6g}</iyy>"
            f"<izz>{inertia:.6g}</izz><ixy>0</ixy><ixz>0</ixz><iyz>0</iyz></inertia></inertial>"
            f"<collision name=\"collision\"><geometry><box><size>{side} {side} {side}</size></box></geometry>"
            f"<surface><friction><ode><mu>1.5</mu><mu2>1.5</mu2></ode></friction></surface></collision>"
            f"<visual name=\"visual\"><geometry><box><size>{side} {side} {side}</size></box></geometry>"
            f"<material><ambient>{rgba}</ambient><diffuse>{rgba}</diffuse></material></visual>"
            f"</link></model></sdf>")


def gazebo_arguments() -> list[LaunchArgument]:
    """The arguments of gazebo.launch.py."""
    files = gazebo_files()
    return [
        LaunchArgument("params_file", str(files.params), "ROS 2 parameter file of vla_accel_node; the Gazebo "
                       "launch sets use_sim_time, autostart, the controllers, their joint order, the image topic "
                       "and the robot_description over it, then the launch arguments below"),
        log_level_argument(),
        LaunchArgument("world", DEFAULT_WORLD, "Gazebo world file (a path, or a world on GZ_SIM_RESOURCE_PATH)"),
        LaunchArgument("gui", "true", "Open the Gazebo GUI; false = server only, rendering headless (EGL)",
                       ("true", "false")),
        *(parameter_argument(NodeConfig, name) for name in GAZEBO_NODE_ARGUMENTS),
    ]


def gz_sim_arguments(given: Mapping[str, str]) -> dict[str, str]:
    """The launch arguments of ros_gz_sim's gz_sim.launch.py: ``gz_args`` (run at once, the world,
    server-only and headless without the GUI) and ``on_exit_shutdown`` (closing Gazebo ends the launch)."""
    world = given.get("world", DEFAULT_WORLD).strip() or DEFAULT_WORLD
    gui = given.get("gui", "true").strip().lower()
    if gui not in ("true", "false"):
        raise ValueError(f"launch argument gui:={given.get('gui')} must be true or false")
    flags = ["-r"] if gui == "true" else ["-r", "-s", "--headless-rendering"]
    return {"gz_args": " ".join([*flags, world]), "on_exit_shutdown": "true"}


def node_parameters(files: GazeboFiles, description: str) -> dict[str, Any]:
    """What the Gazebo launch sets on vla_accel_node over its parameter file: simulated time, start
    at once, the forward position controllers of the controllers file in their joint order, the
    camera topic of the bridge file and the expanded description."""
    controllers = read_controllers(files.controllers)
    for name in (ARM_CONTROLLER, GRIPPER_CONTROLLER):
        if name not in controllers:
            raise ValueError(f"controllers file {files.controllers} declares no '{name}'")
    return {"use_sim_time": True, "autostart": True, "output": "forward_position",
            "controller": ARM_CONTROLLER, "controller_joints": list(controllers[ARM_CONTROLLER].joints),
            "gripper_controller": GRIPPER_CONTROLLER, "image_topic": bridged_to_ros(files.bridge, IMAGE_TYPE),
            "compressed_image": False, "robot_description": description, "urdf_file": "", "tcp_frame": "tcp"}


def _spawner(controllers: tuple[str, ...], files: GazeboFiles, after: str) -> Process:
    return Process("controller_manager", "spawner", f"spawner_{'_'.join(controllers)}",
                   arguments=(*controllers, "--param-file", str(files.controllers)), after=after)


def gazebo_processes(given: Mapping[str, str], files: GazeboFiles | None = None) -> list[Process]:
    """gazebo.launch.py's nodes from its arguments, in start order (ValueError naming a bad one)."""
    files = gazebo_files() if files is None else files
    params_file = check_params_file(given.get("params_file", str(files.params)))
    options = node_options("", given.get("log_level", "info"))
    description = robot_description(files)
    node = {**node_parameters(files, description), **node_overrides(NodeConfig, given, GAZEBO_NODE_ARGUMENTS)}
    spawn_arm = Process("ros_gz_sim", "create", f"spawn_{ROBOT_NAME}",
                        arguments=("-topic", ROBOT_DESCRIPTION_TOPIC, "-name", ROBOT_NAME))
    cubes = [Process("ros_gz_sim", "create", f"spawn_cube_{color}",
                     arguments=("-string", cube_sdf(color), "-name", f"cube_{color}", "-x", f"{x:g}", "-y", f"{y:g}",
                                "-z", f"{TABLE_TOP_Z + CUBE_HALF_SIZE:g}"))
             for color, (x, y) in CUBE_POSITIONS.items()]
    broadcaster = _spawner((JOINT_STATE_BROADCASTER,), files, after=spawn_arm.name)
    return [
        Process("robot_state_publisher", "robot_state_publisher", "robot_state_publisher",
                parameters=({"robot_description": description, "use_sim_time": True},)),
        spawn_arm,
        *cubes,
        broadcaster,
        _spawner((ARM_CONTROLLER, GRIPPER_CONTROLLER), files, after=broadcaster.name),
        Process("ros_gz_bridge", "parameter_bridge", "gz_bridge", parameters=({"config_file": str(files.bridge)},)),
        Process("vla_accel_ros", "vla_accel_node", "vla_accel_node", parameters=(str(params_file), node),
                ros_arguments=tuple(options["ros_arguments"]), ends_launch=True),
    ]

