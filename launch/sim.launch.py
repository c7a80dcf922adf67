"""Launch the MuJoCo sim bridge and vla_accel_node driving it over ROS topics.

    ros2 launch vla_accel_ros sim.launch.py control_rate_hz:=50.0 decoder:=kerv seed:=100000

The bridge publishes joint_states, camera/image_raw, robot_description and /clock; the node reads
the URDF from the topic. The first episode starts once the node's first command arrives (it is
configured and active). New episodes: publish {"seed": 3, "color": "red"} on sim_node/reset;
results arrive on sim_node/episode. The values in params_file stand unless a launch argument is
given; the launch ends when either node exits, non-zero when one failed.
(Without the ros2 CLI: ``vla-accel sim --episodes N``. Argument handling:
vla_accel_ros/ros/launch_args.py, unit-tested.)
"""

from launch import LaunchDescription

from vla_accel_ros.ros.launch_actions import package_launch_description
from vla_accel_ros.ros.launch_args import sim_arguments, sim_nodes


def generate_launch_description() -> LaunchDescription:
    return package_launch_description(sim_arguments(), sim_nodes)
