"""Launch vla_inference_node on the GPU host: the policy of the robots whose control nodes run
with ``inference_mode: remote``.

    ros2 launch vla_accel_ros inference.launch.py robots:=left_arm,right_arm checkpoint:=hf:/models/my_vla

Each robot's control node, in its namespace, publishes its observations and takes its actions on
``<robot>/vla_inference/...``; the DDS graph carries them between the hosts. The values in
params_file stand unless a launch argument is given. (Argument handling:
vla_accel_ros/ros/launch_args.py, unit-tested.)
"""

from launch import LaunchDescription

from vla_accel_ros.ros.launch_actions import package_launch_description
from vla_accel_ros.ros.launch_args import inference_arguments, inference_nodes


def generate_launch_description() -> LaunchDescription:
    return package_launch_description(inference_arguments(), inference_nodes)
