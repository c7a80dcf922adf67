"""The attacks of issue 42, each over DDS to the real node: nothing on the wire stops the control loop.

Each attack runs against a node (in this process, on its own single-threaded executor, the default,
its thread at ``realtime_priority`` as ``ros2 run`` runs it) while a peer plays the robot (joint
states at 100 Hz, a camera at 20 Hz, on the wall clock). For each one the test asserts that every
tick published a command, that no tick came later than the node's stall bound (3 periods), that no
arm or gripper command was unsafe (NaN or inf, outside the URDF limits, a step above velocity limit
x period from the one before) and that ``/diagnostics`` named the attack. The attacks: a PNG bomb
(130 kB declaring 32768 x 32768), a 10000 x 10000 rgb8 image (300 MB, sent from another process:
taking it would hold this one's interpreter), use_sim_time set at runtime, a 3-sample +-1 rad
glitch, a joint state from the future, a measured position beyond the limits, corrupt PNGs (libpng's
complaints throttled), a flood of long instructions, a gripper the policy flips every tick, a
callback that stalls the loop, and a clock that stops.

Every attack runs with a model inferring, once per policy (each policy's nodes start once, one at a
time: two nodes inferring at once would share the machine's cores): the shipped policy in the
inference child (``inference_mode: process``), a tiny random OpenVLA-layout model, and a tiny
SmolVLA-layout chunked policy with ``chunk_execution: async``. The gap bound is 3 periods; where an
attack's worst gap exceeds it, the node's stall monitor must name a cause, and the same node's worst
gap over a window without any attack, plus one period, is the bound applied instead when larger (the
assertion and the printed line say which bound was applied).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rcl_interfaces.msg import Log  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image, JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray, String  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402

KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
PERIOD = 0.05
BOUND = 3 * PERIOD  # the stall bound (stall_after_periods: 3) and the issue's
STEP = KIN.limits.velocity * PERIOD
FINGER_STEP = KIN.gripper_limits.velocity * PERIOD
QUIET_S = 1.5  # a window without any attack, for the node's baseline
ROSOUT = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
_domains = iter([*range(120, 130), *range(140, 150)])
POLICIES = ("shipped", "openvla", "smolvla")


def policy_params(name: str, root: Path, env: pytest.MonkeyPatch,
                  layout: Callable[[str], ModuleType]) -> dict[str, Any]:
    """The node parameters that run policy ``name`` in the inference child (``env``: what the child
    needs in its environment; ``layout``: the ``fixture_layout`` fixture)."""
    common = {"inference": True, "inference_mode": "process"}
    if name == "shipped":
        return common | {"checkpoint": ""}
    if name == "openvla":
        directory = layout("openvla").write_openvla_dir(root / "openvla-7b-finetuned-tiny")
        (directory / "vla_spec.json").write_text(json.dumps({"dtype": "float32"}))
        return common | {"checkpoint": str(directory), "decoder": "kerv"}
    lerobot = layout("lerobot")
    env.setenv("HF_HOME", str(lerobot.hf_cache(root / "hf")))  # the tokenizer stand-in, for the child too
    env.delenv("HF_HUB_CACHE", raising=False)
    return common | {"checkpoint": str(lerobot.write_smolvla_dir(root / "smolvla_tiny")), "decoder": "flow10",
                     "chunk_execution": "async"}


@dataclass
class Window:
    """What the node did while an attack ran."""

    ticks: list[tuple[float, int]]  # (wall, published) of each tick
    measured: np.ndarray  # the arm position each tick went by (the node's gated measurement)
    commands: np.ndarray  # every arm command the peer received, from the window's start
    fingers: np.ndarray
    stats_before: dict
    stats_after: dict
    diagnostics: list = field(default_factory=list)
    baseline: Callable[[], float] = lambda: 0.0  # the node's worst tick gap over its windows without any attack
    stall_causes: list[str] = field(default_factory=list)  # of the stalls the node saw meanwhile

    @property
    def gaps(self) -> np.ndarray:
        walls = np.array([w for w, _ in self.ticks])
        return np.diff(walls)


class Rig:
    """The node under test and a peer playing the robot (see the module docstring)."""

    def __init__(self, dds_rig, params: dict, *, compressed: bool = False, sim_time: bool = False) -> None:
        self.dds = dds_rig(next(_domains), "robot")
        self.peer = self.dds.peer
        self.compressed, self.sim_time = compressed, sim_time
        base = {"autostart": True, "instruction": "pick up the red cube",
                "robot_description_timeout_s": 0.0, "control_rate_hz": 1 / PERIOD, "stats_rate_hz": 10.0,
                "compressed_image": compressed, "image_reliable": True, "use_sim_time": sim_time}
        self.clock_pub = self.peer.create_publisher(Clock, "/clock", 10)
        self.sim_t = 1000.0
        self.clock_running = sim_time
        if sim_time:
            self.clock_pub.publish(Clock(clock=self.stamp(self.sim_t)))
        self.node = VlaAccelNode(context=self.dds.context,
                                 parameter_overrides=[Parameter(k, value=v) for k, v in (base | params).items()])
        self.joints = self.peer.create_publisher(JointState, "/joint_states", 10)
        self.camera = self.peer.create_publisher(CompressedImage if compressed else Image, "/camera/image_raw", 10)
        self.instruction = self.peer.create_publisher(String, "/vla_accel_node/instruction", 10)
        self._lock = threading.Lock()
        self.commands: list[np.ndarray] = []
        self.fingers: list[np.ndarray] = []
        self.diagnostics: list = []
        self.rosout: list[str] = []
        self.peer.create_subscription(Float64MultiArray, "/arm_controller/commands", self._on_command, 1000)
        self.peer.create_subscription(Float64MultiArray, "/gripper_controller/commands",
                                      lambda m: self.fingers.append(np.array(m.data)), 1000)
        self.peer.create_subscription(DiagnosticArray, "/diagnostics",
                                      lambda m: self.diagnostics.extend(m.status), 1000)
        self.peer.create_subscription(Log, "/rosout", lambda m: self.rosout.append(m.msg) if m.name ==
                                      "vla_accel_node" else None, ROSOUT)
        self.q = Q.copy()
        self.quiet_gaps: list[float] = []  # the worst tick gap of each window measured without any attack
        self.send_frames = True
        self.script: deque[tuple[np.ndarray, float]] = deque()  # samples to send instead: (q, stamp ahead by)
        rgb = np.full((48, 64, 3), 100, np.uint8)
        self.frame = (CompressedImage(format="png", data=cv2.imencode(".png", rgb)[1].tobytes()) if compressed
                      else Image(height=48, width=64, encoding="rgb8", step=192, data=rgb.tobytes()))
        self.wait = self.dds.wait
        self.dds.spin(self.node, executor="split", feed=self._feed, realtime=True)  # as ros2 run spins it

    @staticmethod
    def stamp(t: float):
        from builtin_interfaces.msg import Time

        ns = int(round(t * 1e9))
        return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)

    def now(self) -> float:
        return self.sim_t if self.sim_time else time.time()

    def _on_command(self, msg: Float64MultiArray) -> None:
        self.commands.append(np.array(msg.data))

    def _feed(self) -> None:
        k = 0
        while not self.dds.stop.is_set():
            with self._lock:
                if self.sim_time and self.clock_running:
                    self.sim_t += 0.01
                    self.clock_pub.publish(Clock(clock=self.stamp(self.sim_t)))
                q, ahead = self.script.popleft() if self.script else (self.q, 0.0)
                msg = JointState(name=list(KIN.joint_names) + ["finger_joint1", "finger_joint2"],
                                 position=q.tolist() + [0.04, 0.04])
                msg.header.stamp = self.stamp(self.now() + ahead)
                self.joints.publish(msg)
                if k % 5 == 0 and self.send_frames:
                    self.frame.header.stamp = self.stamp(self.now())
                    self.camera.publish(self.frame)
            k += 1
            self.dds.stop.wait(0.01)

    def settle(self) -> None:
        """Until the policy drives the arm (its first actions arrived and commanded ticks)."""
        assert self.wait(lambda: self.node.stats()["policy_ticks"] > 0 and len(self.commands) > 5,
                         timeout=180.0), self.node.stats()
        self.quiet_gaps.append(self.quiet_gap())

    def driving(self) -> bool:
        """The inputs are fresh and the model's actions (or the fallback between them) command the arm."""
        stats = self.node.stats()
        return stats["source"] != "hold" and stats["inference_alive"]

    def send_image(self, msg, times: int, every_s: float) -> None:
        """Publish ``msg`` on the camera topic ``times`` times, stamped now, ``every_s`` apart."""
        for _ in range(times):
            msg.header.stamp = self.stamp(self.now())
            self.camera.publish(msg)
            time.sleep(every_s)

    def inject(self, samples: list[tuple[np.ndarray, float]]) -> None:
        """Send these joint states, one per 10 ms, instead of the robot's; return once they are sent."""
        self.script.extend(samples)
        assert self.wait(lambda: not self.script)

    def attack(self, run: Callable[[], None], named: str | None, settle_s: float = 0.6) -> Window:
        """Run the attack, then let the node go on for ``settle_s``; what it did meanwhile, once
        ``/diagnostics`` has named ``named`` (WARN or ERROR)."""
        n_cmd, n_fingers, n_diag = len(self.commands), len(self.fingers), len(self.diagnostics)
        before = self.node.stats()
        start = time.monotonic()
        run()
        if named is not None:
            assert self.wait(lambda: self.diagnosed(named, n_diag), timeout=60.0), (named, self.node.stats())
        time.sleep(settle_s)
        after = self.node.stats()
        entries = [t for t in list(self.node.ticks.entries) if t[0] >= start]
        ticks = [(t[0], int(np.isfinite(t[3]).all())) for t in entries]
        measured = np.array([t[4] for t in entries])
        commands = np.array(self.commands[max(n_cmd - 1, 0):])  # the one before the window too: its step counts
        fingers = np.array(self.fingers[max(n_fingers - 1, 0):])
        causes = [stall.cause for stall in list(self.node._stalls._recent) if stall.ended >= start]
        return Window(ticks, measured, commands, fingers, before, after, self.diagnostics[n_diag:], self.baseline,
                      causes)

    def quiet_gap(self, duration_s: float = QUIET_S) -> float:
        """The largest gap between two ticks over ``duration_s`` without any attack."""
        start = time.monotonic()
        time.sleep(duration_s)
        walls = [t[0] for t in list(self.node.ticks.entries) if t[0] >= start]
        return float(np.diff(walls).max())

    def baseline(self) -> float:
        """The node's worst tick gap without any attack: over a window measured now and the one
        measured once the policy drove (the machine's load comes and goes)."""
        self.quiet_gaps.append(self.quiet_gap())
        return max(self.quiet_gaps)

    def diagnosed(self, words: str, since: int = 0) -> bool:
        return any(s.level >= b"\x01" and (words in s.message or any(words in kv.value for kv in s.values))
                   for s in list(self.diagnostics[since:]))

    def close(self) -> None:
        self.dds.close()


