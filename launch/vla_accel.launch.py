"""Launch vla_accel_node for a real arm under ros2_control.

    ros2 launch vla_accel_ros vla_accel.launch.py params_file:=my_arm.yaml output:=joint_trajectory \
        controller:=joint_trajectory_controller image_topic:=/wrist/image_raw

The URDF comes from, in order: xacro_file (run through xacro), robot_description (XML text),
urdf_file, the /robot_description topic (robot_state_publisher), the package's arm7.urdf.
Launch arguments override the same parameters in params_file.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import Command, FindExecutable, LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PACKAGE = "vla_accel_ros"


def _node(overrides: dict, condition: IfCondition | UnlessCondition) -> Node:
    """vla_accel_node: the parameter file, then ``overrides`` (launch arguments, robot_description)."""
    return Node(package=PACKAGE, executable="vla_accel_node", name="vla_accel_node", output="screen",
                parameters=[LaunchConfiguration("params_file"), overrides], condition=condition)


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), "config", "vla_accel.yaml"]),
            description="ROS 2 parameter file for vla_accel_node (see config/vla_accel.yaml for every parameter)",
        ),
        DeclareLaunchArgument("xacro_file", default_value="",
                              description="URDF or xacro file expanded by xacro into robot_description; "
                                          "empty = not used"),
        DeclareLaunchArgument("robot_description", default_value="",
                              description="URDF XML text; empty = urdf_file, then the /robot_description topic"),
        DeclareLaunchArgument("urdf_file", default_value="", description="URDF file; empty = the /robot_description "
                                                                         "topic, then the package's urdf/arm7.urdf"),
        DeclareLaunchArgument("image_topic", default_value="/camera/image_raw",
                              description="Camera topic (sensor_msgs/Image)"),
        DeclareLaunchArgument("joint_states_topic", default_value="/joint_states",
                              description="sensor_msgs/JointState topic of the arm"),
        DeclareLaunchArgument("output", default_value="forward_position",
                              description="Command format: forward_position | joint_trajectory | joint_state"),
        DeclareLaunchArgument("controller", default_value="arm_controller",
                              description="ros2_control arm controller name (topic prefix of the commands)"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="Follow /clock (simulators, rosbag play --clock)"),
        DeclareLaunchArgument("decoder", default_value="kerv",
                              description="Action decoder: ar, sd, kerv_released, kerv, world_aware, deadline"),
        DeclareLaunchArgument("temperature", default_value="0.5",
                              description="Action-token sampling temperature, 0 = greedy"),
    ]

    common = {
        "image_topic": LaunchConfiguration("image_topic"),
        "joint_states_topic": LaunchConfiguration("joint_states_topic"),
        "output": LaunchConfiguration("output"),
        "controller": LaunchConfiguration("controller"),
        "decoder": LaunchConfiguration("decoder"),
        "temperature": ParameterValue(LaunchConfiguration("temperature"), value_type=float),
        "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
        "urdf_file": LaunchConfiguration("urdf_file"),
    }
    use_xacro = PythonExpression(["'", LaunchConfiguration("xacro_file"), "' != ''"])
    xacro_description = ParameterValue(
        Command([FindExecutable(name="xacro"), " ", LaunchConfiguration("xacro_file")]), value_type=str
    )
    text_description = ParameterValue(LaunchConfiguration("robot_description"), value_type=str)

    node_with_xacro = _node({**common, "robot_description": xacro_description}, IfCondition(use_xacro))
    node = _node({**common, "robot_description": text_description}, UnlessCondition(use_xacro))
    return LaunchDescription([*args, node_with_xacro, node])
