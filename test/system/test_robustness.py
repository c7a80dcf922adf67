"""Bad input and faults, as a table, against the real node over DDS (rclpy), sim time from a /clock.

Every case: the node names the problem (logged once per kind, on /rosout; raised on /diagnostics),
keeps publishing, never publishes NaN or anything outside the URDF limits, and recovers by itself.
Faults additionally leave the policy within 2 ticks (fallback or hold) and the watchdog faults
hold within their watchdog + 2 ticks. Start-up problems (bad URDF, bad checkpoint) refuse to start
with a message naming the file; a broken bag makes ``vla-accel replay`` exit non-zero.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

rclpy = pytest.importorskip("rclpy")
from builtin_interfaces.msg import Time  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rcl_interfaces.msg import Log  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray, String  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.core.settings import ConfigError  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS  # noqa: E402

torch.set_num_threads(1)
KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
NAMES = list(reversed(KIN.joint_names)) + ["finger_joint2", "finger_joint1"]  # any order, fingers extra
PERIOD = 0.05
CAMERA_TIMEOUT, JOINT_TIMEOUT = 0.15, 0.1
ROSOUT = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
_domains = iter(range(45, 60))


def stamp(t: float) -> Time:
    ns = int(round(t * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def encode(encoding: str, rgb: np.ndarray, pad: int = 0) -> Image:
    """An RGB array as a sensor_msgs/Image in ``encoding`` (rows padded by ``pad`` bytes)."""
    conversions = {"rgb8": None, "bgr8": cv2.COLOR_RGB2BGR, "rgba8": cv2.COLOR_RGB2RGBA,
                   "bgra8": cv2.COLOR_RGB2BGRA, "mono8": cv2.COLOR_RGB2GRAY}
    pixels = rgb if conversions[encoding] is None else cv2.cvtColor(rgb, conversions[encoding])
    h, w = pixels.shape[:2]
    row = pixels.reshape(h, -1)
    rows = np.zeros((h, row.shape[1] + pad), np.uint8)
    rows[:, : row.shape[1]] = row
    return Image(height=h, width=w, encoding=encoding, step=rows.shape[1], data=rows.tobytes())


class FaultyRunner:
    """The node's real PolicyRunner with injectable faults: raise, or hang until released."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.mode = ""
        self.release = threading.Event()
        # Set when a call actually meets the fault: an inference already running when the fault is
        # injected still finishes normally, so the fault starts here, not at injection.
        self.engaged = threading.Event()

    def __call__(self, obs):
        if self.mode == "raise":
            self.engaged.set()
            raise RuntimeError("injected fault: the decoder crashed")
        if self.mode == "hang":
            self.engaged.set()
            self.release.wait(10.0)
        return self.runner(obs)


