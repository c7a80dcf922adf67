"""The control node's inputs besides its cameras (``ros/node_cameras.py``): ``joint_states_topic``
(sensor-data QoS), ``~/instruction`` and, while the package's URDF stands in for a missing
description, a late ``robot_description`` (transient local); each message checked (header stamps
in order, joint names, values) and handed to the controller. Every rejected input, the cameras' and
the remote link's too, is counted and kept for /diagnostics, each kind logged at most once per
``LOG_THROTTLE_S``; so are the lines the camera intake prints. Instruction changes, by topic or
parameter, are logged throttled (``runtime/instruction_log.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from vla_accel_ros.core.controller import Controller
from vla_accel_ros.core.convert import joint_state_to_arm
from vla_accel_ros.core.input_errors import InputErrorLog, shorten
from vla_accel_ros.core.stamp_order import StampOrder
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS
from vla_accel_ros.ros.robot_description import ROBOT_DESCRIPTION_TOPIC, description_mismatch
from vla_accel_ros.runtime.clock_watch import ClockWatch
from vla_accel_ros.runtime.instruction_log import InstructionLog
from vla_accel_ros.runtime.stalls import StallMonitor

LOG_THROTTLE_S = 10.0  # each kind of input problem is logged at most once per this long


class NodeInputs:
    """``node``'s input subscriptions (in ``callback_group``, timed by ``stalls``) and its accounts
    of rejected input: ``errors`` and ``camera_output``. ``controller()``: the node's (None while
    unconfigured); ``now()``: its clock; ``clock``: its clock watch (whose steps widen the
    future-stamp tolerance)."""

    def __init__(self, node: Node, cfg: NodeConfig, controller: Callable[[], Controller | None],
                 now: Callable[[], float], clock: ClockWatch, stalls: StallMonitor, callback_group: Any) -> None:
        self._node, self._cfg, self._controller, self._now = node, cfg, controller, now
        self._clock, self._stalls, self._group = clock, stalls, callback_group
        self.description_fallback = False  # the package's URDF is in use, for want of a description
        self.errors = InputErrorLog(LOG_THROTTLE_S)
        self.camera_output = InputErrorLog(LOG_THROTTLE_S)  # what the camera child prints (libpng, ...)
        self._stamps = StampOrder(max(cfg.camera_timeout_s, cfg.joint_state_timeout_s), cfg.future_stamp_tolerance_s)
        self._instructions = InstructionLog()
        self.subscriptions: dict[str, Any] = {}  # topic -> subscription

    def subscribe(self) -> None:
        """Sensor data best effort (matches reliable publishers too). Made once and kept over cleanup
        (their callbacks ignore messages while unconfigured): destroying a subscription while a
        multi-threaded executor waits on it raises in that executor."""
        node = self._node
        wanted: list[tuple[Any, Callable[[Any], None], str, QoSProfile | int]] = [
            (JointState, self._on_joint_state, self._cfg.joint_states_topic, qos_profile_sensor_data),
            (String, self._on_instruction, "~/instruction", 10)]
        if self.description_fallback:  # a robot_state_publisher that starts after us is checked
            wanted.append((String, self._on_late_description, ROBOT_DESCRIPTION_TOPIC, LATCHED_QOS))
        for msg_type, callback, topic, qos in wanted:
            if topic not in self.subscriptions:
                timed = self._stalls.wrap(f"{node.resolve_topic_name(topic)} callback", callback)
                self.subscriptions[topic] = node.create_subscription(msg_type, topic, timed, qos,
                                                                     callback_group=self._group)

    def reject(self, message: str) -> None:
        """Count, keep for /diagnostics, and log each kind of problem once per LOG_THROTTLE_S."""
        if self.errors.add(message, time.monotonic()):
            self._node.get_logger().warning(message)

    def stamp_in_order(self, what: str, stamp: float) -> bool:
        take, problem = self._stamps.check(what, stamp, self._now(), self._clock.step_s)
        if problem:
            self.reject(problem)
        return take

    def on_camera_output(self, line: str) -> None:
        """A line the camera intake process printed (rclpy's log, libpng's and OpenCV's complaints about
        bad images): each kind logged at most once per LOG_THROTTLE_S."""
        if self.camera_output.add(line, time.monotonic()):
            self._node.get_logger().warning(f"camera intake: {shorten(line)}")

    def set_instruction(self, text: str) -> None:
        """A new instruction (topic or parameter): taken and its change logged, or rejected."""
        controller = self._controller()
        if controller is None:  # configure reads the parameter
            return
        previous = controller.instruction
        if (error := controller.set_instruction(text)) is not None:
            self.reject(error)
        elif controller.instruction != previous:
            if (line := self._instructions.line(controller.instruction, time.monotonic())) is not None:
                self._node.get_logger().info(line)

    def _on_joint_state(self, msg: JointState) -> None:
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        if (controller := self._controller()) is None or not self.stamp_in_order("joint state", stamp):
            return
        try:
            q, gripper = joint_state_to_arm(controller.kin, msg.name, msg.position)
        except ValueError as err:
            self.reject(f"joint state rejected: {err}")
            return
        if (error := controller.on_joint_state(q, gripper, self._now())) is not None:
            self.reject(error)

    def _on_instruction(self, msg: String) -> None:
        self.set_instruction(msg.data)

    def _on_late_description(self, msg: String) -> None:
        """robot_description published after start-up (the package URDF is in use): hold while it
        describes another arm, carry on when it matches (restart the node to adopt a new one)."""
        if (controller := self._controller()) is None or not self.description_fallback:
            return
        problem = description_mismatch(controller.kin, msg.data, self._cfg.tcp_frame)
        fault = f"robot_description received after start-up {problem}; holding (restart the node to use it)"
        controller.set_config_fault(fault if problem else "")
        if problem:
            self.reject(fault)
        else:
            self._node.get_logger().info("robot_description received after start-up matches the URDF in use")
