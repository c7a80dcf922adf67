"""The Gazebo bring-up, checked without Gazebo: urdf/arm7.urdf.xacro expands (PyPI xacro) to
arm7.urdf's kinematics with and without its ros2_control and Gazebo tags, and Pinocchio and MuJoCo
load every expansion; its camera is the MuJoCo scene's front camera; launch/gazebo.launch.py's
plain functions (vla_accel_ros/ros/gazebo_launch.py) start what the controllers and bridge files
name, in order; every file they read exists and is installed; the bridge carries the topics the
node subscribes to.

The names of the other projects (plugin types, executables, parameters, topics) are pinned here
as constants with the public sources they were read from; what runs only inside Gazebo (the
plugins loading, the camera rendering, the controllers moving the arm) is not tested here."""

from __future__ import annotations

import ast
import importlib.util
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import mujoco
import numpy as np
import pinocchio as pin
import pytest

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.params_file import read_node_parameters
from vla_accel_ros.core.resources import default_checkpoint, default_urdf, share_dir
from vla_accel_ros.core.robot_record import read_robot_record
from vla_accel_ros.core.settings import from_params
from vla_accel_ros.ros import gazebo_launch
from vla_accel_ros.ros.gazebo_launch import (
    ARM_CONTROLLER,
    GRIPPER_CONTROLLER,
    JOINT_STATE_BROADCASTER,
    bridged_to_ros,
    cube_sdf,
    gazebo_arguments,
    gazebo_files,
    gazebo_processes,
    gz_sim_arguments,
    read_bridge,
    read_controllers,
    robot_description,
)
from vla_accel_ros.ros.launch_args import expand_xacro, vla_accel_nodes
from vla_accel_ros.ros.parameters import NodeConfig, SimBridgeConfig
from vla_accel_ros.sim.env import (
    CUBE_MIN_SEPARATION,
    CUBE_X_RANGE,
    CUBE_Y_RANGE,
    Q_HOME,
)
from vla_accel_ros.sim.scene import (
    CUBE_COLORS,
    CUBE_HALF_SIZE,
    FRONT_CAMERA_FOVY,
    FRONT_CAMERA_POS,
    FRONT_CAMERA_TARGET,
    TABLE_TOP_Z,
    front_camera_coordinates,
)

xacro = pytest.importorskip("xacro")

ROOT = Path(__file__).resolve().parents[2]
XACRO = ROOT / "urdf" / "arm7.urdf.xacro"
GAZEBO_MAPPINGS = {"ros2_control": "true", "gazebo": "true", "controllers_file": "/opt/controllers.yaml"}
VARIANTS = {"plain": {}, "ros2_control": {"ros2_control": "true"}, "gazebo": GAZEBO_MAPPINGS,
            "mock_hardware": {"ros2_control": "true", "ros2_control_hardware": "mock_components/GenericSystem"}}

# ros-controls/ros2_controllers jazzy 4.42.1 (ed360c97d6e9), kilted 5.17.0, master 6.9.0 (94e74de35f9d):
# forward_command_controller/forward_command_plugin.xml, joint_state_broadcaster/joint_state_plugin.xml;
# the forward command controller's parameters (forward_command_controller_parameters.yaml).
CONTROLLER_TYPES = {"forward_command_controller/ForwardCommandController": {"joints", "interface_name"},
                    "joint_state_broadcaster/JointStateBroadcaster": set()}
# ros-controls/gz_ros2_control jazzy 1.2.7 (fa9ced4713b6), rolling 2.0.1 (e19b0eff2618):
# gz_ros2_control/gz_hardware_plugins.xml, gz_ros2_control_demos/urdf/test_cart_position.xacro.urdf.
GZ_HARDWARE_PLUGIN = "gz_ros2_control/GazeboSimSystem"
GZ_SYSTEM_PLUGIN = ("gz_ros2_control-system", "gz_ros2_control::GazeboSimROS2ControlPlugin")
# gazebosim/gz-sim gz-sim8 8.14.0 (b81e26dab4ac): examples/worlds/camera_sensor.sdf.
GZ_SENSORS_SYSTEM = ("gz-sim-sensors-system", "gz::sim::systems::Sensors")
# gazebosim/ros_gz jazzy 1.0.5 (739cb42a5846), ros2 2.1.1 (a4d00a90a1a5): ros_gz_bridge/src/bridge_config.cpp
# (keys, directions) and ros_gz_bridge/ros_gz_bridge/mappings.py (type pairs).
BRIDGE_KEYS = {"topic_name", "ros_topic_name", "gz_topic_name", "ros_type_name", "gz_type_name", "direction",
               "publisher_queue", "subscriber_queue", "lazy"}