class Rig:
    """The node under test (inference in a thread, sim time) and a peer playing the robot: /clock
    at 100 Hz, joint states at 100 Hz and camera at 20 Hz, all stamped with sim time."""

    def __init__(self, dds_rig, ckpt: Path) -> None:
        self.dds = dds_rig(next(_domains), "robot")
        self.peer = self.dds.peer
        params = {"inference": True, "inference_mode": "thread", "checkpoint": str(ckpt), "decoder": "kerv",
                  "autostart": True, "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0,
                  "use_sim_time": True, "control_rate_hz": 1 / PERIOD, "camera_timeout_s": CAMERA_TIMEOUT,
                  "joint_state_timeout_s": JOINT_TIMEOUT, "stats_rate_hz": 10.0,
                  "stats_file": str(ckpt.parent / "stats.json")}  # keeps every tick: ticks() indexes the run
        self.sim_t = 1000.0
        self._clock = self.peer.create_publisher(Clock, "/clock", 10)
        self._clock.publish(Clock(clock=stamp(self.sim_t)))
        self.node = VlaAccelNode(context=self.dds.context,
                                 parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
        self.faulty = FaultyRunner(self.node.worker.runner)
        self.node.worker.runner = self.faulty
        self.joints = self.peer.create_publisher(JointState, "/joint_states", 10)
        self.camera = self.peer.create_publisher(Image, "/camera/image_raw", 10)
        self.instruction = self.peer.create_publisher(String, "/vla_accel_node/instruction", 10)
        self.description = self.peer.create_publisher(String, "/robot_description", LATCHED_QOS)
        self.commands: list[np.ndarray] = []
        self.diagnostics: list[DiagnosticArray] = []
        self.rosout: list[str] = []
        self.peer.create_subscription(Float64MultiArray, "/arm_controller/commands",
                                      lambda m: self.commands.append(np.array(m.data)), 100)
        self.peer.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 100)
        self.peer.create_subscription(Log, "/rosout", lambda m: self.rosout.append(m.msg) if m.name ==
                                      "vla_accel_node" else None, ROSOUT)
        self.send_images = self.send_joints = True
        self.frame = ("rgb8", np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8))
        self._lock = threading.Lock()
        self.wait = self.dds.wait
        self.dds.spin(self.node, feed=self._feed)

    def _feed(self) -> None:
        k = 0
        while not self.dds.stop.is_set():
            with self._lock:
                self.sim_t += 0.01
                now = stamp(self.sim_t)
                self._clock.publish(Clock(clock=now))
                if self.send_joints:
                    msg = JointState(name=NAMES, position=list(reversed(Q.tolist())) + [0.03, 0.03])
                    msg.header.stamp = now
                    self.joints.publish(msg)
                if self.send_images and k % 5 == 0:
                    image = encode(*self.frame)
                    image.header.stamp = now
                    self.camera.publish(image)
            k += 1
            self.dds.stop.wait(0.01)

    def jump_clock(self, by: float) -> None:
        with self._lock:
            self.sim_t += by

    def ticks(self) -> list[tuple[float, str]]:
        """(sim stamp, source) of every tick so far."""
        names = {0: "policy", 1: "fallback", 2: "hold"}
        return [(t[1], names[t[2]]) for t in list(self.node.ticks.entries)]

    def diagnosed(self, words: str, since: int = 0) -> bool:
        for diag in self.diagnostics[since:]:
            for status in diag.status:
                if words in status.message or any(words in kv.value for kv in status.values):
                    return status.level >= b"\x01"  # WARN or ERROR
        return False

    def close(self) -> None:
        self.faulty.release.set()
        self.dds.close()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_checkpoint) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("robust") / "ckpt")


@pytest.fixture(scope="module")
def rig(ckpt, dds_rig):
    r = Rig(dds_rig, ckpt)
    assert r.wait(lambda: r.node.stats()["policy_ticks"] > 5, timeout=30.0), r.node.stats()
    yield r
    r.close()


# --- inputs a real robot produces -----------------------------------------------------------------
ENCODINGS = ("rgb8", "bgr8", "rgba8", "bgra8", "mono8")
SIZES = ((1, 1), (7, 13), (64, 64), (480, 640), (720, 1280))


