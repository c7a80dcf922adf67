"""vla_accel_ros: a Vision-Language-Action policy for ROS 2 arms, accelerated by
kinematics-aware speculative decoding.

The ROS-free core (kinematics, Kalman filter, tokenizer, models, decoding, controller, sim)
imports without rclpy; only ``node`` and ``sim.sim_node`` need ROS 2.
"""

__version__ = "0.1.0"