BRIDGE_DIRECTIONS = {"BIDIRECTIONAL", "GZ_TO_ROS", "ROS_TO_GZ"}
BRIDGE_TYPES = {"rosgraph_msgs/msg/Clock": "gz.msgs.Clock", "sensor_msgs/msg/Image": "gz.msgs.Image",
                "sensor_msgs/msg/CameraInfo": "gz.msgs.CameraInfo"}
# Executables and their packages: ros_gz_sim create (src/create.cpp flags -topic -string -name -x -y -z),
# ros_gz_bridge parameter_bridge (CMakeLists.txt, its config_file parameter in src/ros_gz_bridge.cpp),
# controller_manager spawner (ros-controls/ros2_control jazzy 4.46.0 (9ffbf97fd679), master 6.8.0:
# controller_manager/setup.cfg, spawner.py's controller_names and --param-file), robot_state_publisher
# (ros/robot_state_publisher rolling 3.3.3 (e0f77e62457a): its robot_description parameter and topic).
EXECUTABLES = {("ros_gz_sim", "create"), ("ros_gz_bridge", "parameter_bridge"), ("controller_manager", "spawner"),
               ("robot_state_publisher", "robot_state_publisher"), ("vla_accel_ros", "vla_accel_node")}
CREATE_FLAGS = {"-topic", "-string", "-name", "-x", "-y", "-z"}


def expand(**mappings: str) -> str:
    return xacro.process_file(str(XACRO), mappings=dict(mappings)).toprettyxml(indent="  ")


def defaults() -> dict[str, str]:
    return {a.name: a.default for a in gazebo_arguments()}


def _floats(text: str | None, n: int = 3) -> tuple[float, ...]:
    return tuple(float(v) for v in (text or " ".join(["0"] * n)).split())


def joint_table(xml: str) -> dict[str, dict[str, object]]:
    """Every URDF joint: type, links, origin, axis, limits and dynamics, as numbers."""
    out = {}
    for joint in ET.fromstring(xml).findall("joint"):
        origin, axis, limit, dyn = (joint.find(t) for t in ("origin", "axis", "limit", "dynamics"))
        out[joint.get("name")] = {
            "type": joint.get("type"), "parent": joint.find("parent").get("link"),
            "child": joint.find("child").get("link"),
            "xyz": _floats(origin.get("xyz") if origin is not None else None),
            "rpy": _floats(origin.get("rpy") if origin is not None else None),
            "axis": _floats(axis.get("xyz")) if axis is not None else None,
            "limit": {k: float(v) for k, v in limit.attrib.items()} if limit is not None else None,
            "dynamics": {k: float(v) for k, v in dyn.attrib.items()} if dyn is not None else None,
        }
    return out


def link_names(xml: str) -> list[str]:
    return [link.get("name") for link in ET.fromstring(xml).findall("link")]