def _scene(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.dstack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) % 256)]).astype(np.uint8)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("h, w", SIZES)
def test_every_encoding_at_any_size_becomes_the_model_image(encoding, h, w):
    from vla_accel_ros.core.convert import image_to_rgb

    rgb = _scene(h, w)
    expected = rgb if encoding != "mono8" else np.repeat(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)
    expected = cv2.resize(expected, (64, 64), interpolation=cv2.INTER_AREA) if (h, w) != (64, 64) else expected
    for pad in (0, 3):
        out = image_to_rgb(encode(encoding, rgb, pad), 64)
        assert out.shape == (64, 64, 3) and out.dtype == np.uint8
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("fmt, tolerance", [("png", 0.0), ("jpeg", 6.0)])
@pytest.mark.parametrize("h, w", [(33, 17), (480, 640)])
def test_compressed_jpeg_and_png_are_decoded_and_resized(fmt, tolerance, h, w):
    from sensor_msgs.msg import CompressedImage

    from vla_accel_ros.core.convert import compressed_to_rgb

    rgb = _scene(h, w)
    ok, data = cv2.imencode(f".{fmt.replace('jpeg', 'jpg')}", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    out = compressed_to_rgb(CompressedImage(format=fmt, data=data.tobytes()), 64)
    expected = cv2.resize(rgb, (64, 64), interpolation=cv2.INTER_AREA)
    assert out.shape == (64, 64, 3) and np.abs(out.astype(float) - expected).mean() <= tolerance


def test_joint_states_in_any_order_with_extras_and_no_velocity_or_effort():
    from vla_accel_ros.core.convert import joint_state_to_arm

    names = ["finger_joint2", "joint5", "head_pan", "joint1", "joint7", "joint3", "finger_joint1", "joint2",
             "joint6", "joint4"]
    by_name = dict(zip(KIN.joint_names, Q)) | {"finger_joint1": 0.02, "finger_joint2": 0.03, "head_pan": 9.0}
    q, gripper = joint_state_to_arm(KIN, names, [by_name[n] for n in names])
    np.testing.assert_array_equal(q, Q)
    assert gripper == pytest.approx(0.025)
    q, gripper = joint_state_to_arm(KIN, list(reversed(KIN.joint_names)), list(reversed(Q.tolist())))
    np.testing.assert_array_equal(q, Q)
    assert gripper is None  # no finger joints: the gripper opening is left as it was


@pytest.mark.parametrize("encoding, h, w", [("bgr8", 480, 640), ("mono8", 31, 47), ("rgba8", 480, 640),
                                            ("bgra8", 64, 64)])
def test_the_running_node_takes_each_encoding_and_size_without_complaint(rig, encoding, h, w):
    errors = rig.node.stats()["input_errors"]
    inferences = rig.node.stats()["inference_actions"]
    rig.frame = (encoding, _scene(h, w))
    try:
        assert rig.wait(lambda: rig.node.stats()["inference_actions"] > inferences + 5)
        assert rig.node.stats()["input_errors"] == errors, rig.node.stats()
        # not holding: a tick may catch a large frame still on its way through the camera child, the next does not
        assert rig.wait(lambda: rig.node.stats()["source"] != "hold", timeout=5.0), rig.node.stats()
    finally:
        rig.frame = ("rgb8", _scene(48, 64))


# --- the cases ------------------------------------------------------------------------------------
def _image(**fields) -> Image:
    base = dict(height=8, width=8, encoding="rgb8", step=24, data=bytes(192))
    return Image(**(base | fields))


def bad_image(**fields) -> Callable[[Rig], None]:
    def send(rig: Rig) -> None:
        msg = _image(**fields)
        msg.header.stamp = stamp(rig.sim_t)
        rig.camera.publish(msg)
    return send


def bad_joints(names: list[str], positions: list[float], stamp_offset: float = 0.0) -> Callable[[Rig], None]:
    def send(rig: Rig) -> None:
        msg = JointState(name=names, position=positions)
        msg.header.stamp = stamp(rig.sim_t + stamp_offset)
        rig.joints.publish(msg)
    return send


def bad_compressed(rig: Rig) -> None:
    msg = _image(encoding="jpeg", data=b"\xff\xd8 this is not a jpeg")
    msg.header.stamp = stamp(rig.sim_t)
    rig.camera.publish(msg)


def empty_instruction(rig: Rig) -> None:
    rig.instruction.publish(String(data="   "))


ARM = list(KIN.joint_names)
Q_ARM = Q.tolist()


@dataclass(frozen=True)
class Case:
    name: str
    send: Callable[[Rig], None]
    message: str  # part of the report (log, last_input_error, /diagnostics)


BAD_INPUT = [
    Case("unknown encoding", bad_image(encoding="16UC1", step=16, data=bytes(128)),
         "unsupported image encoding '16UC1'"),
    Case("data longer than step x height", bad_image(data=bytes(200)), "does not match step 24 x height 8"),
    Case("data shorter than step x height", bad_image(data=bytes(100)), "too small for 8x8 rgb8"),
    Case("step smaller than a row", bad_image(step=20, data=bytes(160)), "step 20 is smaller than width 8"),
    Case("zero-sized image", bad_image(height=0, step=24, data=b""), "image has size 8x0"),
    Case("not an image (jpeg bytes on an rgb8 topic)", bad_compressed, "unsupported image encoding 'jpeg'"),
    Case("NaN joint position", bad_joints(ARM, Q_ARM[:2] + [float("nan")] + Q_ARM[3:]), "joint3=nan"),
    Case("inf joint position", bad_joints(ARM, Q_ARM[:6] + [float("inf")]), "joint7=inf"),
    Case("missing arm joints", bad_joints(ARM[:5], Q_ARM[:5]), "missing arm joints: joint6, joint7"),
    Case("names and positions differ in length", bad_joints(ARM, Q_ARM[:6]), "7 joint names but 6 positions"),
    Case("arm joint named twice", bad_joints(ARM + ["joint2"], Q_ARM + [0.0]), "named more than once: joint2"),
    Case("timestamp going backwards", bad_joints(ARM, Q_ARM, stamp_offset=-0.05), "older than the previous one"),
    Case("empty instruction", empty_instruction, "instruction rejected: it is empty"),
]


def _commands_safe(commands: list[np.ndarray]) -> None:
    assert commands, "no commands published"
    q = np.array(commands)
    assert np.all(np.isfinite(q)) and all(KIN.within_limits(c) for c in q)
    steps = np.abs(np.diff(q, axis=0))
    assert np.all(steps <= KIN.limits.velocity * PERIOD + 1e-9), steps.max(axis=0)


@pytest.mark.parametrize("case", BAD_INPUT, ids=[c.name for c in BAD_INPUT])
def test_bad_input_is_named_once_raised_on_diagnostics_and_the_node_keeps_running(rig, case):
    n_cmd, n_diag, n_log = len(rig.commands), len(rig.diagnostics), len(rig.rosout)
    ticks_before = rig.node.stats()["ticks"]
    sent = [0]

    def send() -> None:
        if sent[0] < 12:  # best effort: repeat until it arrives, several times within the throttle
            case.send(rig)
            sent[0] += 1

    assert rig.wait(lambda: case.message in rig.node.stats()["last_input_error"] and sent[0] >= 12, every=send), \
        rig.node.stats()["last_input_error"]
    assert rig.wait(lambda: rig.diagnosed(case.message, n_diag), timeout=5.0)
    logged = [m for m in rig.rosout[n_log:] if case.message in m]
    assert len(logged) <= 1  # throttled per kind (0 if the same kind was logged by an earlier case)
    assert any(case.message in m for m in rig.rosout), "never logged"
    # keeps running on the good inputs, back to the policy, and everything published was safe
    assert rig.wait(lambda: rig.node.stats()["source"] == "policy" and rig.node.stats()["ticks"] > ticks_before + 5)
    assert rig.node.controller.instruction == "pick up the red cube"
    _commands_safe(rig.commands[n_cmd:])


def _first_non_policy_after(rig: Rig, index: int) -> int:
    """How many ticks after ``index`` the first non-policy tick came (1 = the next tick)."""
    for k, (_, source) in enumerate(rig.ticks()[index:], start=1):
        if source != "policy":
            return k
    return 10**6


def _hold_start_delay(rig: Rig, index: int, t_fault: float) -> float:
    """Sim seconds from the fault to the first hold tick."""
    for t, source in rig.ticks()[index:]:
        if source == "hold":
            return t - t_fault
    return float("inf")


def fault_camera_stops(rig: Rig):
    rig.send_images = False
    return lambda: setattr(rig, "send_images", True)


def fault_joint_states_stop(rig: Rig):
    rig.send_joints = False
    return lambda: setattr(rig, "send_joints", True)


def fault_worker_raises(rig: Rig):
    rig.faulty.mode = "raise"
    return lambda: setattr(rig.faulty, "mode", "")


def fault_inference_hangs(rig: Rig):
    rig.faulty.release.clear()
    rig.faulty.mode = "hang"

    def recover() -> None:
        rig.faulty.mode = ""
        rig.faulty.release.set()
    return recover


def fault_clock_jumps_back(rig: Rig):
    rig.jump_clock(-5.0)
    return lambda: None


def fault_description_late_and_different(rig: Rig):
    urdf = default_urdf().read_text()
    other = urdf.replace('name="joint7"', 'name="wrist3"').replace("<joint_name>joint7", "<joint_name>wrist3")
    assert other != urdf
    rig.description.publish(String(data=other))
    return lambda: rig.description.publish(String(data=urdf))


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[Rig], Callable[[], None]]  # returns what ends the fault
    message: str  # on /diagnostics
    policy_stops: bool  # policy ticks end within 2 ticks (fallback or hold)
    hold_within: float | None  # sim seconds from the fault to the first hold tick (watchdog + 2 ticks)


