"""The ROS-free core: kinematics, the Kalman filter, actions, observations, the controller and message
conversion, on numpy and Pinocchio alone (no torch, no rclpy)."""
