"""Launch the MuJoCo sim bridge and vla_accel_node driving it over ROS topics.

    ros2 launch vla_accel_ros sim.launch.py control_rate_hz:=50.0 decoder:=kerv seed:=100000

The bridge publishes /robot_description, /joint_states, /camera/image_raw and /clock and starts an
episode; the node reads the URDF from the topic. New episodes: publish
{"seed": 3, "color": "red"} on /sim_node/reset; results arrive on /sim_node/episode.
(Without the ros2 CLI: ``vla-accel sim --episodes N``.)
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PACKAGE = "vla_accel_ros"


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), "config", "sim.yaml"]),
            description="Parameter file with sections for sim_node and vla_accel_node",
        ),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="vla_accel_node follows the bridge's /clock instead of the wall clock"),
        DeclareLaunchArgument("control_rate_hz", default_value="20.0", description="Control rate of the node (Hz)"),
        DeclareLaunchArgument("decoder", default_value="kerv",
                              description="Action decoder: ar, sd, kerv_released, kerv, world_aware, deadline"),
        DeclareLaunchArgument("temperature", default_value="0.5",
                              description="Action-token sampling temperature, 0 = greedy"),
        DeclareLaunchArgument("output", default_value="forward_position",
                              description="Command format: forward_position | joint_trajectory | joint_state"),
        DeclareLaunchArgument("seed", default_value="0", description="Seed of the first episode"),
        DeclareLaunchArgument(
            "checkpoint", default_value="",
            description="Policy checkpoint directory; empty = the package's checkpoints/default",
        ),
    ]
    # Both nodes read the parameter file, then the launch arguments. (The Node calls spell their
    # executables out: test_launch checks them in the source.)
    params_file = LaunchConfiguration("params_file")
    sim = Node(package=PACKAGE, executable="sim_node", name="sim_node", output="screen",
               parameters=[params_file, {"seed": ParameterValue(LaunchConfiguration("seed"), value_type=int)}])
    node = Node(package=PACKAGE, executable="vla_accel_node", name="vla_accel_node", output="screen", parameters=[
        params_file,
        {
            "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
            "control_rate_hz": ParameterValue(LaunchConfiguration("control_rate_hz"), value_type=float),
            "decoder": LaunchConfiguration("decoder"),
            "temperature": ParameterValue(LaunchConfiguration("temperature"), value_type=float),
            "output": LaunchConfiguration("output"),
            "checkpoint": LaunchConfiguration("checkpoint"),
        },
    ])
    return LaunchDescription([*args, sim, node])
