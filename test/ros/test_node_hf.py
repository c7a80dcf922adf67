"""The node over DDS with a tiny Hugging Face VLA (OpenVLA's layout, random weights): every tick
publishes, the policy drives, and what the policy lacks is said on /diagnostics."""

from __future__ import annotations

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("transformers")

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402

KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
_domains = iter(range(185, 195))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tiny_hf_vla):
    return tiny_hf_vla(tmp_path_factory.mktemp("hf") / "tiny_openvla")


@pytest.mark.parametrize("mode, decoder, reuse_kv", [("thread", "kerv", False), ("process", "world_aware", False),
                                                     ("thread", "kerv", True)])
def test_the_node_runs_a_hugging_face_vla_and_every_tick_publishes(dds_rig, policy_node_over_dds, hf_dir, mode, decoder,
                                                                    reuse_kv):
    rig = dds_rig(next(_domains), "robot")
    params = {"inference": True, "inference_mode": mode, "checkpoint": f"hf:{hf_dir}", "decoder": decoder,
              "autostart": True, "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0,
              "stats_rate_hz": 10.0, "realtime_priority": 0, "inference_restarts": 0,
              "vision_reuse": reuse_kv, "vision_reuse_kv": reuse_kv}  # the incremental prefill of an HF VLA
    try:
        # with reuse, a still scene: the same frame again and again
        node, after, diagnostics = policy_node_over_dds(rig, params, frame=(48, 48), still=reuse_kv, timeout=60.0)
        assert node.image_size == 32  # the processor's size, from the directory
        messages = " ".join(s.message for s in diagnostics)
        assert "does not record the robot" in messages  # an HF directory without a robot entry
        if decoder == "world_aware":
            assert "no contact head" in messages
        # a repeated frame reuses every image token's keys and values
        assert (after["inference_vision_recomputed_mean"] < 1.0) == reuse_kv, after
    finally:
        rig.close()
