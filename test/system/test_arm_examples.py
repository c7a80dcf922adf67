"""The example parameter files of config/examples/ for the arms teams own: each loads into the
node's parameter validation (in the root namespace and in any other), carries its arm's joint
names, TCP frame, controller, output format and camera topic as that arm's ROS 2 driver names
them, points at a team's own checkpoint (a plain directory path), and meets the robot contract the way the node
applies it.

The facts in ARMS are pinned with the public files they were read from; the example files name
the same files in their comments. The built-in checkpoint was made for arm7 and the teams'
directories are not here, so the contract is checked against the built-in checkpoint's record: a
7-DoF arm (FR3, xArm7) runs it only with allow_unmatched_robot, a 6-DoF arm (UR5e, xArm6) never."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.params_file import read_node_parameters
from vla_accel_ros.core.resources import default_checkpoint, share_dir
from vla_accel_ros.core.robot_record import (
    RobotMismatch,
    check_robot,
    read_robot_record,
    robot_in_use,
)
from vla_accel_ros.core.settings import from_params
from vla_accel_ros.ros.parameters import NodeConfig

EXAMPLES = share_dir() / "config" / "examples"
REALSENSE_COLOR = "/camera/camera/color/image_raw"  # IntelRealSense/realsense-ros 4.55.1, rs_launch.py


@dataclass(frozen=True)
class Arm:
    """What an example file must say, and where it comes from."""

    joints: tuple[str, ...]
    tcp_frame: str
    controller: str
    output: str
    source: str


ARMS = {
    # frankarobotics/franka_ros2 jazzy 3.4.0 (29cb85a677b8): franka_fr3_moveit_config/config/
    # fr3_ros_controllers.yaml; frankarobotics/franka_description 1.0.1 (566ba44abc48):
    # end_effectors/common/franka_hand.xacro.
    "franka_fr3.yaml": Arm(tuple(f"fr3_joint{i}" for i in range(1, 8)), "fr3_hand_tcp", "fr3_arm_controller",
                           "joint_trajectory", "franka_fr3_moveit_config/config/fr3_ros_controllers.yaml"),
    # UniversalRobots/Universal_Robots_ROS2_Driver jazzy, ur_robot_driver 3.8.0 (a16a26876b35):
    # ur_robot_driver/config/ur_controllers.yaml, launch/ur_control.launch.py;
    # Universal_Robots_ROS2_Description rolling 2.4.5 (2221ec0f720f): urdf/ur_macro.xacro.
    "ur5e.yaml": Arm(("shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint", "wrist_2_joint",
                      "wrist_3_joint"), "tool0", "scaled_joint_trajectory_controller", "joint_trajectory",
                     "ur_robot_driver/config/ur_controllers.yaml"),
    # xArm-Developer/xarm_ros2 jazzy (0417b0f96b19): xarm_controller/config/xarm6_controllers.yaml,
    # xarm7_controllers.yaml; xarm_description/urdf/gripper/xarm_gripper.urdf.xacro.
    "xarm6.yaml": Arm(tuple(f"joint{i}" for i in range(1, 7)), "link_tcp", "xarm6_traj_controller",
                      "joint_trajectory", "xarm_controller/config/xarm6_controllers.yaml"),
    "xarm7.yaml": Arm(tuple(f"joint{i}" for i in range(1, 8)), "link_tcp", "xarm7_traj_controller",
                      "joint_trajectory", "xarm_controller/config/xarm7_controllers.yaml"),
}


# Each driver's gripper, as its files name it: the interface that takes its command, the joint, the
# joint's range. franka_ros2: franka_gripper/launch/gripper.launch.py, franka_gripper/doc/index.rst;
# PickNikRobotics/ros2_robotiq_gripper: robotiq_description/config/robotiq_controllers.yaml,
# urdf/robotiq_2f_85_macro.urdf.xacro; xarm_ros2: xarm_moveit_config/config/xarm_gripper/
# controllers.yaml, xarm_description/urdf/gripper/xarm_gripper.urdf.xacro.
GRIPPERS = {
    "franka_fr3.yaml": ("franka_gripper/gripper_action", "fr3_finger_joint1", "0.04 m"),
    "ur5e.yaml": ("robotiq_gripper_controller/gripper_cmd", "robotiq_85_left_knuckle_joint", "0.8 rad"),
    "xarm6.yaml": ("xarm_gripper/gripper_action", "drive_joint", "0.85 rad"),
    "xarm7.yaml": ("xarm_gripper/gripper_action", "drive_joint", "0.85 rad"),
}


def config_of(name: str, namespace: str = "") -> NodeConfig:
    """The node's validated parameters from the example file, as the node would read it in ``namespace``."""
    return from_params(NodeConfig, read_node_parameters(EXAMPLES / name, "vla_accel_node", namespace=namespace))


