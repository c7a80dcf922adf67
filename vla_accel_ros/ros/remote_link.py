"""The control node's side of ``inference_mode: remote``: its observations and task out to
``vla_inference_node``, the answers in, in the messages of ``ros/remote_protocol.py``.
Observations best effort, depth 1 (a late image is worth nothing); the task latched; answers
reliable, depth 1. Made once per node and kept over cleanup, like the node's subscriptions; each
configure starts a remote worker on it (:meth:`RemoteLink.start_worker`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from vla_accel_ros.core.controller import Controller
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.ros import remote_protocol
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS
from vla_accel_ros.runtime.remote_worker import RemoteInferenceWorker

OBSERVATION_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST)
ACTION_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)


class RemoteLink:
    """``reject(message)``: the node's account of a malformed answer; ``compressed``: observations
    as JPEG (CompressedImage)."""

    def __init__(self, node: Node, compressed: bool, reject: Callable[[str], None], callback_group: Any) -> None:
        self.compressed = compressed
        self.reject = reject
        self._image = (node.create_publisher(CompressedImage, remote_protocol.COMPRESSED_IMAGE_TOPIC, OBSERVATION_QOS)
                       if compressed else node.create_publisher(Image, remote_protocol.IMAGE_TOPIC, OBSERVATION_QOS))
        self._state = node.create_publisher(JointState, remote_protocol.STATE_TOPIC, OBSERVATION_QOS)
        self._task = node.create_publisher(String, remote_protocol.INSTRUCTION_TOPIC, LATCHED_QOS)
        self.subscription = node.create_subscription(JointTrajectory, remote_protocol.ACTION_TOPIC, self._on_action,
                                                     ACTION_QOS, callback_group=callback_group)
        self.worker: RemoteInferenceWorker | None = None
        self._joint_names: tuple[str, ...] = ()
        self._sent_task: str | None = None

    def start_worker(self, controller: Controller, clock: Callable[[], float], joint_names: Sequence[str], *,
                     lost_after_s: float, max_age_s: float) -> RemoteInferenceWorker:
        """The remote worker of ``controller``, started, its observations (the arm joints
        ``joint_names``) sent and its answers delivered through this link; the task is sent anew."""
        self._joint_names = tuple(joint_names)
        self._sent_task = None
        self.worker = RemoteInferenceWorker(controller, self.send, clock, lost_after_s=lost_after_s,
                                            max_age_s=max_age_s)
        self.worker.start()
        return self.worker

    def disconnect(self) -> None:
        """Deliver no more answers (the worker is stopped)."""
        self.worker = None

    def send(self, obs: Observation) -> None:
        """Publish one observation for the inference node (the remote worker's thread), and the task
        when it changed."""
        if obs.instruction != self._sent_task:
            self._task.publish(String(data=obs.instruction))
            self._sent_task = obs.instruction
        self._image.publish(remote_protocol.compressed_image_message(obs) if self.compressed
                            else remote_protocol.image_message(obs))
        self._state.publish(remote_protocol.state_message(obs, self._joint_names))

    def _on_action(self, msg: JointTrajectory) -> None:
        if self.worker is None:
            return
        try:
            answer = remote_protocol.action_from(msg)
        except ValueError as err:
            self.reject(f"remote action rejected: {err}")
            return
        self.worker.on_remote_action(answer)
