"""Launch arm7 in Gazebo (gz sim) under gz_ros2_control, with three cubes and vla_accel_node.

    ros2 launch vla_accel_ros gazebo.launch.py instruction:="pick up the red cube"
    ros2 launch vla_accel_ros gazebo.launch.py gui:=false world:=/path/to/world.sdf

It starts gz sim, robot_state_publisher, the arm and the cubes (ros_gz_sim create), the
joint_state_broadcaster and then the arm and gripper forward position controllers (spawned once
the arm is in the world), ros_gz_bridge for /clock and the camera, and vla_accel_node with
use_sim_time, autostarted. The launch ends when Gazebo or the node exits, non-zero when the node
failed. Needs a ROS 2 distribution with ros_gz and gz_ros2_control (Jazzy: ros-jazzy-ros-gz,
ros-jazzy-gz-ros2-control, ros-jazzy-ros2-controllers); see docs/gazebo_and_arms.md.
(What it starts, with which arguments and parameters: vla_accel_ros/ros/gazebo_launch.py,
unit-tested.)
"""

from typing import Any

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import (
    DeclareLaunchArgument,
    IncludeLaunchDescription,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.event_handlers import OnProcessExit
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch_ros.actions import Node

from vla_accel_ros.ros.gazebo_launch import (
    GZ_SIM_LAUNCH,
    gazebo_arguments,
    gazebo_processes,
    gz_sim_arguments,
)
from vla_accel_ros.ros.launch_actions import end_launch_on_exit


def _start(context: LaunchContext) -> list[Any]:
    given = context.launch_configurations
    package, path = GZ_SIM_LAUNCH
    actions: list[Any] = [IncludeLaunchDescription(
        PythonLaunchDescriptionSource(f"{get_package_share_directory(package)}/{path}"),
        launch_arguments=list(gz_sim_arguments(given).items()))]
    nodes: dict[str, Node] = {}
    for process in gazebo_processes(given):
        node = nodes[process.name] = Node(**process.node_kwargs())
        if process.after:  # started by the exit of the process it follows
            actions.append(RegisterEventHandler(OnProcessExit(target_action=nodes[process.after], on_exit=[node])))
        else:
            actions.append(node)
        if process.ends_launch:
            actions.append(RegisterEventHandler(OnProcessExit(target_action=node,
                                                              on_exit=end_launch_on_exit(process.name))))
    return actions


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(a.name, default_value=a.default, description=a.description,
                                      choices=list(a.choices) or None) for a in gazebo_arguments()]
    return LaunchDescription([*declared, OpaqueFunction(function=_start)])
