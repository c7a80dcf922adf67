"""Launch files: their argument handling (plain functions in ros/launch_args.py) table by table,
the files and executables they name, the package.xml they need, and, over DDS, what their choices
mean for the node (the parameter file's values run; namespaces keep arms apart). Loading the
launch files themselves needs launch_ros (no PyPI wheel: skipped without it)."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from vla_accel_ros.core.params_file import read_node_parameters
from vla_accel_ros.core.settings import from_params
from vla_accel_ros.decoding.specs import names
from vla_accel_ros.ros import launch_args
from vla_accel_ros.ros.launch_args import (
    check_params_file,
    exit_failure,
    inference_arguments,
    inference_nodes,
    node_options,
    node_overrides,
    sim_arguments,
    sim_nodes,
    vla_accel_arguments,
    vla_accel_nodes,
)
from vla_accel_ros.ros.parameters import (
    InferenceNodeConfig,
    NodeConfig,
    SimBridgeConfig,
)

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILES = {"vla_accel.launch.py": (vla_accel_arguments, vla_accel_nodes),
                "sim.launch.py": (sim_arguments, sim_nodes),
                "inference.launch.py": (inference_arguments, inference_nodes)}
ROBOT_ARGS = {"params_file", "namespace", "log_level", "control_rate_hz", "autostart", "checkpoint", "decoder",
              "temperature", "output", "use_sim_time"}
REQUIRED_ARGS = {"vla_accel.launch.py": ROBOT_ARGS | {"inference_mode"}, "sim.launch.py": ROBOT_ARGS,
                 "inference.launch.py": {"params_file", "namespace", "log_level", "robots", "checkpoint", "decoder",
                                         "temperature"}}
CONFIGS = {"vla_accel_node": NodeConfig, "sim_node": SimBridgeConfig, "vla_inference_node": InferenceNodeConfig}


def _console_scripts() -> dict[str, str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    scripts: dict[str, str] = {}
    for const in ast.walk(tree):
        if (isinstance(const, ast.Constant) and isinstance(const.value, str)
                and " = " in const.value and ":" in const.value):
            name, target = (s.strip() for s in const.value.split("=", 1))
            scripts[name] = target
    return scripts


# --- the launch files are thin -----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LAUNCH_FILES))
def test_launch_files_hand_their_arguments_to_the_tested_functions(name):
    text = (ROOT / "launch" / name).read_text()
    arguments, nodes = LAUNCH_FILES[name]
    assert f"package_launch_description({arguments.__name__}(), {nodes.__name__})" in text


@pytest.mark.parametrize("name", sorted(LAUNCH_FILES))
def test_arguments_are_documented_and_decoder_choices_are_exactly_the_decoders(name):
    arguments = {a.name: a for a in LAUNCH_FILES[name][0]()}
    assert REQUIRED_ARGS[name] <= set(arguments), REQUIRED_ARGS[name] - set(arguments)
    for arg in arguments.values():
        assert len(arg.description) > 15, arg.name
        if arg.choices:
            assert arg.default in arg.choices, arg.name
    assert arguments["decoder"].choices == ("", *names())
    assert "speculative" not in arguments["decoder"].description
    assert arguments["log_level"].choices == ("debug", "info", "warn", "error", "fatal")
    assert Path(arguments["params_file"].default).is_file()


@pytest.mark.parametrize("name", sorted(LAUNCH_FILES))
def test_nodes_are_installed_executables_reading_the_default_parameter_file(name):
    arguments, nodes = LAUNCH_FILES[name]
    given = {a.name: a.default for a in arguments()}
    scripts = _console_scripts()
    for spec in nodes(given):
        assert spec.executable in scripts, f"{spec.executable} is not a console script in setup.py"
        module, func = scripts[spec.executable].split(":")
        origin = importlib.util.find_spec(module).origin
        assert f"def {func}(" in Path(origin).read_text()
        params_file, overrides = spec.parameters
        assert overrides == {}  # every argument at its default: the file's values stand
        values = read_node_parameters(params_file, spec.name)
        assert values, f"{params_file} has no section for {spec.name}"
        from_params(CONFIGS[spec.name], values)
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["install"]["install_scripts"] == "$base/lib/vla_accel_ros"


def test_package_xml_lists_what_the_launch_files_use_and_nothing_they_do_not():
    """Every package a launch file starts a node of, includes a launch file of or loads a plugin
    from is an exec_depend; robot_state_publisher is one exactly when a launch file starts it
    (gazebo.launch.py does: gz_ros2_control and ros_gz_sim read its robot_description topic;
    vla_accel.launch.py and sim.launch.py start only this package's nodes)."""
    pytest.importorskip("xacro")  # gazebo.launch.py's nodes carry the expanded description
    from vla_accel_ros.ros import gazebo_launch

    depends = {e.text for e in ET.parse(ROOT / "package.xml").getroot() if e.tag == "exec_depend"}
    assert {"launch", "launch_ros", "xacro", "lifecycle_msgs"} <= depends
    gazebo = gazebo_launch.gazebo_processes({a.name: a.default for a in gazebo_launch.gazebo_arguments()})
    controllers = gazebo_launch.read_controllers(gazebo_launch.gazebo_files().controllers).values()
    used = ({p.package for p in gazebo} | {gazebo_launch.GZ_SIM_LAUNCH[0], "gz_ros2_control"}
            | {c.type.split("/")[0] for c in controllers})
    for arguments, nodes in LAUNCH_FILES.values():
        used |= {spec.node_kwargs()["package"] for spec in nodes({a.name: a.default for a in arguments()})}
    assert used - {"vla_accel_ros"} <= depends, sorted(used - {"vla_accel_ros"} - depends)
    assert ("robot_state_publisher" in depends) == ("robot_state_publisher" in used)


# --- argument handling -------------------------------------------------------------------------------
@pytest.mark.parametrize("given, expected", [
    ({}, {}),
    ({"decoder": ""}, {}),  # left empty: the file decides
    ({"decoder": "ar"}, {"decoder": "ar"}),
    ({"control_rate_hz": "50"}, {"control_rate_hz": 50.0}),
    ({"autostart": "true", "use_sim_time": "False"}, {"autostart": True, "use_sim_time": False}),
    ({"checkpoint": "/data/ckpt", "namespace": "arm1"}, {"checkpoint": "/data/ckpt"}),
    ({"temperature": "0"}, {"temperature": 0.0}),
], ids=["none", "empty", "decoder", "int-for-float", "bools", "string", "zero"])
def test_only_the_arguments_given_override_the_parameter_file(given, expected):
    assert node_overrides(NodeConfig, given, launch_args.VLA_NODE_ARGUMENTS) == expected


@pytest.mark.parametrize("given, words", [
    ({"decoder": "speculative"}, ["decoder", "speculative", "kerv"]),
    ({"control_rate_hz": "fast"}, ["control_rate_hz", "number"]),
    ({"control_rate_hz": "1000"}, ["control_rate_hz", "range"]),
    ({"control_rate_hz": "nan"}, ["control_rate_hz", "finite"]),
    ({"autostart": "maybe"}, ["autostart", "true or false"]),
    ({"output": "velocity"}, ["output", "forward_position"]),
])
def test_bad_argument_values_are_refused_naming_them(given, words):
    with pytest.raises(ValueError) as err:
        node_overrides(NodeConfig, given, launch_args.VLA_NODE_ARGUMENTS)
    for word in words:
        assert word in str(err.value)


def test_instruction_is_an_argument_of_the_robot_launch():
    params_file = str(ROOT / "config" / "vla_accel.yaml")
    (spec,) = vla_accel_nodes({"params_file": params_file, "instruction": "pick up the red cube"})
    assert spec.parameters[1] == {"instruction": "pick up the red cube"}


@pytest.mark.parametrize("name, given, words", [
    ("vla_accel.launch.py", {"kinematic_r_min": "2"}, ["kinematic_r_min", "params_file, namespace", "instruction"]),
    ("vla_accel.launch.py", {"decodr": "ar"}, ["decodr (did you mean decoder?)"]),
    ("sim.launch.py", {"episode_duration_s": "3"}, ["episode_duration_s", "seed"]),
    ("inference.launch.py", {"robot": "left_arm"}, ["robot (did you mean robots?)"]),
], ids=["node-parameter", "typo", "bridge-parameter", "typo-inference"])
def test_an_argument_the_launch_file_does_not_take_is_refused_listing_the_known_ones(name, given, words):
    arguments, nodes = LAUNCH_FILES[name]
    with pytest.raises(ValueError, match="unknown launch argument") as err:
        nodes({a.name: a.default for a in arguments()} | given)
    for word in words:
        assert word in str(err.value)


def test_launch_configurations_of_an_including_launch_file_pass():
    given = {a.name: a.default for a in vla_accel_arguments()} | {"robot_ip": "192.168.1.10", "ur_type": "ur5e"}
    assert len(vla_accel_nodes(given)) == 1


def test_a_missing_params_file_fails_the_launch_naming_it(tmp_path):
    for nodes in (vla_accel_nodes, sim_nodes):
        with pytest.raises(ValueError, match="nope.yaml"):
            nodes({"params_file": str(tmp_path / "nope.yaml")})
    with pytest.raises(ValueError, match="empty"):
        check_params_file("")


def test_namespace_and_log_level_reach_every_node(tmp_path):
    params = tmp_path / "p.yaml"
    params.write_text("/**:\n  ros__parameters: {}\n")
    specs = sim_nodes({"params_file": str(params), "namespace": "/cell2/", "log_level": "DEBUG", "seed": "7",
                       "decoder": "ar"})
    assert [s.name for s in specs] == ["sim_node", "vla_accel_node"]
    assert {s.namespace for s in specs} == {"cell2"}
    assert all(s.ros_arguments == ("--log-level", "debug") for s in specs)
    assert specs[0].parameters[1] == {"seed": 7} and specs[1].parameters[1] == {"decoder": "ar"}
    with pytest.raises(ValueError, match="log_level"):
        node_options("", "loud")


def test_xacro_file_becomes_the_robot_description(tmp_path):
    pytest.importorskip("xacro")
    params = tmp_path / "p.yaml"
    params.write_text("/**:\n  ros__parameters: {}\n")
    arm = tmp_path / "arm.urdf.xacro"
    arm.write_text('<robot xmlns:xacro="http://www.ros.org/wiki/xacro" name="a"><xacro:property name="n" value="l0"/>'
                   '<link name="${n}"/></robot>')
    (spec,) = vla_accel_nodes({"params_file": str(params), "xacro_file": str(arm)})
    assert '<link name="l0"/>' in spec.parameters[1]["robot_description"]
    with pytest.raises(ValueError, match="missing.xacro"):
        vla_accel_nodes({"params_file": str(params), "xacro_file": str(tmp_path / "missing.xacro")})


@pytest.mark.parametrize("returncode, words", [(0, None), (None, None), (2, "refused to start"), (1, "exited with 1"),
                                               (-11, "exited with -11")])
def test_a_node_that_fails_ends_the_launch_with_the_reason(returncode, words):
    reason = exit_failure("vla_accel_node", returncode)
    assert (reason == "") if words is None else (words in reason and "vla_accel_node" in reason)


# --- what it means for the node, over DDS --------------------------------------------------------------
def test_the_parameter_files_decoder_is_the_one_that_runs(tmp_path, ros_context):
    """The file says ar and no decoder argument is given: the node's decoder is ar (rcl applies
    the file, then the overrides, as launch_ros passes them)."""
    pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter

    from vla_accel_ros.ros.node import VlaAccelNode

    params = tmp_path / "arm.yaml"
    params.write_text("/**/vla_accel_node:\n  ros__parameters:\n    decoder: ar\n    control_rate_hz: 40.0\n")
    (spec,) = vla_accel_nodes({"params_file": str(params), "namespace": "arm1"})
    file, overrides = spec.parameters
    assert overrides == {}
    import rclpy
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context, domain_id=161, args=["node", "--ros-args", "--params-file", file])
    try:
        node = VlaAccelNode(context=context, namespace=spec.namespace, parameter_overrides=[
            Parameter(k, value=v) for k, v in {**overrides, "inference": False}.items()])
        assert node.cfg.policy.decoder == "ar" and node.cfg.control_rate_hz == 40.0
        assert node.get_fully_qualified_name() == "/arm1/vla_accel_node"
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)