def assert_loop_kept_going(window: Window, *, model_ran: bool = True) -> None:
    """Every tick published, nothing unsafe on the arm or the gripper, the model inferring meanwhile
    (``model_ran``: when the attack leaves it fresh observations) and no tick later than the bound:
    3 periods, or where a gap exceeded that, the node's own worst gap over its windows without any
    attack (:meth:`Rig.baseline`) plus one period when that is larger (a loaded machine's gaps are
    not the attack's). A gap over 3 periods that the node's stall monitor names no cause for is a
    failure."""
    before, after = window.stats_before, window.stats_after
    ticks = after["ticks"] - before["ticks"]
    unsafe_arm, unsafe_gripper = unsafe(window.commands, STEP, KIN.limits), unsafe(window.fingers, FINGER_STEP,
                                                                                     KIN.gripper_limits)
    worst = float(window.gaps.max())
    bound, applied = BOUND, f"3 periods ({BOUND:.3f} s)"
    if worst > BOUND + 1e-3:
        baseline = window.baseline()
        said = f"the same node's worst gap without any attack ({baseline:.3f} s) + one period"
        if baseline + PERIOD > BOUND:
            bound, applied = baseline + PERIOD, f"{said} = {baseline + PERIOD:.3f} s, above 3 periods"
        else:
            applied += f", above {said}"
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]
    inferred = after["inference_actions"] - before["inference_actions"]
    print(f"{test}: {ticks} ticks, {after['ticks_published'] - before['ticks_published']} published, "
          f"{inferred} actions inferred, largest gap {worst:.3f} s (bound applied: {applied}), unsafe commands: "
          f"arm {unsafe_arm} of {len(window.commands)}, gripper {unsafe_gripper} of {len(window.fingers)}, "
          f"stall causes {window.stall_causes}")
    assert ticks >= 10 and after["ticks_published"] - before["ticks_published"] == ticks, (before, after)
    assert all(published for _, published in window.ticks)
    assert_safe(window.commands, window.fingers)
    assert after["inference_alive"], after["inference_down_reason"]
    if model_ran:
        assert inferred > 0, (before, after)
    if worst > BOUND + 1e-3:
        assert window.stall_causes and all(window.stall_causes), \
            f"a {worst:.3f} s gap, and the node's stall monitor named no cause: {window.stall_causes}"
    assert worst <= bound + 1e-3, f"a tick came {worst:.3f} s after the one before; bound applied: {applied}"
    if worst <= BOUND + 1e-3:
        assert after["stalls"] == before["stalls"]


