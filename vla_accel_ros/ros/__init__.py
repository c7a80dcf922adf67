"""The rclpy adapters: the VLA node and the helpers it is made of, the inference node, the MuJoCo bridge
node, their parameters, and the launcher that starts them as processes. Only this package (and what
starts its processes) needs ROS 2."""