# --- the xacro ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_xacro_expands_to_the_urdfs_joints_limits_and_forward_kinematics(variant):
    xml = expand(**VARIANTS[variant])
    reference = default_urdf().read_text()
    assert joint_table(xml) == joint_table(reference)
    assert link_names(xml) == link_names(reference)
    ours, theirs = ArmKinematics(xml), ArmKinematics(default_urdf())
    assert ours.joint_names == theirs.joint_names and ours.gripper_joint_names == theirs.gripper_joint_names
    for field in ("lower", "upper", "velocity", "effort"):
        assert np.array_equal(getattr(ours.limits, field), getattr(theirs.limits, field)), field
    rng = np.random.default_rng(7)
    for _ in range(25):
        q = rng.uniform(theirs.limits.lower, theirs.limits.upper)
        a, b = ours.fk(q), theirs.fk(q)
        assert np.allclose(a.position, b.position, atol=1e-12) and np.allclose(a.rotation, b.rotation, atol=1e-12)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pinocchio_and_mujoco_load_every_expansion(variant):
    """MuJoCo compiles the expanded URDF as it is: it skips the <ros2_control> and <gazebo>
    elements, so nothing is stripped. Its forward kinematics of the TCP body is Pinocchio's."""
    xml = expand(**VARIANTS[variant])
    model = pin.buildModelFromXML(xml)
    assert model.nq == 9 and [n for n in model.names][1:] == [*(f"joint{i}" for i in range(1, 8)),
                                                            "finger_joint1", "finger_joint2"]
    mj = mujoco.MjModel.from_xml_string(xml)
    assert [mj.joint(i).name for i in range(mj.njnt)] == list(model.names)[1:]
    kin, data = ArmKinematics(xml), mujoco.MjData(mj)
    q = np.asarray(Q_HOME)
    for name, value in zip(kin.joint_names, q):
        data.qpos[mj.jnt_qposadr[mj.joint(name).id]] = value
    mujoco.mj_kinematics(mj, data)
    tcp = mj.body("tcp").id
    assert np.allclose(data.xpos[tcp], kin.fk(q).position, atol=1e-9)
    assert np.allclose(data.xmat[tcp].reshape(3, 3), kin.fk(q).rotation, atol=1e-9)


def test_the_tags_are_there_only_when_asked_for():
    plain = ET.fromstring(expand())
    assert plain.find("ros2_control") is None and plain.find("gazebo") is None
    assert plain.find("mujoco") is not None  # MuJoCo's block, as in arm7.urdf
    control = ET.fromstring(expand(ros2_control="true"))
    assert control.find("ros2_control") is not None and control.find("gazebo") is None
    camera_only = ET.fromstring(expand(gazebo="true"))  # a camera without ros2_control: no control plugin
    plugins = [p.get("name") for p in camera_only.iter("plugin") if p.get("name")]
    assert plugins == [GZ_SENSORS_SYSTEM[1]]
    no_sensors = ET.fromstring(expand(**GAZEBO_MAPPINGS, gz_sensors_system="false"))
    assert [p.get("filename") for p in no_sensors.iter("plugin") if p.get("filename")] == [GZ_SYSTEM_PLUGIN[0]]


def test_ros2_control_gives_every_joint_a_position_command_and_position_velocity_states():
    root = ET.fromstring(expand(**GAZEBO_MAPPINGS))
    (system,) = root.findall("ros2_control")
    assert system.get("type") == "system"
    assert system.findtext("hardware/plugin").strip() == GZ_HARDWARE_PLUGIN
    kin = ArmKinematics(default_urdf())
    names = [*kin.joint_names, *kin.gripper_joint_names]
    joints = {j.get("name"): j for j in system.findall("joint")}
    assert list(joints) == names
    lower = [*kin.limits.lower, *kin.gripper_limits.lower]
    upper = [*kin.limits.upper, *kin.gripper_limits.upper]
    start = [*Q_HOME, *kin.gripper_limits.upper]  # the task's home pose, fingers open
    for name, lo, hi, q0 in zip(names, lower, upper, start):
        joint = joints[name]
        assert [c.get("name") for c in joint.findall("command_interface")] == ["position"], name
        assert [s.get("name") for s in joint.findall("state_interface")] == ["position", "velocity"], name
        params = {p.get("name"): float(p.text) for p in joint.find("command_interface").findall("param")}
        assert params == {"min": lo, "max": hi}, name
        initial = float(joint.find("state_interface/param[@name='initial_value']").text)
        assert initial == pytest.approx(q0) and lo <= initial <= hi, name
    (plugin,) = [p for p in root.iter("plugin") if p.get("filename") == GZ_SYSTEM_PLUGIN[0]]
    assert plugin.get("name") == GZ_SYSTEM_PLUGIN[1]
    assert plugin.findtext("parameters") == GAZEBO_MAPPINGS["controllers_file"]
    mock = ET.fromstring(expand(**VARIANTS["mock_hardware"]))
    assert mock.findtext("ros2_control/hardware/plugin").strip() == "mock_components/GenericSystem"


def test_the_controllers_file_default_is_the_installed_one():
    """Without controllers_file the plugin reads $(find vla_accel_ros)/config/gazebo_controllers.yaml
    (resolved through the ament index, so only in a ROS install: here the path is checked)."""
    text = XACRO.read_text()
    assert f'default="$(find vla_accel_ros)/{gazebo_launch.CONTROLLERS_FILE}"' in text
    assert (share_dir() / gazebo_launch.CONTROLLERS_FILE).is_file()