FAULTS = [
    Fault("camera stops", fault_camera_stops, "camera stale", True, CAMERA_TIMEOUT + 2 * PERIOD),
    # The images still come: the policy acts on the last joint state until its watchdog.
    Fault("joint states stop", fault_joint_states_stop, "joint states stale", False, JOINT_TIMEOUT + 2 * PERIOD),
    Fault("inference worker raises", fault_worker_raises, "injected fault: the decoder crashed", True, None),
    Fault("inference hangs for many periods", fault_inference_hangs, "no fresh policy action", True, None),
    # Inputs keep coming on the new timeline: the policy may go on at once with fresh ones (no action
    # from before the jump is used: see test_clock_jump_back_drops_the_old_timeline below).
    Fault("clock jumps back", fault_clock_jumps_back, "time went backwards by", False, None),
    Fault("robot description appears late and differs", fault_description_late_and_different,
          "robot_description received after start-up names arm joints", True, 1.0),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_faults_leave_the_policy_within_two_ticks_are_reported_and_recover(rig, fault):
    assert rig.wait(lambda: rig.node.stats()["source"] == "policy")
    n_cmd, n_diag = len(rig.commands), len(rig.diagnostics)
    index, t_fault = len(rig.ticks()), rig.sim_t
    rig.faulty.engaged.clear()
    recover = fault.inject(rig)
    try:
        if fault.inject in (fault_inference_hangs, fault_worker_raises):
            assert rig.wait(rig.faulty.engaged.is_set)
            index = len(rig.ticks())
        assert rig.wait(lambda: rig.diagnosed(fault.message, n_diag), timeout=8.0), rig.node.stats()
        assert rig.wait(lambda: len(rig.ticks()) > index + 3)
        if fault.inject is fault_clock_jumps_back:  # count from the first tick on the new timeline
            index = next(i for i, (t, _) in enumerate(rig.ticks()) if i >= index and t < t_fault - 1.0)
            t_fault = rig.ticks()[index][0] - PERIOD
        if fault.policy_stops:
            # When the camera stops, the frame sent just before may still be in inference; its
            # action is legitimately used at the next tick, so the two ticks count from then.
            allowed = 3 if fault.inject is fault_camera_stops else 2
            assert _first_non_policy_after(rig, index) <= allowed, rig.ticks()[index:index + 5]
        if fault.hold_within is not None:
            assert rig.wait(lambda: rig.node.stats()["source"] == "hold")
            # + one period: the last messages sent before the fault may reach the node a tick late
            # on a loaded machine (seen once in CI: 0.23 s against 0.20), and staleness counts from them.
            assert _hold_start_delay(rig, index, t_fault) <= fault.hold_within + PERIOD, rig.ticks()[index:index + 8]
    finally:
        recover()
    assert rig.wait(lambda: rig.node.stats()["source"] == "policy", timeout=10.0), rig.node.stats()["reason"]
    ticks = rig.node.stats()["ticks"]
    assert rig.wait(lambda: rig.node.stats()["ticks"] > ticks + 5)  # and it keeps ticking
    _commands_safe(rig.commands[n_cmd:])


def test_clock_jump_back_drops_the_old_timeline():
    """The core under the node: a pending action and the filter from before the jump are dropped,
    the input not yet seen on the new timeline counts as stale (hold), then control resumes."""
    from vla_accel_ros.core.controller import Controller, ControllerConfig

    ctrl = Controller(KIN, ControllerConfig(period_s=PERIOD, fallback_max_s=1.0))  # the fallback outlasts the setup
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)
    image = np.zeros((64, 64, 3), np.uint8)
    for k in range(10):
        ctrl.on_joint_state(Q, 0.03, 100.0 + k * PERIOD)
        ctrl.on_image(image, 100.0 + k * PERIOD)
        assert ctrl.tick(100.0 + k * PERIOD).source != "hold"
    ctrl.on_action(np.array([0.01, 0, 0, 0, 0, 0, 1.0]), 100.45, 100.45)  # pending when the clock jumps
    assert "time went backwards by" in ctrl.on_joint_state(Q, 0.03, 50.0)
    held = ctrl.tick(50.01)
    assert held.source == "hold" and "ahead: the clock went back" in held.reason
    np.testing.assert_allclose(held.q_command, Q, atol=1e-9)
    assert "time went backwards by" in ctrl.on_image(image, 50.02)
    resumed = ctrl.tick(50.05)
    assert resumed.source == "fallback" and "no fresh action" in resumed.reason  # the old action is gone
    assert ctrl.stats.actions_used == 0