def test_two_arms_in_two_namespaces_run_side_by_side_without_cross_talk(dds_rig):
    pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.ros.node import VlaAccelNode

    names = list(ArmKinematics(default_urdf()).joint_names)
    rig = dds_rig(162, "robots")
    poses = {"left": np.array([0.1, -0.6, 0.0, -2.2, 0.0, 1.6, 0.7]),
             "right": np.array([-0.3, -0.4, 0.2, -2.0, 0.1, 1.8, 0.4])}
    params = [Parameter(k, value=v) for k, v in {"inference": False, "autostart": True,
                                                 "robot_description_timeout_s": 0.0}.items()]
    nodes = {ns: VlaAccelNode(context=rig.context, namespace=ns, parameter_overrides=params) for ns in poses}
    received: dict[str, list] = {ns: [] for ns in poses}
    stray: list = []
    publishers = {}
    for ns in poses:
        rig.peer.create_subscription(Float64MultiArray, f"/{ns}/arm_controller/commands", received[ns].append, 10)
        publishers[ns] = rig.peer.create_publisher(JointState, f"/{ns}/joint_states", 10)
    rig.peer.create_subscription(Float64MultiArray, "/arm_controller/commands", stray.append, 10)

    def feed() -> None:
        while not rig.stop.is_set():
            for ns, q in poses.items():
                publishers[ns].publish(JointState(name=names, position=q.tolist()))
            rig.stop.wait(0.01)

    rig.spin(nodes["left"], feed=feed, others=(nodes["right"],))
    try:
        assert rig.wait(lambda: all(len(r) >= 5 for r in received.values()), timeout=15.0)
        for ns, q in poses.items():
            assert np.allclose(received[ns][-1].data, q, atol=1e-4), ns  # each holds its own arm
        assert not stray
    finally:
        rig.close()


@pytest.mark.parametrize("name", sorted(LAUNCH_FILES))
def test_launch_description_loads_with_launch_ros(name):
    pytest.importorskip("launch_ros", reason="launch_ros is not installed (no PyPI wheel); the functions are tested")
    from launch import LaunchDescription

    path = ROOT / "launch" / name
    spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.generate_launch_description(), LaunchDescription)


def test_the_inference_host_serves_the_robots_it_is_given(tmp_path):
    params = tmp_path / "gpu.yaml"
    params.write_text("/**/vla_inference_node:\n  ros__parameters:\n    decoder: world_aware\n")
    (spec,) = inference_nodes({"params_file": str(params), "robots": "left_arm, right_arm", "log_level": "warn"})
    assert spec.executable == "vla_inference_node" and spec.parameters[1] == {"robots": ["left_arm", "right_arm"]}
    cfg = from_params(InferenceNodeConfig, {**read_node_parameters(spec.parameters[0], spec.name),
                                            **spec.parameters[1]})
    assert cfg.policy.decoder == "world_aware" and cfg.robots == ("left_arm", "right_arm")
    (robot,) = vla_accel_nodes({"params_file": str(params), "inference_mode": "remote"})
    assert robot.parameters[1] == {"inference_mode": "remote"}