def unsafe(commands: np.ndarray, step: np.ndarray, limits) -> int:
    """How many of ``commands`` are non-finite, outside ``limits`` or more than ``step`` from the one before."""
    if len(commands) == 0:
        return 0
    bad = ~np.isfinite(commands).all(axis=1)
    bad |= ((commands < limits.lower - 1e-9) | (commands > limits.upper + 1e-9)).any(axis=1)
    bad[1:] |= (np.abs(np.diff(commands, axis=0)) > step + 1e-9).any(axis=1)
    return int(bad.sum())


def assert_safe(commands: np.ndarray, fingers: np.ndarray) -> None:
    assert len(commands) > 5 and len(fingers) > 5
    assert unsafe(commands, STEP, KIN.limits) == 0 and unsafe(fingers, FINGER_STEP, KIN.gripper_limits) == 0


class Rigs:
    """The rigs of one policy, one node at a time: asking for another kind closes the one up."""

    def __init__(self, dds_rig, params: dict) -> None:
        self.dds_rig, self.params = dds_rig, params
        self.kind = ""
        self.rig: Rig | None = None

    def get(self, kind: str) -> Rig:
        if self.kind != kind:
            self.close()
            self.rig = Rig(self.dds_rig, self.params, compressed=kind == "compressed", sim_time=kind == "sim_time")
            self.kind = kind
            self.rig.settle()
        assert self.rig is not None
        return self.rig

    def close(self) -> None:
        if self.rig is not None:
            self.rig.close()
        self.rig, self.kind = None, ""


