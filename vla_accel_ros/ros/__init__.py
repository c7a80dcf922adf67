"""The rclpy adapters: the VLA node, the MuJoCo bridge node, their parameters, and the launcher that
starts both as processes. Only this package (and what starts its processes) needs ROS 2."""