def _rpy_matrix(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """SDF/URDF fixed-axis roll-pitch-yaw: R = Rz(yaw) Ry(pitch) Rx(roll)."""
    cr, sr, cp, sp, cy, sy = (math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch),
                              math.cos(yaw), math.sin(yaw))
    rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
    ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
    rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
    return rz @ ry @ rx


def test_the_camera_sensor_is_the_mujoco_scenes_front_camera():
    root = ET.fromstring(expand(**GAZEBO_MAPPINGS))
    (holder,) = [g for g in root.findall("gazebo") if g.find("sensor") is not None]
    sensor = holder.find("sensor")
    assert sensor.get("type") == "camera"
    # link0 is fixed at the world origin, so a pose in link0 is a pose in the world.
    assert holder.get("reference") == "link0"
    world = joint_table(expand())["world_joint"]
    assert world["child"] == "link0" and world["xyz"] == (0, 0, 0) and world["rpy"] == (0, 0, 0)
    x, y, z, roll, pitch, yaw = _floats(sensor.findtext("pose"), 6)
    assert np.allclose([x, y, z], FRONT_CAMERA_POS)
    rot = _rpy_matrix(roll, pitch, yaw)  # a Gazebo camera looks along +x, +z up, +y to the image's left
    forward = (FRONT_CAMERA_TARGET - FRONT_CAMERA_POS) / np.linalg.norm(FRONT_CAMERA_TARGET - FRONT_CAMERA_POS)
    assert np.allclose(rot[:, 0], forward, atol=1e-12)
    assert rot[2, 2] > 0  # upright: no roll
    # Image axes: a point right of / above the target lands on the same side of both images.
    for offset in ([0, 0.1, 0], [0, -0.1, 0], [0, 0, 0.1], [0.1, 0.1, -0.05]):
        point = FRONT_CAMERA_TARGET + np.array(offset)
        rel = point - FRONT_CAMERA_POS
        columns, rows = front_camera_coordinates(point)
        assert np.sign(columns) == np.sign(rel @ -rot[:, 1]) or abs(columns) < 1e-12
        assert np.sign(rows) == np.sign(rel @ -rot[:, 2]) or abs(rows) < 1e-12
    camera = sensor.find("camera")
    assert float(camera.findtext("horizontal_fov")) == pytest.approx(math.radians(FRONT_CAMERA_FOVY))
    size = read_robot_record(default_checkpoint()).image_size
    assert int(camera.findtext("image/width")) == int(camera.findtext("image/height")) == size == \
        SimBridgeConfig().image_size  # square, as the sim renders and the checkpoint expects
    assert camera.findtext("image/format") == "R8G8B8"  # rgb8 on the ROS side
    assert float(sensor.findtext("update_rate")) == SimBridgeConfig().camera_rate_hz
    assert sensor.findtext("always_on") == "true"
    # The bridge takes this topic, and the camera info gz-sensors publishes beside it
    # (gz-sensors 8.2.2 CameraSensor::AdvertiseInfo: <topic without its last part>/camera_info).
    topic = sensor.findtext("topic")
    by_type = {t.ros_type_name: t.gz_topic_name for t in read_bridge(gazebo_files().bridge)}
    assert by_type["sensor_msgs/msg/Image"] == topic
    assert by_type["sensor_msgs/msg/CameraInfo"] == topic.rsplit("/", 1)[0] + "/camera_info"


def test_the_xacro_goes_through_vla_accel_launchs_xacro_file():
    """vla_accel.launch.py xacro_file:=.../arm7.urdf.xacro: expand_xacro takes the defaults (a
    real arm: no ros2_control, no Gazebo), and the node's kinematics is arm7.urdf's."""
    installed = share_dir() / "urdf" / "arm7.urdf.xacro"
    (spec,) = vla_accel_nodes({"params_file": str(share_dir() / "config" / "vla_accel.yaml"),
                               "xacro_file": str(installed)})
    xml = spec.parameters[1]["robot_description"]
    assert xml == expand_xacro(str(installed))
    assert joint_table(xml) == joint_table(default_urdf().read_text())
    root = ET.fromstring(xml)
    assert root.find("ros2_control") is None and root.find("gazebo") is None
    assert ArmKinematics(xml).joint_names == ArmKinematics(default_urdf()).joint_names