@pytest.fixture(scope="module", params=POLICIES)
def rigs(request, dds_rig, tmp_path_factory, fixture_layout):
    with pytest.MonkeyPatch.context() as env:
        root = tmp_path_factory.mktemp(request.param)
        held = Rigs(dds_rig, policy_params(request.param, root, env, fixture_layout))
        yield held
        held.close()


@pytest.fixture
def raw(rigs) -> Rig:
    return rigs.get("raw")


@pytest.fixture
def compressed(rigs) -> Rig:
    return rigs.get("compressed")


@pytest.fixture
def sim_time(rigs) -> Rig:
    return rigs.get("sim_time")


# --- images ---------------------------------------------------------------------------------------------
def test_a_png_bomb_is_refused_from_its_header_and_the_loop_never_notices(compressed, png_bomb):
    bomb = CompressedImage(format="png", data=png_bomb)
    assert 120_000 < len(bomb.data) < 140_000
    window = compressed.attack(lambda: compressed.send_image(bomb, 3, every_s=0.05),
                               "PNG of 32768x32768 (1073741824 pixels) exceeds max_image_pixels")
    assert_loop_kept_going(window)
    assert window.stats_after["camera_refused"] > window.stats_before["camera_refused"]
    assert compressed.wait(compressed.driving)  # the good frames go on


def test_corrupt_pngs_are_refused_and_libpng_is_heard_once(compressed):
    png = bytearray(compressed.frame.data)
    png[png.index(b"IDAT") + 6] ^= 0xFF  # in the image data: the header is fine, libpng finds the CRC error
    corrupt = CompressedImage(format="png", data=bytes(png))
    n_log = len(compressed.rosout)
    window = compressed.attack(lambda: compressed.send_image(corrupt, 20, every_s=0.02),
                               "cannot decode compressed image (PNG 64x48")
    assert_loop_kept_going(window)
    assert compressed.wait(lambda: any("libpng" in m for m in compressed.rosout[n_log:]), timeout=5.0)
    assert sum("libpng" in m for m in compressed.rosout[n_log:]) == 1  # throttled, not one line per image


ATTACKER = """
import sys, time, rclpy
from rclpy.duration import Duration
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
rclpy.init()
node = rclpy.create_node("attacker")
pub = node.create_publisher(Image, "/camera/image_raw", QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
side = 10000
msg = Image(height=side, width=side, encoding="rgb8", step=3 * side, data=bytes(3 * side * side))
deadline = time.monotonic() + 30.0
while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
msg.header.stamp = node.get_clock().now().to_msg()
pub.publish(msg)
print("published", flush=True)
pub.wait_for_all_acked(Duration(seconds=60))
"""


