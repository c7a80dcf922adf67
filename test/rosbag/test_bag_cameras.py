"""Record and replay with two cameras: the bag carries the scene and the wrist camera, a two-camera
chunked policy replays bit for bit in lock-step, and over DDS the node takes both cameras again."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("rclpy")
os.environ.setdefault("MUJOCO_GL", "egl")

from vla_accel_ros.models.own.checkpoint import save_flow_heads  # noqa: E402
from vla_accel_ros.models.own.flow import FlowHeadConfig, FlowHeads  # noqa: E402
from vla_accel_ros.ros.parameters import PolicySettings  # noqa: E402
from vla_accel_ros.rosbag.io import TOPICS, open_bag  # noqa: E402
from vla_accel_ros.rosbag.recorder import RecordOptions, record  # noqa: E402
from vla_accel_ros.rosbag.replay_settings import ReplayOptions  # noqa: E402
from vla_accel_ros.rosbag.replayer import replay  # noqa: E402

torch.set_num_threads(1)
DOMAIN_ID = 226


@pytest.fixture(scope="module")
def two_camera_bag(tmp_path_factory, tiny_checkpoint) -> Path:
    work = tmp_path_factory.mktemp("two_cameras")
    checkpoint = tiny_checkpoint(work / "ckpt")
    torch.manual_seed(0)
    heads = FlowHeads(FlowHeadConfig(d_model=32, hidden=32, layers=1, horizon=4, cameras=2))
    save_flow_heads(heads, checkpoint, {"note": "random weights"}, {})
    bag = work / "bag"
    record(RecordOptions(episodes=1, out=str(bag), mode="deterministic", duration_s=1.0, cameras=2,
                         policy=PolicySettings(checkpoint=str(checkpoint), decoder="flow2")), progress=False)
    return bag


def test_the_bag_carries_both_cameras_at_every_frame(two_camera_bag):
    with open_bag(two_camera_bag) as bag:
        scene, wrist = bag.count(TOPICS["camera"][0]), bag.count(TOPICS["wrist_camera"][0])
        assert scene > 0 and wrist == scene
        stamps = {name: [m.log_ns for m in bag.messages([TOPICS[name][0]])] for name in ("camera", "wrist_camera")}
        assert stamps["camera"] == stamps["wrist_camera"]  # one instant, two cameras
        images = [np.frombuffer(m.msg.data, np.uint8) for m in bag.messages([TOPICS["camera"][0],
                                                                            TOPICS["wrist_camera"][0]])][:2]
        assert not np.array_equal(images[0], images[1])  # two different views
        assert bag.custom.get("cameras") == 2


def test_a_two_camera_chunked_policy_replays_bit_for_bit(two_camera_bag, tmp_path):
    runs = [replay(ReplayOptions(bag=str(two_camera_bag), out=str(tmp_path / f"out{k}")), progress=False)
            for k in range(2)]
    for s in runs:
        assert s["commands"] > 0 and s["unsafe_commands"] == 0
        assert s["max_abs_diff"] == 0.0  # the recorded commands, exactly
        assert s["input_topics"]["wrist_camera"] == TOPICS["wrist_camera"][0]
        assert not s["errors"], s["errors"]
    assert runs[0]["sources"].get("policy", 0) > 0  # the chunks were executed, not only the fallback


def test_over_dds_the_node_takes_both_cameras_again(two_camera_bag, tmp_path):
    s = replay(ReplayOptions(bag=str(two_camera_bag), mode="realtime", out=str(tmp_path / "rt"),
                             summary=str(tmp_path / "rt_summary"), domain_id=DOMAIN_ID), progress=False)
    # realtime: a frame may reach the node before the node's clock has taken the /clock that covers it
    # (refused as from the future when that lag exceeds the tolerance and the clock's last step)
    errors = [e for e in s["errors"] if "ahead of the node's clock" not in e]
    assert s["commands"] > 0 and s["unsafe_commands"] == 0 and not errors, errors
    log = Path(s["node_log"]).read_text()
    assert f"cameras ['{TOPICS['camera'][0]}', '{TOPICS['wrist_camera'][0]}']" in log  # the node took both
    assert "image slots" not in log  # and the policy's two image slots were satisfied