# --- the controllers and the bridge --------------------------------------------------------------------
def test_controller_types_and_parameters_are_ros2_controllers_own():
    controllers = read_controllers(gazebo_files().controllers)
    assert set(controllers) == {JOINT_STATE_BROADCASTER, ARM_CONTROLLER, GRIPPER_CONTROLLER}
    assert controllers[JOINT_STATE_BROADCASTER].type == gazebo_launch.JOINT_STATE_BROADCASTER_TYPE
    for name in (ARM_CONTROLLER, GRIPPER_CONTROLLER):
        assert controllers[name].type == gazebo_launch.FORWARD_COMMAND_CONTROLLER
        assert controllers[name].interface_name == "position"
    import yaml

    data = yaml.safe_load(gazebo_files().controllers.read_text())
    manager = data["controller_manager"]["ros__parameters"]
    assert isinstance(manager["update_rate"], int) and manager["update_rate"] > 0
    for name, controller in controllers.items():
        assert controller.type in CONTROLLER_TYPES, controller.type
        assert set((data.get(name) or {}).get("ros__parameters", {})) == CONTROLLER_TYPES[controller.type], name
    kin = ArmKinematics(robot_description(gazebo_files()))
    assert controllers[ARM_CONTROLLER].joints == kin.joint_names  # the node's URDF arm order
    assert controllers[GRIPPER_CONTROLLER].joints == kin.gripper_joint_names  # the node's finger order
    # Each commanded joint has the commanded interface in the URDF's ros2_control block.
    system = ET.fromstring(robot_description(gazebo_files())).find("ros2_control")
    for name in (ARM_CONTROLLER, GRIPPER_CONTROLLER):
        for joint in controllers[name].joints:
            interfaces = [c.get("name") for c in system.findall(f"joint[@name='{joint}']/command_interface")]
            assert controllers[name].interface_name in interfaces, joint


def test_the_bridge_file_is_valid_and_carries_the_topics_the_node_subscribes_to():
    files = gazebo_files()
    import yaml

    for entry in yaml.safe_load(files.bridge.read_text()):
        assert set(entry) <= BRIDGE_KEYS and entry["direction"] in BRIDGE_DIRECTIONS
        assert BRIDGE_TYPES[entry["ros_type_name"]] == entry["gz_type_name"]
    node = next(p for p in gazebo_processes(defaults()) if p.name == "vla_accel_node")
    params_file, overrides = node.parameters
    values = {**read_node_parameters(params_file, "vla_accel_node"), **overrides}
    assert values.pop("use_sim_time") is True  # declared by rclpy, not by NodeConfig
    cfg = from_params(NodeConfig, values)
    to_ros = {t.ros_topic_name: t for t in read_bridge(files.bridge) if t.direction == "GZ_TO_ROS"}
    assert to_ros[cfg.image_topic].ros_type_name == "sensor_msgs/msg/Image" and not cfg.compressed_image
    assert to_ros["/clock"].ros_type_name == "rosgraph_msgs/msg/Clock"  # use_sim_time follows it
    # Joint states come from joint_state_broadcaster (ros2_controllers joint_state_broadcaster.cpp:
    # "joint_states" beside the controller manager, both in the launch's namespace), not the bridge.
    assert cfg.joint_states_topic == "joint_states" and cfg.joint_states_topic not in to_ros
    # The node's commands go to the forward command controllers (their ~/commands topics).
    assert cfg.output == "forward_position" and cfg.controller == ARM_CONTROLLER
    assert cfg.gripper_controller == GRIPPER_CONTROLLER and cfg.autostart
    assert cfg.controller_joints == read_controllers(files.controllers)[ARM_CONTROLLER].joints
    assert ArmKinematics(cfg.robot_description, cfg.tcp_frame).joint_names == cfg.controller_joints
    assert bridged_to_ros(files.bridge, "sensor_msgs/msg/Image") == cfg.image_topic
    with pytest.raises(ValueError, match="no std_msgs/msg/String"):
        bridged_to_ros(files.bridge, "std_msgs/msg/String")