def test_a_10000x10000_raw_image_is_refused_undecoded_in_the_camera_process(raw):
    # The robot's camera pauses: a reliable reader keeping one message never completes a 300 MB sample
    # while small frames keep replacing it, so only a lone publisher gets it delivered (in ~7 s here).
    raw.send_frames = False
    # niced: the attacker's own work (300 MB to build and serialize) is not the node's to absorb
    env = dict(os.environ, ROS_DOMAIN_ID=str(raw.node.context.get_domain_id()))
    attacker = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", ATTACKER], env=env,
                                stdout=subprocess.DEVNULL)
    try:
        window = raw.attack(lambda: None, "rgb8 image of 10000x10000 (100000000 pixels) exceeds max_image_pixels")
    finally:
        raw.send_frames = True
        attacker.kill()
        attacker.wait()
    assert_loop_kept_going(window, model_ran=False)  # no new frame, no new observation: the child waits, alive
    assert "camera stale" in window.stats_after["hold_reason"] or window.stats_after["source"] != "hold"
    assert raw.wait(raw.driving, timeout=10.0)


# --- time --------------------------------------------------------------------------------------------------
def test_use_sim_time_set_at_runtime_is_refused_with_a_reason(raw):
    client = raw.peer.create_client(SetParameters, "/vla_accel_node/set_parameters")
    assert client.wait_for_service(timeout_sec=5.0)
    results: list = []

    def send() -> None:
        request = SetParameters.Request(parameters=[Parameter("use_sim_time", value=True).to_parameter_msg()])
        future = client.call_async(request)
        assert raw.wait(future.done)
        results.extend(future.result().results)

    window = raw.attack(send, "use_sim_time is fixed once the node is configured")
    assert not results[0].successful and "use_sim_time is fixed once the node is configured" in results[0].reason
    assert raw.node.get_parameter("use_sim_time").value is False
    assert_loop_kept_going(window)


def test_a_joint_state_from_the_future_is_refused_and_the_good_ones_go_on(raw):
    def attack() -> None:
        raw.inject([(raw.q, 0.45)])  # once made the next 0.45 s of good samples look out of order
        time.sleep(0.6)

    window = raw.attack(attack, "s ahead of the node's clock (future_stamp_tolerance_s = 0.05)", settle_s=0.0)
    assert_loop_kept_going(window)
    # the good samples after it were taken: the future one is the only input refused
    assert window.stats_after["input_errors"] - window.stats_before["input_errors"] == 1


# --- joint states -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_three_sample_glitch_of_one_radian_is_never_followed(raw, sign):
    glitch = raw.q + sign * np.eye(KIN.n)[1]  # joint2, within its limits either way
    window = raw.attack(lambda: raw.inject([(glitch, 0.0)] * 3), "joint-state outlier(s) gated")
    assert_loop_kept_going(window)
    assert window.stats_after["outliers_rejected"] - window.stats_before["outliers_rejected"] >= 3
    assert window.stats_after["jumps_accepted"] == window.stats_before["jumps_accepted"]
    # no tick went by the glitch: the policy's commands came from the robot's true position
    np.testing.assert_allclose(window.measured, np.tile(raw.q, (len(window.measured), 1)), atol=1e-6)


def test_a_measured_position_beyond_the_limits_is_a_fault_and_a_hold(raw):
    beyond = raw.q.copy()
    beyond[0] = KIN.limits.upper[0] + 3.0  # once accepted after 3 samples
    window = raw.attack(lambda: raw.inject([(beyond, 0.0)] * 50), "outside its limits")
    assert_loop_kept_going(window)
    assert window.stats_after["hold_ticks"] > window.stats_before["hold_ticks"]
    assert window.stats_after["jumps_accepted"] == window.stats_before["jumps_accepted"]
    # the node went by the last valid position throughout: the one beyond the limits was never taken
    np.testing.assert_allclose(window.measured, np.tile(raw.q, (len(window.measured), 1)), atol=1e-6)
    assert raw.wait(raw.driving)