def test_late_description_that_matches_changes_nothing(rig):
    rig.description.publish(String(data=default_urdf().read_text()))
    time.sleep(0.5)
    # A loaded CI box can cost a stale-input hold tick now and then; what must not happen is a hold
    # for the description (a mismatch holds until restart, with robot_description in the reason).
    n_policy = rig.node.stats()["policy_ticks"]
    assert rig.wait(lambda: rig.node.stats()["policy_ticks"] >= n_policy + 5, timeout=10.0), rig.node.stats()
    assert "robot_description" not in rig.node.stats()["hold_reason"]


# --- start-up -------------------------------------------------------------------------------------
def _bad_urdf_file(tmp: Path) -> dict:
    (tmp / "broken.urdf").write_text("<robot name='x'><link name='a'/><joint name='j' type='revolute'>")
    return {"urdf_file": str(tmp / "broken.urdf")}


def _bad_checkpoint_dir(tmp: Path, ckpt: Path) -> dict:
    bad = tmp / "bad_ckpt"
    bad.mkdir()
    for f in ckpt.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = next(bad.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: 100])
    return {"inference": True, "checkpoint": str(bad)}


STARTUP = [
    ("URDF path that does not exist", lambda tmp, ck: {"urdf_file": "/nonexistent/arm.urdf"}, "/nonexistent/arm.urdf"),
    ("URDF that does not parse", lambda tmp, ck: _bad_urdf_file(tmp), "broken.urdf"),
    ("checkpoint path that does not exist", lambda tmp, ck: {"inference": True, "checkpoint": "/nonexistent/ckpt"},
     "/nonexistent/ckpt"),
    ("truncated checkpoint weights", _bad_checkpoint_dir, "bad_ckpt"),
]