# --- the launch ---------------------------------------------------------------------------------------
def test_the_launch_file_is_thin_and_hands_its_arguments_to_the_tested_functions():
    text = (ROOT / "launch" / "gazebo.launch.py").read_text()
    for call in ("gazebo_arguments()", "gazebo_processes(given)", "gz_sim_arguments(given)",
                 "Node(**process.node_kwargs())"):
        assert call in text, call
    assert "GZ_SIM_LAUNCH" in text and gazebo_launch.GZ_SIM_LAUNCH == ("ros_gz_sim", "launch/gz_sim.launch.py")


def test_processes_are_the_checked_executables_started_in_order():
    processes = gazebo_processes(defaults())
    names = [p.name for p in processes]
    assert len(set(names)) == len(names)
    for i, process in enumerate(processes):
        assert (process.package, process.executable) in EXECUTABLES, process
        if process.after:  # its trigger is started before it
            assert process.after in names[:i], process.name
        if process.executable == "create":
            assert {a for a in process.arguments if a.startswith("-") and a[1:2].isalpha()} <= CREATE_FLAGS
    by_name = {p.name: p for p in processes}
    spawners = [p for p in processes if p.executable == "spawner"]
    spawned = [a for p in spawners for a in p.arguments if not a.startswith("-") and not a.endswith(".yaml")]
    assert sorted(spawned) == sorted(read_controllers(gazebo_files().controllers))  # each once
    broadcaster = next(p for p in spawners if JOINT_STATE_BROADCASTER in p.arguments)
    assert broadcaster.after == f"spawn_{gazebo_launch.ROBOT_NAME}"  # the controller manager lives in the arm
    arm = next(p for p in spawners if ARM_CONTROLLER in p.arguments)
    assert arm.after == broadcaster.name and GRIPPER_CONTROLLER in arm.arguments
    for spawner in spawners:
        at = spawner.arguments.index("--param-file")
        assert Path(spawner.arguments[at + 1]) == gazebo_files().controllers
    rsp = by_name["robot_state_publisher"].parameters[0]
    assert rsp["use_sim_time"] is True
    assert rsp["robot_description"] == robot_description(gazebo_files())
    assert by_name[f"spawn_{gazebo_launch.ROBOT_NAME}"].arguments[:2] == ("-topic", "robot_description")
    assert by_name["gz_bridge"].parameters == ({"config_file": str(gazebo_files().bridge)},)
    node = by_name["vla_accel_node"]
    assert node.ends_launch and [p.name for p in processes if p.ends_launch] == ["vla_accel_node"]
    assert node.ros_arguments == ("--log-level", "info")
    # The description the node reads names the controllers file the spawners load.
    plugin = ET.fromstring(node.parameters[1]["robot_description"]).find("gazebo/plugin/parameters")
    assert Path(plugin.text) == gazebo_files().controllers
    kwargs = node.node_kwargs()
    assert kwargs["package"] == "vla_accel_ros" and kwargs["output"] == "screen"


def test_cubes_are_the_mujoco_scenes_and_start_where_the_task_places_cubes():
    processes = [p for p in gazebo_processes(defaults()) if p.name.startswith("spawn_cube_")]
    assert [p.name for p in processes] == [f"spawn_cube_{c}" for c in CUBE_COLORS]
    placed = []
    for process, color in zip(processes, CUBE_COLORS):
        args = dict(zip(process.arguments[::2], process.arguments[1::2]))
        model = ET.fromstring(args["-string"]).find("model")
        assert model.get("name") == args["-name"] == f"cube_{color}"
        size = _floats(model.findtext("link/collision/geometry/box/size"))
        assert size == _floats(model.findtext("link/visual/geometry/box/size")) == (2 * CUBE_HALF_SIZE,) * 3
        assert _floats(model.findtext("link/visual/material/diffuse"), 4) == CUBE_COLORS[color]
        assert float(model.findtext("link/inertial/mass")) > 0
        x, y, z = float(args["-x"]), float(args["-y"]), float(args["-z"])
        assert CUBE_X_RANGE[0] <= x <= CUBE_X_RANGE[1] and CUBE_Y_RANGE[0] <= y <= CUBE_Y_RANGE[1]
        assert z == pytest.approx(TABLE_TOP_Z + CUBE_HALF_SIZE)  # resting on the ground plane
        placed.append(np.array([x, y]))
    assert all(np.linalg.norm(a - b) >= CUBE_MIN_SEPARATION for i, a in enumerate(placed) for b in placed[:i])
    assert ET.fromstring(cube_sdf("red")).get("version")