# --- the rest ------------------------------------------------------------------------------------------------
def test_the_gripper_flipped_every_tick_moves_at_most_its_velocity_limit_per_tick(raw):
    stop = threading.Event()

    def flip() -> None:  # a policy closing and opening the gripper at every tick
        k = 0
        while not stop.is_set():
            now = raw.node.get_clock().now().nanoseconds * 1e-9
            raw.node.controller.on_action(np.array([0, 0, 0, 0, 0, 0, float(k % 2)]), now, now)
            k += 1
            stop.wait(PERIOD)

    def attack() -> None:
        thread = threading.Thread(target=flip, daemon=True)
        thread.start()
        time.sleep(1.5)
        stop.set()
        thread.join()

    window = raw.attack(attack, None, settle_s=0.3)
    assert_loop_kept_going(window)
    assert window.stats_after["policy_ticks"] > window.stats_before["policy_ticks"] + 10
    steps = np.abs(np.diff(window.fingers, axis=0)).max(axis=1)
    print(f"gripper: largest step {steps.max():.5f} m against v*T = {FINGER_STEP.max():.5f} m over "
          f"{len(window.fingers)} commands, the policy flipping it every tick")
    assert steps.max() == pytest.approx(FINGER_STEP.max())  # the clamp, not the policy, set the pace


def test_a_flood_of_long_instructions_is_refused_or_logged_cut_and_throttled(raw, capfd):
    # The node's console log, not /rosout: rcl keeps one /rosout publisher per node name in a process,
    # the first one's (the compressed rig's, in another domain, when both rigs are up).
    capfd.readouterr()

    def flood() -> None:
        raw.instruction.publish(String(data="x" * 1_000_000))  # above max_instruction_chars: refused
        for k in range(20):  # accepted, each 900 characters: logged cut, at most once a second
            raw.instruction.publish(String(data=f"{k} " + "pick up the red cube " * 43))
            time.sleep(0.02)

    window = raw.attack(flood, "instruction rejected: 1000000 characters, more than max_instruction_chars")
    assert_loop_kept_going(window)
    time.sleep(1.0)  # a change held back by the throttle is never logged later: nothing more comes
    console = capfd.readouterr()
    logged = [line.split("]: ", 1)[1] for line in (console.out + console.err).splitlines()
              if "[vla_accel_node]: instruction: " in line]
    assert 1 <= len(logged) <= 3 and all(len(m) < 300 for m in logged), logged  # of 20 changes of 900 characters
    for status in window.diagnostics:
        values = {kv.key: kv.value for kv in status.values}
        assert len(values["instruction"]) < 300 and len(values["instruction_sha256"]) == 16
    raw.instruction.publish(String(data="pick up the red cube"))
    assert raw.wait(lambda: raw.node.controller.instruction == "pick up the red cube")


def test_a_callback_that_stalls_the_loop_is_named_on_diagnostics(raw):
    original = raw.node.controller.on_joint_state
    slow = threading.Event()

    def stalling(*args, **kwargs):
        if not slow.is_set():
            slow.set()
            time.sleep(0.4)  # on the executor's only thread: the tick waits
        return original(*args, **kwargs)

    n_diag = len(raw.diagnostics)
    raw.node.controller.on_joint_state = stalling
    try:
        assert raw.wait(lambda: raw.diagnosed("likely cause: /joint_states callback ran 0.4", n_diag), timeout=10.0)
    finally:
        raw.node.controller.on_joint_state = original
    stats = raw.node.stats()
    assert stats["stalls"] >= 1 and stats["longest_tick_gap_s"] >= 0.4
    status = next(s for s in raw.diagnostics[n_diag:] if "likely cause" in s.message)
    assert status.level >= b"\x01" and "control loop stalled" in status.message


# --- the clock (last: the node of this kind is the policy's last) ------------------------------------------
def test_a_stopped_clock_is_caught_by_the_wall_clock_watchdog(sim_time):
    rig = sim_time

    def stop() -> None:
        rig.clock_running = False

    window = rig.attack(stop, "clock stopped", settle_s=1.0)
    # the watchdog takes over once the clock has stood for 0.5 s, then one command per period
    assert window.gaps.max() <= 0.5 + PERIOD + 0.05, window.gaps.max()
    # checked every half period, it ticks once a period or, just missed, half a period later
    assert PERIOD - 0.01 <= np.percentile(window.gaps[window.gaps < 0.3], 50) <= 1.5 * PERIOD + 0.01
    status = next(s for s in window.diagnostics if "clock stopped" in s.message)
    assert status.level == b"\x02"  # ERROR
    assert rig.node.stats()["source"] == "hold"
    assert_safe(window.commands, window.fingers)
    assert window.stats_after["inference_alive"]
    rig.clock_running = True
    assert rig.wait(lambda: rig.node.stats()["clock_fault"] == "" and rig.driving())
