"""The node over DDS with a tiny SmolVLA-layout policy (test/fixtures/lerobot/layout.py): the
checkpoint directory as the parameter names it, its tokenizer from the Hugging Face cache, every tick
publishes, the flow decoders' chunks drive the arm within its limits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("transformers")
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lerobot"
_spec = importlib.util.spec_from_file_location("lerobot_layout", FIXTURES / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)

KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
_domains = iter(range(231, 234))


@pytest.fixture(scope="module")
def smolvla_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layout.write_smolvla_dir(tmp_path_factory.mktemp("lerobot") / "smolvla_tiny")


@pytest.mark.parametrize("decoder", ["flow10", "flow2"])
def test_the_node_runs_a_smolvla_directory_and_every_tick_publishes(dds_rig, smolvla_dir, tmp_path, monkeypatch,
                                                                    decoder):
    monkeypatch.setenv("HF_HOME", str(layout.hf_cache(tmp_path / "hf")))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    rig = dds_rig(next(_domains), "robot")
    params = {"inference": True, "inference_mode": "thread", "checkpoint": str(smolvla_dir), "decoder": decoder,
              "autostart": True, "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0,
              "stats_rate_hz": 10.0, "realtime_priority": 0, "inference_restarts": 0, "vision_reuse": False}
    node = VlaAccelNode(context=rig.context, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    commands: list = []
    rig.peer.create_subscription(Float64MultiArray, "/arm_controller/commands", commands.append, 100)
    joints = rig.peer.create_publisher(JointState, "/joint_states", 10)
    camera = rig.peer.create_publisher(Image, "/camera/image_raw", 10)
    rng = np.random.default_rng(0)

    def feed() -> None:
        k = 0
        while not rig.stop.is_set():
            joints.publish(JointState(name=list(KIN.joint_names), position=Q.tolist()))
            if k % 5 == 0:
                pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
                camera.publish(Image(height=48, width=64, encoding="rgb8", step=192, data=pixels.tobytes()))
            k += 1
            rig.stop.wait(0.01)

    rig.spin(node, feed=feed)
    try:
        assert node.image_size == 128  # the policy's resize_imgs_with_padding
        assert rig.wait(lambda: node.stats().get("policy_ticks", 0) >= 5, timeout=120.0), node.stats()
        before = node.stats()
        assert rig.wait(lambda: node.stats()["ticks"] >= before["ticks"] + 5)
        after = node.stats()
        assert after["ticks_published"] - before["ticks_published"] == after["ticks"] - before["ticks"]
        assert after["inference_errors"] == 0 and after["inference_actions"] > 0
        commands_now = np.array([c.data for c in commands[-10:]])
        assert np.all(np.isfinite(commands_now)) and all(KIN.within_limits(q) for q in commands_now)
    finally:
        rig.close()