@pytest.mark.parametrize("params, words", [(p, w) for _, p, w in STARTUP], ids=[n for n, _, _ in STARTUP])
def test_bad_urdf_or_checkpoint_at_start_up_refuses_with_the_file_named(tmp_path, ckpt, ros_context, params, words):
    with ros_context(next(_domains)) as context:
        overrides = {"inference": False, "inference_mode": "thread", "robot_description_timeout_s": 0.0,
                     "autostart": True}
        overrides |= params(tmp_path, ckpt)
        with pytest.raises(ConfigError) as err:
            VlaAccelNode(context=context, parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
        assert words in str(err.value)


def test_a_broken_bag_makes_replay_exit_non_zero(tmp_path, ckpt, capsys):
    from vla_accel_ros.cli import main
    from vla_accel_ros.rosbag.io import TOPICS, BagWriter, make_image, make_joint_state

    bag = tmp_path / "bag"
    with BagWriter(bag) as writer:
        for k in range(20):
            t = 10**12 + k * 50_000_000
            writer.write(TOPICS["joint_states"][0], t, make_joint_state(KIN.joint_names, Q, t))
            writer.write(TOPICS["camera"][0], t, make_image(cv2.resize(np.zeros((8, 8, 3), np.uint8), (64, 64)), t))
    data = next(bag.glob("*.mcap"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert main(["replay", str(bag), "--checkpoint", str(ckpt), "--instruction", "x", "--timeout-s", "30"]) == 2
    err = capsys.readouterr().err
    assert str(bag) in err and ("truncated or corrupt" in err or "cannot be opened" in err), err