def test_every_example_file_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(ARMS)


@pytest.mark.parametrize("name", sorted(ARMS))
def test_the_file_loads_into_the_nodes_parameter_validation_in_any_namespace(name):
    cfg = config_of(name)
    assert config_of(name, namespace="cell2/left_arm") == cfg  # /**/vla_accel_node: any namespace


@pytest.mark.parametrize("name", sorted(ARMS))
def test_the_file_carries_its_arms_names_topics_and_output(name):
    arm, cfg = ARMS[name], config_of(name)
    assert cfg.controller_joints == arm.joints
    assert cfg.tcp_frame == arm.tcp_frame
    assert cfg.controller == arm.controller and cfg.output == arm.output
    assert cfg.image_topic == REALSENSE_COLOR and not cfg.compressed_image
    assert cfg.joint_states_topic == "joint_states"
    # These drivers' grippers take a control_msgs GripperCommand action (GRIPPERS), never the node's
    # Float64MultiArray on <gripper_controller>/commands: the file names the action, the joint and
    # its range, and commands no gripper.
    assert cfg.gripper_controller == ""
    text = (EXAMPLES / name).read_text()
    action, joint, upper = GRIPPERS[name]
    assert "GripperCommand" in text and action in text
    assert joint in text and upper in text
    # The URDF comes from the driver's robot_description topic, never from arm7.urdf.
    assert cfg.robot_description == "" and cfg.urdf_file == "" and cfg.robot_description_timeout_s >= 5.0
    text = (EXAMPLES / name).read_text()
    assert arm.source in text  # the file names where its values come from
    assert "realsense2_camera/launch/rs_launch.py" in text


@pytest.mark.parametrize("name", sorted(ARMS))
def test_the_file_runs_a_teams_own_checkpoint(name):
    cfg = config_of(name)
    assert cfg.policy.checkpoint.startswith("/path/to/your_")  # the placeholder, a plain path: no prefix
    assert not cfg.policy.checkpoint.startswith("hf:")
    assert cfg.runner_config().checkpoint == cfg.policy.checkpoint


@pytest.mark.parametrize("name", sorted(ARMS))
def test_the_node_builds_the_arms_kinematics_from_those_names(name, foreign_arm):
    """A URDF with the arm's joint names and TCP frame (a stand-in for the driver's description)
    gives the node an arm in controller_joints order, so every command reaches the right joint."""
    cfg = config_of(name)
    kin = ArmKinematics(foreign_arm(cfg.controller_joints, cfg.tcp_frame), cfg.tcp_frame)
    assert kin.joint_names == cfg.controller_joints


@pytest.mark.parametrize("name", sorted(ARMS))
def test_the_robot_contract_against_the_built_in_checkpoint(name):
    """The built-in checkpoint (made for arm7, 7 DoF) stands in for a checkpoint made for another
    arm. Same DOF (FR3, xArm7): refused as the file stands (allow_unmatched_robot false), run with
    a warning under allow_unmatched_robot true. Another DOF (UR5e, xArm6): refused either way."""
    cfg = config_of(name)
    made_for = read_robot_record(default_checkpoint())
    assert made_for is not None and made_for.dof == 7
    in_use = robot_in_use(cfg.controller_joints, cfg.tcp_frame, action_dt_s=cfg.action_dt_s,
                          image_size=cfg.image_size)
    assert in_use.dof == len(ARMS[name].joints)
    assert not cfg.allow_unmatched_robot  # a team's model made for this arm needs no exemption
    with pytest.raises(RobotMismatch):
        check_robot(made_for, in_use, allow_unmatched=cfg.allow_unmatched_robot)
    allowed = replace(cfg, allow_unmatched_robot=True)
    if in_use.dof == made_for.dof:
        warning = check_robot(made_for, in_use, allow_unmatched=allowed.allow_unmatched_robot)
        assert "allow_unmatched_robot" in warning and "TCP frame" in warning
    else:
        with pytest.raises(RobotMismatch, match=f"{in_use.dof}-DoF arm with a policy made for 7 DoF"):
            check_robot(made_for, in_use, allow_unmatched=allowed.allow_unmatched_robot)


def test_the_examples_are_installed_beside_the_other_parameter_files():
    """setup.py installs config/examples/*.yaml to share/vla_accel_ros/config/examples (the wheel
    test in test_gazebo.py checks the built wheel)."""
    setup = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert 'share("config/examples", "*.yaml")' in setup
