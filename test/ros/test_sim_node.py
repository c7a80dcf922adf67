"""The MuJoCo bridge over real DDS, and whole episodes through topics (bridge + node processes)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

rclpy = pytest.importorskip("rclpy")
os.environ.setdefault("MUJOCO_GL", "egl")
from rclpy.parameter import Parameter  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray, String  # noqa: E402
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint  # noqa: E402

from vla_accel_ros.core.resources import default_checkpoint  # noqa: E402
from vla_accel_ros.ros.launcher import SimRunOptions, run_sim  # noqa: E402
from vla_accel_ros.ros.parameters import PolicySettings  # noqa: E402
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS  # noqa: E402
from vla_accel_ros.ros.sim_node import SimBridgeNode  # noqa: E402

torch.set_num_threads(1)
SHUFFLED = ["joint4", "joint1", "joint7", "joint2", "joint6", "joint3", "joint5"]


@pytest.fixture
def bridge(dds_rig):
    rig = dds_rig(30, "peer")
    node = SimBridgeNode(context=rig.context, parameter_overrides=[
        Parameter("seed", value=7), Parameter("color", value="green"),
        Parameter("controller_joints", value=SHUFFLED), Parameter("episode_duration_s", value=1.0)])
    rig.spin(node, executor="single")
    yield node, rig.peer
    rig.close()


@pytest.fixture
def wait(wait_until):
    return lambda predicate, timeout=8.0: wait_until(predicate, timeout)


def _collect(peer, msg_type, topic, qos=10) -> list:
    out: list = []
    peer.create_subscription(msg_type, topic, out.append, qos)
    return out


def test_bridge_publishes_robot_topics_and_applies_every_command_format(bridge, wait):
    node, peer = bridge
    description = _collect(peer, String, "/robot_description", LATCHED_QOS)
    joints = _collect(peer, JointState, "/joint_states")
    images = _collect(peer, Image, "/camera/image_raw")
    clock = _collect(peer, Clock, "/clock")
    instruction = _collect(peer, String, "/vla_accel_node/instruction")
    episodes = _collect(peer, String, "/sim_node/episode")
    assert wait(lambda: description and len(joints) > 20 and len(images) > 3 and clock)
    assert "<robot" in description[0].data
    assert not instruction and not episodes  # the first episode waits for the first arm command
    msg = joints[-1]
    assert list(msg.name) == [f"joint{i}" for i in range(1, 8)] + ["finger_joint1", "finger_joint2"]
    image = images[-1]
    assert (image.encoding, image.height, image.width, image.step) == ("rgb8", 128, 128, 384)
    t = [c.clock.sec + c.clock.nanosec * 1e-9 for c in clock]
    assert np.all(np.diff(t) > 0)

    def position(name: str) -> float:
        m = joints[-1]
        return dict(zip(m.name, m.position))[name]

    arm = peer.create_publisher(Float64MultiArray, "/arm_controller/commands", 10)
    trajectory = peer.create_publisher(JointTrajectory, "/arm_controller/joint_trajectory", 10)
    joint_command = peer.create_publisher(JointState, "/joint_command", 10)
    gripper = peer.create_publisher(Float64MultiArray, "/gripper_controller/commands", 10)
    home = dict(zip(msg.name, msg.position))
    # forward_position in the shuffled controller order: move joint1 only.
    target = dict(home, joint1=home["joint1"] + 0.2)
    assert wait(lambda: arm.publish(Float64MultiArray(data=[target[n] for n in SHUFFLED])) or
                 abs(position("joint1") - target["joint1"]) < 0.02)
    assert abs(position("joint4") - home["joint4"]) < 0.02
    assert wait(lambda: instruction) and instruction[-1].data == "pick up the green cube"
    # joint_trajectory by name: move joint7.
    target = dict(target, joint7=home["joint7"] - 0.3)
    point = JointTrajectoryPoint(positions=[target[n] for n in reversed(SHUFFLED)])
    assert wait(lambda: trajectory.publish(JointTrajectory(joint_names=list(reversed(SHUFFLED)), points=[point]))
                 or abs(position("joint7") - target["joint7"]) < 0.02)
    # JointState with fingers closes the gripper; then the gripper controller opens it again.
    names = ["finger_joint1", "finger_joint2"] + SHUFFLED
    assert wait(lambda: joint_command.publish(JointState(name=names,
                                                         position=[0.0, 0.0] + [target[n] for n in SHUFFLED]))
                 or position("finger_joint1") < 0.005)
    assert wait(lambda: gripper.publish(Float64MultiArray(data=[0.04, 0.04])) or position("finger_joint1") > 0.035)
    # The episode (1 s limit) ends and reports; a reset starts the next with the requested task.
    assert wait(lambda: episodes, timeout=5.0)
    report = json.loads(episodes[0].data)
    assert report["seed"] == 7 and report["color"] == "green" and report["success"] is False
    reset = peer.create_publisher(String, "/sim_node/reset", 10)
    assert wait(lambda: reset.publish(String(data=json.dumps({"seed": 3, "color": "blue"}))) or
                 instruction[-1].data == "pick up the blue cube")
    assert wait(lambda: len(episodes) >= 2, timeout=5.0)
    assert json.loads(episodes[-1].data)["seed"] == 3


def _episode_run(tmp_path, checkpoint, episodes, duration, domain, rate=20.0):
    opts = SimRunOptions(episodes=episodes, control_rate_hz=rate, out=str(tmp_path / "run"), seed=100_000,
                         policy=PolicySettings(checkpoint=str(checkpoint), decoder="kerv"), duration_s=duration,
                         domain_id=domain)
    summary = run_sim(opts, progress=False)
    stats = json.loads((tmp_path / "run" / "node_stats.json").read_text())
    return summary, stats


def test_episode_through_topics_with_a_random_policy(tmp_path, tiny_checkpoint):
    summary, stats = _episode_run(tmp_path, tiny_checkpoint(tmp_path / "ckpt"), episodes=1, duration=3.0, domain=31)
    for key in ("episodes", "success_rate", "ticks", "ticks_published", "deadline_misses", "fallback_ticks",
                "hold_ticks", "period_jitter_ms_p50", "period_jitter_ms_p99", "peak_rss_mb"):
        assert key in summary, key
    assert summary["episodes"] == 1
    # The ticks before the first episode (the node waiting with nothing to do) are told apart from
    # the episode's, whose hold share is the one to compare between runs.
    assert summary["pre_episode_ticks"] + summary["episode_ticks"] == summary["ticks"]
    assert summary["episode_hold_ticks"] <= summary["hold_ticks"]
    assert summary["hold_tick_share"] == pytest.approx(summary["episode_hold_ticks"] / summary["episode_ticks"])
    for plot in ("tick_jitter.png", "joint_tracking.png"):
        assert (tmp_path / "run" / plot).stat().st_size > 1000
    # Commands at the configured rate, all published once the inputs flow.
    ros = np.asarray(stats["tick_log"]["ros"])
    assert 1.0 / np.diff(ros).mean() == pytest.approx(20.0, rel=0.05)
    assert summary["policy_ticks"] > 20 and summary["ticks_published"] >= summary["ticks"] - 5
    # The policy's commands move the arm.
    measured = np.asarray(stats["tick_log"]["measured"], dtype=float)
    measured = measured[np.all(np.isfinite(measured), axis=1)]
    assert np.abs(measured - measured[0]).max() > 0.01


def test_trained_policy_moves_toward_the_named_cube(tmp_path):
    checkpoint = default_checkpoint()
    if not (checkpoint / "model.safetensors").is_file():
        pytest.skip(f"no trained checkpoint at {checkpoint} (train one with `vla-accel train`)")
    summary, _ = _episode_run(tmp_path, checkpoint, episodes=2, duration=6.0, domain=32)
    for episode in summary["per_episode"]:
        assert episode["min_clearance_m"] < episode["start_clearance_m"] - 0.05, episode
