"""vla_accel_node with two cameras over real DDS: the images of one observation matched by stamp, a
watchdog per camera, and a missing or out-of-step camera holding the arm and named on /diagnostics;
one raw and one compressed camera; a camera count that differs from the model's image slots refused
at configure in one line."""

from __future__ import annotations

import shutil
import time

import cv2
import numpy as np
import pytest
import torch

rclpy = pytest.importorskip("rclpy")
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage, Image, JointState

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_checkpoint, default_urdf
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.models.own.checkpoint import save_flow_heads
from vla_accel_ros.models.own.flow import FlowHeadConfig, FlowHeads
from vla_accel_ros.ros.node import VlaAccelNode

torch.set_num_threads(1)
KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
_domains = iter(range(110, 116))
TOPICS = ["camera/image_raw", "wrist_camera/image_raw"]


class TwoCameras:
    """The node under test with a scene camera (raw) and a wrist camera (compressed), and a peer
    that plays the robot; ``wrist`` says what the wrist camera does: 'on', 'off' or 'late' (its
    images stamped 0.2 s behind the scene camera's)."""

    def __init__(self, dds_rig) -> None:
        self.dds = dds_rig(next(_domains), "robot")
        params = {"inference": False, "autostart": True, "instruction": "pick up the red cube",
                  "robot_description_timeout_s": 0.0, "image_topics": TOPICS,
                  "image_transports": ["raw", "compressed"], "camera_sync_tolerance_s": 0.02,
                  "camera_timeout_s": 0.3, "stats_rate_hz": 10.0}
        self.peer = self.dds.peer
        self.node = VlaAccelNode(context=self.dds.context,
                                 parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
        self.wrist = "on"
        self._joints = self.peer.create_publisher(JointState, "/joint_states", 10)
        self._scene = self.peer.create_publisher(Image, "/camera/image_raw", 10)
        self._wrist = self.peer.create_publisher(CompressedImage, "/wrist_camera/image_raw", 10)
        self.diagnostics: list[str] = []
        self.peer.create_subscription(DiagnosticArray, "/diagnostics",
                                      lambda m: self.diagnostics.append(m.status[0].message), 10)
        self.wait, self.close = self.dds.wait, self.dds.close
        self.dds.spin(self.node, executor="multi", feed=self._feed)

    def _feed(self) -> None:
        scene = Image(height=48, width=64, encoding="rgb8", step=64 * 3,
                      data=np.full((48, 64, 3), 120, np.uint8).tobytes())
        ok, jpeg = cv2.imencode(".jpg", np.full((48, 64, 3), 60, np.uint8))
        assert ok
        wrist = CompressedImage(format="jpeg", data=jpeg.tobytes())
        names = [*KIN.joint_names, "finger_joint1", "finger_joint2"]
        k = 0
        while not self.dds.stop.is_set():
            now = self.peer.get_clock().now()
            joints = JointState(name=names, position=[*Q.tolist(), 0.03, 0.03])
            joints.header.stamp = now.to_msg()
            self._joints.publish(joints)
            if k % 5 == 0:
                scene.header.stamp = now.to_msg()
                self._scene.publish(scene)
                if self.wrist != "off":
                    late = rclpy.time.Duration(seconds=0.2 if self.wrist == "late" else 0.0)
                    wrist.header.stamp = (now - late).to_msg()
                    self._wrist.publish(wrist)
            k += 1
            self.dds.stop.wait(0.01)

    def reason(self) -> str:
        return self.node.controller.hold_reason if self.node.controller is not None else ""

    def source(self) -> str:
        tick = self.node._last_tick
        return tick.source if tick is not None else ""


def test_two_cameras_are_matched_watched_and_named(dds_rig):
    rig = TwoCameras(dds_rig)
    try:
        # both cameras flowing, stamped alike: observations, no hold (bring-up mode tracks the arm)
        assert rig.wait(lambda: rig.source() == "fallback", timeout=30.0), rig.reason()
        assert rig.node.controller.wait_observation(0, timeout=1.0) is not None
        got = rig.node.controller.wait_observation(0, timeout=1.0)
        assert got is not None and len(got[1].extra_images) == 1  # the wrist image in the second slot
        assert int(got[1].image.mean()) == 120 and abs(int(got[1].extra_images[0].mean()) - 60) <= 3
        # the wrist camera stops: its own watchdog holds the arm and /diagnostics names it
        rig.wrist = "off"
        assert rig.wait(lambda: rig.source() == "hold", timeout=5.0)
        assert "wrist_camera/image_raw" in rig.reason() and "stale" in rig.reason()
        assert rig.wait(lambda: any("wrist_camera/image_raw" in m for m in rig.diagnostics), timeout=5.0)
        # back, but 0.2 s apart from the scene camera (tolerance 0.02 s): still a hold, named
        rig.wrist = "late"
        assert rig.wait(lambda: "out of step" in rig.reason(), timeout=5.0), rig.reason()
        assert "wrist_camera/image_raw" in rig.reason()
        assert rig.source() == "hold"
        # in step again: it recovers by itself
        rig.wrist = "on"
        assert rig.wait(lambda: rig.source() == "fallback", timeout=5.0), rig.reason()
        assert rig.node.stats()["camera1_frames"] > 0 and rig.node.stats()["camera0_frames"] > 0
    finally:
        rig.close()


def test_a_camera_count_that_differs_from_the_image_slots_is_refused_at_configure(dds_rig, tmp_path):
    checkpoint = tmp_path / "two_slots"
    shutil.copytree(default_checkpoint(), checkpoint, ignore=shutil.ignore_patterns("flow_head*", "retrieval_store"))
    heads = FlowHeads(FlowHeadConfig(d_model=128, hidden=32, layers=1, horizon=8, cameras=2))
    save_flow_heads(heads, checkpoint, {"note": "random weights: a shape for the test"}, {})
    rig = dds_rig(next(_domains), "robot")
    try:
        params = {"autostart": True, "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0,
                  "checkpoint": str(checkpoint), "decoder": "flow2", "inference_mode": "thread"}
        with pytest.raises(ConfigError) as refused:
            VlaAccelNode(context=rig.context, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
        message = str(refused.value)
        assert "\n" not in message and "1 camera(s) give 1" in message and "reads 2 image" in message
        assert "give 2 with image_topics" in message and "allow_stand_in_images" in message
    finally:
        rig.close()
    time.sleep(0.1)
