"""The policy on another node over DDS (inference_mode: remote): actions come back stamped with
their observation, the round trip is measured, and a lost or late message costs a fallback,
counted, never a missing tick."""

from __future__ import annotations

import threading

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray, String  # noqa: E402
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.observation import Observation  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.ros import remote_protocol  # noqa: E402
from vla_accel_ros.ros.inference_node import VlaInferenceNode  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS  # noqa: E402

KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
BEST_EFFORT = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST)
RELIABLE = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
_domains = iter(range(80, 90))


def test_the_wire_format_round_trips_and_refuses_what_is_not_an_action():
    obs = Observation(np.full((8, 8, 3), 7, np.uint8), "pick up the red cube", Q, 0.03, 1234.5)
    state = remote_protocol.state_message(obs, KIN.joint_names)
    back = remote_protocol.observation_from(obs.image, state, obs.instruction, KIN.joint_names)
    np.testing.assert_array_equal(back.joint_pos, Q)
    assert back.gripper == 0.03 and back.stamp == pytest.approx(1234.5)
    chunk = np.arange(21, dtype=float).reshape(3, 7) / 100
    msg = remote_protocol.action_message(chunk, state.header.stamp, {"target_passes": 1, "decode_ms": 2.5})
    answer = remote_protocol.action_from(msg)
    np.testing.assert_array_equal(answer.actions, chunk)
    assert answer.obs_stamp == pytest.approx(1234.5) and answer.stats["target_passes"] == 1
    assert answer.stats["decode_ms"] == 2.5
    # a chunk is a trajectory: stamped with its observation's time, one point per action step
    assert isinstance(msg, JointTrajectory) and list(msg.joint_names)[-1] == "gripper"
    assert [p.time_from_start.nanosec for p in msg.points] == [0, 50_000_000, 100_000_000]
    nan_point = JointTrajectoryPoint(positions=[float("nan")] * 7)
    for bad in (JointTrajectory(joint_names=["x"], points=msg.points), JointTrajectory(joint_names=msg.joint_names),
                JointTrajectory(joint_names=msg.joint_names, points=[JointTrajectoryPoint(positions=[0.1])]),
                JointTrajectory(joint_names=msg.joint_names, points=[nan_point])):
        with pytest.raises(ValueError):
            remote_protocol.action_from(bad)
    jpeg = remote_protocol.compressed_image_message(obs)
    assert jpeg.format == "jpeg" and remote_protocol.stamp_key(jpeg.header.stamp) == remote_protocol.stamp_key(
        state.header.stamp)
    with pytest.raises(ValueError, match="gripper"):
        remote_protocol.observation_from(obs.image, JointState(name=list(KIN.joint_names), position=Q.tolist()),
                                         "x", KIN.joint_names)


