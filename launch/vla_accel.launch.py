"""Launch vla_accel_node for a real arm under ros2_control.

    ros2 launch vla_accel_ros vla_accel.launch.py params_file:=my_arm.yaml namespace:=left_arm \
        output:=joint_trajectory controller:=joint_trajectory_controller

The values in params_file stand; a launch argument overrides one only when given. The URDF comes
from, in order: xacro_file (expanded by xacro), the robot_description parameter, urdf_file, the
robot_description topic in the node's namespace (robot_state_publisher), the package's arm7.urdf.
With autostart:=false the node waits, unconfigured, for a lifecycle manager. The launch ends when
the node exits, with a non-zero status when it refused to start.
(Argument handling: vla_accel_ros/ros/launch_args.py, unit-tested.)
"""

from launch import LaunchDescription

from vla_accel_ros.ros.launch_actions import package_launch_description
from vla_accel_ros.ros.launch_args import vla_accel_arguments, vla_accel_nodes


def generate_launch_description() -> LaunchDescription:
    return package_launch_description(vla_accel_arguments(), vla_accel_nodes)