def test_arguments_are_documented_and_reach_the_node_and_gazebo(tmp_path):
    arguments = {a.name: a for a in gazebo_arguments()}
    assert {"params_file", "log_level", "world", "gui", "checkpoint", "decoder", "instruction", "autostart"} <= \
        set(arguments)
    for arg in arguments.values():
        assert len(arg.description) > 15, arg.name
        if arg.choices:
            assert arg.default in arg.choices, arg.name
    assert Path(arguments["params_file"].default).is_file()
    assert gz_sim_arguments(defaults()) == {"gz_args": "-r empty.sdf", "on_exit_shutdown": "true"}
    assert gz_sim_arguments({"gui": "false", "world": "/w/cell.sdf"})["gz_args"] == \
        "-r -s --headless-rendering /w/cell.sdf"
    with pytest.raises(ValueError, match="gui"):
        gz_sim_arguments({"gui": "maybe"})
    given = {**defaults(), "decoder": "ar", "autostart": "false", "instruction": "pick up the red cube",
             "log_level": "debug"}
    node = next(p for p in gazebo_processes(given) if p.name == "vla_accel_node")
    overrides = node.parameters[1]
    assert overrides["decoder"] == "ar" and overrides["autostart"] is False  # the user's word wins
    assert overrides["instruction"] == "pick up the red cube" and overrides["use_sim_time"] is True
    assert node.ros_arguments == ("--log-level", "debug")
    with pytest.raises(ValueError, match="control_rate_hz"):
        gazebo_processes({**defaults(), "control_rate_hz": "fast"})
    with pytest.raises(ValueError, match="nope.yaml"):
        gazebo_processes({**defaults(), "params_file": str(tmp_path / "nope.yaml")})


# --- files ----------------------------------------------------------------------------------------------
def _share_patterns() -> list[tuple[str, str]]:
    """The (subdir, pattern) pairs setup.py installs under share/vla_accel_ros with its share() helper."""
    calls = [node for node in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "share"]
    return [(c.args[0].value, c.args[1].value if len(c.args) > 1 else "*") for c in calls]


def test_every_file_the_gazebo_launch_reads_exists_and_setup_py_installs_it():
    files = gazebo_files()
    assert files == gazebo_files(ROOT)  # the source checkout is the share directory here
    patterns = _share_patterns()
    for path in (*files.all(), ROOT / "launch" / "gazebo.launch.py"):
        assert path.is_file(), path
        rel = path.relative_to(ROOT).as_posix()
        assert any(rel.rsplit("/", 1)[0] == sub and fnmatch(rel, f"{sub}/{pat}") for sub, pat in patterns), rel


def test_the_wheel_installs_the_gazebo_files_and_the_arm_examples(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("vla_accel_ros-*.whl"))
    data = {n.split(".data/data/", 1)[1] for n in zipfile.ZipFile(wheel).namelist() if ".data/data/" in n}
    wanted = [*gazebo_files(ROOT).all(), ROOT / "launch" / "gazebo.launch.py",
              *sorted((ROOT / "config" / "examples").glob("*.yaml"))]
    assert len(wanted) >= 9
    for path in wanted:
        assert f"share/vla_accel_ros/{path.relative_to(ROOT).as_posix()}" in data, path


def test_gazebo_launch_imports_without_launch_rclpy_or_xacro():
    script = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('rclpy', 'launch', 'launch_ros', 'xacro'):\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vla_accel_ros.ros.gazebo_launch as g\n"
        "print(len(g.gazebo_arguments()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and int(done.stdout) > 5, done.stderr[-2000:]


def test_launch_description_loads_with_launch_ros():
    pytest.importorskip("launch_ros", reason="launch_ros is not installed (no PyPI wheel); the functions are tested")
    from launch import LaunchDescription

    path = ROOT / "launch" / "gazebo.launch.py"
    spec = importlib.util.spec_from_file_location("gazebo_launch_py", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.generate_launch_description(), LaunchDescription)