class RemoteRig:
    """A control node in namespace ``arm`` (remote inference), an inference node serving the robot
    ``far``, and the test between them: it relays the observations and the actions, dropping or
    delaying what ``drop``/``delay`` say (the network's losses, injected at the receiving side)."""

    def __init__(self, dds_rig, ckpt, drop=lambda kind, k: False, delay=lambda k: 0.0) -> None:
        self.dds = dds_rig(next(_domains), "robot")
        ctx, peer = self.dds.context, self.dds.peer
        self.node = VlaAccelNode(context=ctx, namespace="arm", parameter_overrides=[Parameter(k, value=v) for k, v in {
            "inference": True, "inference_mode": "remote", "autostart": True, "instruction": "pick up the red cube",
            "robot_description_timeout_s": 0.0, "stats_rate_hz": 10.0, "control_rate_hz": 20.0,
            "remote_lost_after_s": 0.3, "action_timeout_s": 0.4, "image_size": 64}.items()])
        self.inference = VlaInferenceNode(context=ctx, parameter_overrides=[Parameter(k, value=v) for k, v in {
            "robots": ["far"], "checkpoint": str(ckpt), "decoder": "kerv"}.items()])
        self.commands: list = []
        peer.create_subscription(Float64MultiArray, "/arm/arm_controller/commands", self.commands.append, 100)
        self.joints = peer.create_publisher(JointState, "/arm/joint_states", 10)
        self.camera = peer.create_publisher(Image, "/arm/camera/image_raw", 10)
        relayed = {"image": 0, "state": 0, "action": 0}
        self.relayed, self.dropped = relayed, {"image": 0, "state": 0, "action": 0}
        pubs = {"image": peer.create_publisher(Image, f"/far/{remote_protocol.IMAGE_TOPIC}", BEST_EFFORT),
                "state": peer.create_publisher(JointState, f"/far/{remote_protocol.STATE_TOPIC}", BEST_EFFORT),
                "task": peer.create_publisher(String, f"/far/{remote_protocol.INSTRUCTION_TOPIC}", LATCHED_QOS),
                "action": peer.create_publisher(JointTrajectory, f"/arm/{remote_protocol.ACTION_TOPIC}", RELIABLE)}
        self._timers: list[threading.Timer] = []

        def relay(kind):
            def forward(msg):
                k = relayed[kind] + self.dropped[kind]
                if drop(kind, k):
                    self.dropped[kind] += 1
                    return
                relayed[kind] += 1
                wait = delay(k) if kind == "action" else 0.0
                if wait > 0:
                    timer = threading.Timer(wait, pubs[kind].publish, args=(msg,))
                    self._timers.append(timer)
                    timer.start()
                else:
                    pubs[kind].publish(msg)
            return forward

        peer.create_subscription(Image, f"/arm/{remote_protocol.IMAGE_TOPIC}", relay("image"), BEST_EFFORT)
        peer.create_subscription(JointState, f"/arm/{remote_protocol.STATE_TOPIC}", relay("state"), BEST_EFFORT)
        peer.create_subscription(String, f"/arm/{remote_protocol.INSTRUCTION_TOPIC}", pubs["task"].publish,
                                 LATCHED_QOS)
        peer.create_subscription(JointTrajectory, f"/far/{remote_protocol.ACTION_TOPIC}", relay("action"), RELIABLE)
        image = Image(height=64, width=64, encoding="rgb8", step=192, data=np.full(64 * 64 * 3, 80, np.uint8).tobytes())

        def feed() -> None:
            k = 0
            while not self.dds.stop.is_set():
                self.joints.publish(JointState(name=list(KIN.joint_names), position=Q.tolist()))
                if k % 5 == 0:
                    self.camera.publish(image)
                k += 1
                self.dds.stop.wait(0.01)

        self.dds.spin(self.node, feed=feed, others=(self.inference,))

    def wait_for_policy(self, n: int = 10) -> bool:
        return self.dds.wait(lambda: self.node.stats().get("policy_ticks", 0) >= n, timeout=60.0)

    def remote(self) -> dict:
        return {k[len("inference_"):]: v for k, v in self.node.stats().items() if k.startswith("inference_")}

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self.dds.close()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_checkpoint):
    return tiny_checkpoint(tmp_path_factory.mktemp("remote") / "ckpt")


def test_remote_round_trip_and_counts(dds_rig, ckpt):
    rig = RemoteRig(dds_rig, ckpt)
    try:
        assert rig.wait_for_policy(10), rig.node.stats()
        remote = rig.remote()
        # an answer is unmatched only when it comes after its observation was given up (here: the
        # first ones, while DDS discovery completes)
        assert remote["mode"] == "remote" and remote["actions"] >= 10 and remote["unmatched"] <= 2
        assert 0 < remote["round_trip_ms_p50"] <= remote["round_trip_ms_p99"] < 400
        assert remote["action_age_ms_p50"] >= remote["round_trip_ms_p50"] * 0.5
        served = rig.inference.stats()["robots"]["far"]
        assert served["answered"] >= remote["actions"] and served["errors"] == 0
        before = rig.node.stats()
        assert rig.dds.wait(lambda: rig.node.stats()["ticks"] >= before["ticks"] + 5)
        after = rig.node.stats()
        assert after["ticks_published"] - before["ticks_published"] == after["ticks"] - before["ticks"]
    finally:
        rig.close()


