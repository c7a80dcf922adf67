"""Property tests: whatever Image / JointState / instruction messages arrive, in whatever order and
with whatever stamps, nothing crashes and no command is NaN or outside the URDF limits.

The bulk runs the node's own decision path without DDS (its converters, ``Controller`` and a real
policy through :class:`~vla_accel_ros.rosbag.lockstep.LockstepCore`); a smaller sample goes through a real
node over DDS.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

rclpy = pytest.importorskip("rclpy")
from builtin_interfaces.msg import Time  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray, String  # noqa: E402

from vla_accel_ros.core.convert import image_to_rgb, joint_state_to_arm
from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402
from vla_accel_ros.ros.parameters import NodeConfig, PolicySettings  # noqa: E402
from vla_accel_ros.rosbag.lockstep import LockstepCore  # noqa: E402

torch.set_num_threads(1)
KIN = ArmKinematics(default_urdf())
ARM = list(KIN.joint_names)
FINGERS = list(KIN.gripper_joint_names)
Q_OK = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "RGB8": 3}
ODD_ENCODINGS = ["16UC1", "32FC1", "bayer_rggb8", "yuv422", "jpeg", "", "rgb16", "8UC3"]
SPECIAL = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 0.0, -0.0, 5e-324]
UINT32 = 2**32 - 1
_domains = iter(range(60, 70))


# --- strategies -----------------------------------------------------------------------------------
stamps = st.one_of(st.just(0), st.integers(0, 2**31 - 1))


@st.composite
def images(draw) -> Image:
    encoding = draw(st.sampled_from(list(CHANNELS) + ODD_ENCODINGS))
    channels = CHANNELS.get(encoding, draw(st.integers(1, 4)))
    small = st.integers(0, 40)
    h = draw(st.one_of(small, small, small, st.integers(0, UINT32)))
    w = draw(st.one_of(small, small, small, st.integers(0, UINT32)))
    if draw(st.integers(0, 3)) and h <= 40 and w <= 40:  # mostly well formed (rows may be padded)
        step = w * channels + draw(st.integers(0, 7))
        size = h * step + draw(st.sampled_from([0, 0, 0, -1, 1, -step]))
    else:
        step = draw(st.one_of(st.integers(0, 200), st.integers(0, UINT32)))
        size = draw(st.integers(0, 4000))
    seed = draw(st.integers(0, 2**16))
    data = np.random.default_rng(seed).integers(0, 256, max(size, 0), dtype=np.uint8).tobytes()
    msg = Image(height=h, width=w, encoding=encoding, step=step, is_bigendian=draw(st.integers(0, 1)), data=data)
    msg.header.stamp = Time(sec=draw(stamps), nanosec=draw(st.integers(0, 999_999_999)))
    return msg


def _position(name: str) -> st.SearchStrategy[float]:
    if name in ARM:
        i = ARM.index(name)
        inside = st.floats(float(KIN.limits.lower[i]), float(KIN.limits.upper[i]))
        return st.one_of(inside, inside, inside, st.floats(allow_nan=True, allow_infinity=True),
                         st.sampled_from(SPECIAL))
    return st.one_of(st.floats(-0.1, 0.1), st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def joint_states(draw) -> JointState:
    dropped = draw(st.one_of(st.just(set()), st.just(set()), st.sets(st.sampled_from(ARM), max_size=3)))
    extras = draw(st.lists(st.sampled_from(FINGERS + ["head_pan", "", "joint1", "wheel_left"]), max_size=3))
    names = draw(st.permutations([n for n in ARM if n not in dropped] + extras))
    positions = [draw(_position(n)) for n in names]
    cut = draw(st.sampled_from([0, 0, 0, 0, 1, -1]))  # sometimes one position too many or too few
    positions = positions[:-1] if cut == 1 else positions + [0.0] if cut == -1 else positions
    vectors = st.one_of(st.just([]), st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=9))
    msg = JointState(name=names, position=positions, velocity=draw(vectors), effort=draw(vectors))
    msg.header.stamp = Time(sec=draw(stamps), nanosec=draw(st.integers(0, 999_999_999)))
    return msg


instructions = st.one_of(st.just("pick up the red cube"), st.just(""), st.just("   "), st.text(max_size=40))
# seconds the node's clock moves before a message: forward mostly, sometimes back (a reset) or stalled
steps = st.one_of(st.just(0.01), st.just(0.01), st.just(0.01), st.floats(0.0, 0.3), st.floats(-1.0, 0.0))
events = st.lists(st.tuples(st.sampled_from(["image", "joints", "joints", "instruction"]), st.data(), steps),
                  min_size=5, max_size=8)


def _message(kind: str, data) -> object:
    if kind == "image":
        return data.draw(images())
    if kind == "joints":
        return data.draw(joint_states())
    return String(data=data.draw(instructions))


def _assert_safe(result) -> None:
    if result.q_command is None:
        return
    q = np.asarray(result.q_command)
    assert q.shape == (KIN.n,) and np.all(np.isfinite(q)), q
    assert KIN.within_limits(q), q
    fingers = np.asarray(result.finger_positions)
    assert np.all(np.isfinite(fingers))
    assert np.all(fingers >= KIN.gripper_limits.lower - 1e-12) and np.all(fingers <= KIN.gripper_limits.upper + 1e-12)


# --- the core, no DDS ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_checkpoint):
    return tiny_checkpoint(tmp_path_factory.mktemp("fuzz") / "ckpt", image_size=32)


def test_fuzzed_messages_never_crash_the_core_or_produce_unsafe_commands(ckpt):
    core = LockstepCore(NodeConfig(policy=PolicySettings(checkpoint=str(ckpt), decoder="kerv"), autostart=True,
                                   instruction="pick up the red cube"))
    state = {"t": 1000.0, "messages": 0, "commands": 0, "rejected": 0}
    good_image = Image(height=48, width=64, encoding="rgb8", step=192, data=bytes(48 * 192))

    @settings(max_examples=110, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(events)
    def run(evts) -> None:
        for kind, data, dt in evts:
            state["t"] += dt
            t_ns = max(int(state["t"] * 1e9), 0)
            msg = _message(kind, data)
            role = {"image": "camera", "joints": "joint_states", "instruction": "instruction"}[kind]
            errors = sum(core.errors.values())
            result = core.feed(role, msg, t_ns)
            state["rejected"] += sum(core.errors.values()) > errors
            state["messages"] += 1
            for r in (result, core.controller.tick(t_ns * 1e-9)):
                if r is not None:
                    _assert_safe(r)
                    state["commands"] += r.q_command is not None
        # a good joint state and frame after each burst: the core still works on sane input
        state["t"] += 0.01
        t_ns = int(state["t"] * 1e9)
        core.feed("joint_states", JointState(name=ARM, position=Q_OK.tolist()), t_ns)
        result = core.feed("camera", good_image, t_ns)
        _assert_safe(result)
        assert result.q_command is not None

    run()
    print(f"fuzz (core): {state} inferences={core.inferences}")
    assert state["messages"] >= 500, state
    assert state["rejected"] > 50 and state["commands"] > 100, state  # both paths were exercised
    assert core.inferences > 50


@settings(max_examples=200, deadline=None)
@given(images())
def test_image_converter_returns_a_model_image_or_a_clear_value_error(msg):
    try:
        rgb = image_to_rgb(msg, 32)
    except ValueError as err:
        assert str(err)
        return
    assert rgb.shape == (32, 32, 3) and rgb.dtype == np.uint8
    assert msg.encoding.lower() in CHANNELS and len(msg.data) == msg.height * msg.step


@settings(max_examples=200, deadline=None)
@given(joint_states())
def test_joint_state_converter_returns_finite_arm_positions_or_a_clear_value_error(msg):
    try:
        q, gripper = joint_state_to_arm(KIN, msg.name, msg.position)
    except ValueError as err:
        assert str(err)
        return
    assert q.shape == (KIN.n,) and np.all(np.isfinite(q))
    assert gripper is None or np.isfinite(gripper)
    by_name = dict(zip(msg.name, msg.position))
    assert [by_name[n] for n in ARM] == q.tolist()  # any order, extras ignored


# --- a sample over DDS ---------------------------------------------------------------------------
class FuzzRig:
    def __init__(self, dds_rig, ckpt) -> None:
        self.dds = dds_rig(next(_domains), "fuzzer")
        params = {"inference": True, "inference_mode": "thread", "checkpoint": str(ckpt), "autostart": True,
                  "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0}
        self.node = VlaAccelNode(context=self.dds.context, parameter_overrides=[Parameter(k, value=v)
                                                                                for k, v in params.items()])
        self.peer = self.dds.peer
        self.image = self.peer.create_publisher(Image, "/camera/image_raw", 10)
        self.joints = self.peer.create_publisher(JointState, "/joint_states", 10)
        self.instruction = self.peer.create_publisher(String, "/vla_accel_node/instruction", 10)
        self.commands: list[np.ndarray] = []
        self.peer.create_subscription(Float64MultiArray, "/arm_controller/commands",
                                      lambda m: self.commands.append(np.array(m.data)), 100)
        self.sent = 0
        self.dds.spin(self.node, feed=self._feed)

    def _feed(self) -> None:  # the sane robot underneath the fuzzing
        image = Image(height=32, width=32, encoding="rgb8", step=96, data=bytes(32 * 96))
        k = 0
        while not self.dds.stop.is_set():
            self.joints.publish(JointState(name=ARM, position=Q_OK.tolist()))
            if k % 5 == 0:
                self.image.publish(image)
            k += 1
            self.dds.stop.wait(0.01)

    def publish(self, kind: str, msg) -> None:
        {"image": self.image, "joints": self.joints, "instruction": self.instruction}[kind].publish(msg)
        self.sent += 1


def test_fuzzed_messages_over_dds_keep_the_node_running_and_safe(ckpt, dds_rig):
    rig = FuzzRig(dds_rig, ckpt)
    try:
        @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(events)
        def run(evts) -> None:
            for kind, data, _ in evts:
                rig.publish(kind, _message(kind, data))
                time.sleep(0.003)

        run()
        ticks = rig.node.stats()["ticks"]
        deadline = time.monotonic() + 10.0
        stats = rig.node.stats()  # one snapshot per check: the source changes from tick to tick
        while time.monotonic() < deadline and not (stats["ticks"] > ticks + 10 and stats["source"] == "policy"):
            time.sleep(0.05)
            stats = rig.node.stats()
        assert stats["ticks"] > ticks + 10 and stats["source"] == "policy", (
            stats["reason"], stats.get("inference_errors"), stats.get("inference_last_error"))
        print(f"fuzz (DDS): sent={rig.sent} input_errors={stats['input_errors']} commands={len(rig.commands)}")
        assert rig.sent >= 60 and stats["input_errors"] > 0
        q = np.array(rig.commands)
        assert len(q) > 10 and np.all(np.isfinite(q)) and all(KIN.within_limits(c) for c in q)
    finally:
        rig.dds.close()
