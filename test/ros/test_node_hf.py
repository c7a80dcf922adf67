"""The node over DDS with a tiny Hugging Face VLA (OpenVLA's layout, random weights): every tick
publishes, the policy drives, and what the policy lacks is said on /diagnostics."""

from __future__ import annotations

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("transformers")
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402

KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
_domains = iter(range(185, 195))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tiny_hf_vla):
    return tiny_hf_vla(tmp_path_factory.mktemp("hf") / "tiny_openvla")


@pytest.mark.parametrize("mode, decoder, reuse_kv", [("thread", "kerv", False), ("process", "world_aware", False),
                                                     ("thread", "kerv", True)])
def test_the_node_runs_a_hugging_face_vla_and_every_tick_publishes(dds_rig, hf_dir, mode, decoder, reuse_kv):
    rig = dds_rig(next(_domains), "robot")
    params = {"inference": True, "inference_mode": mode, "checkpoint": f"hf:{hf_dir}", "decoder": decoder,
              "autostart": True, "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0,
              "stats_rate_hz": 10.0, "realtime_priority": 0, "inference_restarts": 0,
              "vision_reuse": reuse_kv, "vision_reuse_kv": reuse_kv}  # the incremental prefill of an HF VLA
    node = VlaAccelNode(context=rig.context, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    commands: list = []
    diagnostics: list = []
    rig.peer.create_subscription(Float64MultiArray, "/arm_controller/commands", commands.append, 100)
    rig.peer.create_subscription(DiagnosticArray, "/diagnostics", diagnostics.append, 50)
    joints = rig.peer.create_publisher(JointState, "/joint_states", 10)
    camera = rig.peer.create_publisher(Image, "/camera/image_raw", 10)
    rng = np.random.default_rng(0)

    def feed() -> None:
        k = 0
        pixels = rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)
        while not rig.stop.is_set():
            joints.publish(JointState(name=list(KIN.joint_names), position=Q.tolist()))
            if k % 5 == 0:
                if not reuse_kv:  # with reuse, a still scene: the same frame again and again
                    pixels = rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)
                camera.publish(Image(height=48, width=48, encoding="rgb8", step=144, data=pixels.tobytes()))
            k += 1
            rig.stop.wait(0.01)

    rig.spin(node, feed=feed)
    try:
        assert node.image_size == 32  # the processor's size, from the directory
        assert rig.wait(lambda: node.stats().get("policy_ticks", 0) >= 5, timeout=60.0), node.stats()
        before = node.stats()
        assert rig.wait(lambda: node.stats()["ticks"] >= before["ticks"] + 5)
        after = node.stats()
        assert after["ticks_published"] - before["ticks_published"] == after["ticks"] - before["ticks"]
        assert after["inference_errors"] == 0 and after["inference_actions"] > 0
        commands_now = np.array([c.data for c in commands[-10:]])
        assert np.all(np.isfinite(commands_now)) and all(KIN.within_limits(q) for q in commands_now)
        messages = " ".join(s.message for d in diagnostics for s in d.status)
        assert "does not record the robot" in messages  # an HF directory without a robot entry
        if decoder == "world_aware":
            assert "no contact head" in messages
        # a repeated frame reuses every image token's keys and values
        assert (after["inference_vision_recomputed_mean"] < 1.0) == reuse_kv, after
    finally:
        rig.close()