def test_lost_and_late_messages_cost_a_fallback_counted(dds_rig, ckpt):
    rng = np.random.default_rng(7)
    lost = set(rng.choice(np.arange(4, 60), size=12, replace=False).tolist())
    late = set(rng.choice(np.arange(4, 60), size=6, replace=False).tolist()) - lost
    rig = RemoteRig(dds_rig, ckpt, drop=lambda kind, k: (kind == "state" and k in lost),
                    delay=lambda k: 0.6 if k in late else 0.0)  # 0.6 s > action_timeout_s
    try:
        assert rig.dds.wait(lambda: rig.remote().get("lost", 0) >= 3 and rig.remote().get("dropped_late", 0) >= 1
                            and rig.node.stats().get("policy_ticks", 0) >= 10, timeout=90.0), (
            list(rig.remote().items())[3:12], rig.dropped, rig.relayed)
        stats = rig.node.stats()
        assert stats["fallback_ticks"] + stats["hold_ticks"] > 0
        before = rig.node.stats()
        assert rig.dds.wait(lambda: rig.node.stats()["ticks"] >= before["ticks"] + 5)
        after = rig.node.stats()
        assert after["ticks_published"] - before["ticks_published"] == after["ticks"] - before["ticks"]
        commands = np.array([c.data for c in rig.commands])
        assert np.all(np.isfinite(commands))
        assert np.all(np.abs(np.diff(commands, axis=0)) <= KIN.limits.velocity * 0.05 + 1e-9)
    finally:
        rig.close()


@pytest.mark.parametrize("compressed", [False, True], ids=["raw", "jpeg"])
def test_one_inference_node_serves_two_robots_in_two_namespaces(dds_rig, ckpt, compressed):
    rig = dds_rig(next(_domains), "robots")
    params = {"inference": True, "inference_mode": "remote", "autostart": True, "instruction": "pick up the red cube",
              "robot_description_timeout_s": 0.0, "stats_rate_hz": 10.0, "image_size": 64,
              "remote_compressed_image": compressed}
    nodes = {ns: VlaAccelNode(context=rig.context, namespace=ns,
                              parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
             for ns in ("left", "right")}
    server = VlaInferenceNode(context=rig.context, parameter_overrides=[
        Parameter("robots", value=["left", "right"]), Parameter("checkpoint", value=str(ckpt)),
        Parameter("decoder", value="world_aware")])
    poses = {"left": Q, "right": Q + 0.2}
    publishers = {ns: (rig.peer.create_publisher(JointState, f"/{ns}/joint_states", 10),
                       rig.peer.create_publisher(Image, f"/{ns}/camera/image_raw", 10)) for ns in nodes}
    image = Image(height=64, width=64, encoding="rgb8", step=192, data=np.full(64 * 64 * 3, 80, np.uint8).tobytes())

    def feed() -> None:
        k = 0
        while not rig.stop.is_set():
            for ns, (joints, camera) in publishers.items():
                joints.publish(JointState(name=list(KIN.joint_names), position=poses[ns].tolist()))
                if k % 5 == 0:
                    camera.publish(image)
            k += 1
            rig.stop.wait(0.01)

    rig.spin(nodes["left"], feed=feed, others=(nodes["right"], server))
    try:
        assert rig.wait(lambda: all(n.stats().get("policy_ticks", 0) >= 10 for n in nodes.values()), timeout=60.0)
        served = server.stats()["robots"]
        assert served["left"]["answered"] > 0 and served["right"]["answered"] > 0
        for node in nodes.values():
            assert node.stats()["inference_unmatched"] <= 2  # no answers meant for the other robot
    finally:
        rig.close()
