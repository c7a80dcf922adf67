"""Inference in a child process (inference_mode: process): real children, real kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from vla_accel_ros.core.actions import JOINT_POSITION
from vla_accel_ros.core.controller import Controller, ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models.api import CheckpointRef, ResolvedCheckpoint
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.runtime.builder import RunnerConfig
from vla_accel_ros.runtime.process_worker import (
    ChildSpec,
    InferenceProcessError,
    ProcessInferenceWorker,
    describe_exit,
)

KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
IMAGE_SIZE = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_checkpoint) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", image_size=IMAGE_SIZE)


@pytest.fixture
def wait(wait_until):
    return lambda predicate, timeout=30.0: wait_until(predicate, timeout)


def spec_for(checkpoint: Path, decoder: str = "kerv") -> ChildSpec:
    runner = RunnerConfig(str(checkpoint), decoder, action_dt_s=0.05, period_s=0.05)
    return ChildSpec(runner, KIN.urdf_xml, KIN.tcp_frame)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Robot:
    """Feeds the controller like the node's callbacks (joints 100 Hz, camera 20 Hz) and ticks it
    at 20 Hz, keeping every tick's result."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.ticks: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        k = 0
        while not self._stop.is_set():
            now = time.monotonic()
            self.controller.on_joint_state(Q, 0.02, now)
            if k % 5 == 0:
                self.controller.on_image(rng.integers(0, 255, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8), now)
                self.ticks.append(self.controller.tick(now))
            k += 1
            self._stop.wait(0.01)

    def sources_since(self, n: int) -> set[str]:
        return {t.source for t in self.ticks[n:]}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)


def make_controller() -> Controller:
    ctrl = Controller(KIN, ControllerConfig(period_s=0.05))
    ctrl.set_enabled(True)
    ctrl.set_instruction("pick up the red cube")
    return ctrl


def test_actions_flow_and_a_killed_child_is_held_for_then_restarted(checkpoint, wait):
    ctrl = make_controller()
    worker = ProcessInferenceWorker(ctrl, spec_for(checkpoint), time.monotonic, max_restarts=2, restart_delay_s=0.2)
    worker.start()
    robot = Robot(ctrl)
    try:
        first = worker.pid
        assert worker.image_size == IMAGE_SIZE and first is not None and first != os.getpid() and pid_alive(first)
        assert wait(lambda: worker.stats()["actions"] >= 3)
        assert wait(lambda: "policy" in robot.sources_since(0))
        stats = worker.stats()
        assert stats["errors"] == 0 and stats["mode"] == "process" and stats["target_passes_mean"] >= 1.0
        assert stats["vision_recomputed_mean"] == 1.0  # full vision: every patch of every frame
        assert stats["latency_ms_p50"] >= stats["child_latency_ms_p50"] > 0.0
        assert stats["child_peak_rss_mb"] > 50.0  # the model lives in the child

        try:  # as the node does under realtime_priority: the feeder shares the control thread's GIL
            worker.set_realtime_priority(5)
            prioritised = True
        except PermissionError:  # not root, no CAP_SYS_NICE / rtprio limit
            prioritised = False
        os.kill(first, signal.SIGKILL)
        assert wait(lambda: not worker.alive, 5.0)
        n = len(robot.ticks)
        assert wait(lambda: len(robot.ticks) > n + 2, 5.0)
        held = [t for t in robot.ticks[n:] if t.source == "hold"]
        assert held, "the arm must hold while the inference process is down"
        assert "inference unavailable" in held[0].reason and "SIGKILL" in held[0].reason
        assert all(t.q_command is not None and KIN.within_limits(t.q_command) for t in robot.ticks[n:])

        assert wait(lambda: worker.alive and worker.pid not in (None, first), 30.0)
        assert not pid_alive(first)  # reaped, not a zombie
        n = len(robot.ticks)
        before = worker.stats()["actions"]
        assert wait(lambda: worker.stats()["actions"] > before + 2 and "policy" in robot.sources_since(n), 30.0)
        assert worker.stats()["restarts"] == 1 and worker.stats()["down_reason"] == ""
        assert ctrl.hold_reason == ""
        if prioritised:  # the restarted child (forked by the FIFO feeder) must not take a core at FIFO
            assert os.sched_getscheduler(worker.pid) == os.SCHED_OTHER
    finally:
        robot.close()
        last = worker.pid
        worker.stop()
    assert last is not None and not pid_alive(last)
    assert not worker.alive


def test_restarts_used_up_stays_down_in_hold_with_the_reason(checkpoint, wait):
    ctrl = make_controller()
    worker = ProcessInferenceWorker(ctrl, spec_for(checkpoint), time.monotonic, max_restarts=0)
    worker.start()
    robot = Robot(ctrl)
    try:
        pid = worker.pid
        assert wait(lambda: worker.stats()["actions"] >= 1)
        os.kill(pid, signal.SIGTERM)
        assert wait(lambda: "not restarting" in worker.stats()["down_reason"], 5.0)
        time.sleep(0.5)
        assert not worker.alive and worker.pid is None and not pid_alive(pid)
        last = robot.ticks[-1]
        assert last.source == "hold" and "SIGTERM" in last.reason and "not restarting" in last.reason
        assert worker.stats()["restarts"] == 0
    finally:
        robot.close()
        worker.stop()


def test_bad_checkpoint_and_decoder_are_refused_with_the_reason_and_no_child_left(checkpoint, tmp_path):
    (tmp_path / "model.json").write_text("{not json")
    worker = ProcessInferenceWorker(make_controller(), spec_for(tmp_path), time.monotonic)
    with pytest.raises(InferenceProcessError, match="model.json"):
        worker.start()
    assert worker.pid is None and not worker.alive
    with pytest.raises(ValueError, match="unknown decoder 'greedy'"):  # refused before any child starts
        spec_for(checkpoint, "greedy")
    children = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "runtime.process_worker"], capture_output=True,
                              text=True).stdout.split()
    assert children == []


def test_child_exits_when_the_node_process_is_killed(checkpoint, tmp_path, wait):
    """SIGKILL of the parent leaves no orphan: the child gets a parent-death signal. The parent itself
    never imports torch (the policy lives in the child)."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from vla_accel_ros.core.controller import Controller
        from vla_accel_ros.runtime.builder import RunnerConfig
        from vla_accel_ros.runtime.process_worker import ChildSpec, ProcessInferenceWorker
        from vla_accel_ros.core.kinematics import ArmKinematics
        from vla_accel_ros.core.resources import default_urdf
        kin = ArmKinematics(default_urdf())
        spec = ChildSpec(RunnerConfig({str(checkpoint)!r}, "kerv"), kin.urdf_xml, kin.tcp_frame)
        worker = ProcessInferenceWorker(Controller(kin), spec, time.monotonic)
        worker.start()
        print(worker.pid, "torch" in sys.modules, flush=True)
        time.sleep(60)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid, torch_loaded = parent.stdout.readline().split()
        child = int(pid)
        assert pid_alive(child) and torch_loaded == "False"
    finally:
        parent.kill()
        parent.wait()
    assert wait(lambda: not pid_alive(child), 10.0)


def test_child_spec_travels_as_json_with_its_vision_settings():
    vision = VisionReuseConfig(threshold=4.0, refresh_steps=7, reuse_kv=True)
    spec = ChildSpec(RunnerConfig("/ckpt", "sd", temperature=0.0, vision=vision, period_s=0.01, torch_threads=2),
                     KIN.urdf_xml, KIN.tcp_frame)
    assert ChildSpec.from_message(json.loads(json.dumps(spec.to_message()))) == spec
    plain = ChildSpec(RunnerConfig("/ckpt"), KIN.urdf_xml, KIN.tcp_frame)
    assert ChildSpec.from_message(json.loads(json.dumps(plain.to_message()))).runner.vision is None
    with pytest.raises(ValueError, match="urdf_xml"):
        ChildSpec(RunnerConfig(), " ", "tcp")


@pytest.mark.parametrize("checkpoint, family, config", [("/ckpt", "own", {"d_model": 32}),
                                                        ("hf:/ckpt", "hf", {"model_type": "llava"}),
                                                        ("openpi://127.0.0.1:8000", "openpi", None)])
def test_child_spec_carries_the_resolved_checkpoint_as_its_record(checkpoint, family, config):
    """The child loads what the parent resolved: its family, action space and config.json as read."""
    resolved = ResolvedCheckpoint(CheckpointRef.parse(checkpoint), family, JOINT_POSITION, config)
    spec = ChildSpec(RunnerConfig(checkpoint, "sd", resolved=resolved), KIN.urdf_xml, KIN.tcp_frame)
    assert ChildSpec.from_message(json.loads(json.dumps(spec.to_message()))).runner.resolved == resolved


def test_describe_exit_names_signals_and_codes():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"


# --- the node over DDS ----------------------------------------------------------------------------
def test_node_reports_a_dead_child_on_diagnostics_holds_and_shuts_down_cleanly(checkpoint, wait, dds_rig):
    pytest.importorskip("rclpy")
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray, String

    from vla_accel_ros.ros.node import VlaAccelNode

    rig = dds_rig(71, "robot")
    params = {"inference": True, "inference_mode": "process", "inference_restarts": 0, "checkpoint": str(checkpoint),
              "decoder": "kerv", "autostart": True, "instruction": "pick up the red cube",
              "robot_description_timeout_s": 0.0, "stats_rate_hz": 10.0, "control_rate_hz": 20.0}
    node = VlaAccelNode(context=rig.context, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    peer = rig.peer
    commands: list[tuple[float, list[float]]] = []
    diagnostics: list = []
    stats: list[dict] = []
    peer.create_subscription(Float64MultiArray, "/arm_controller/commands",
                             lambda m: commands.append((time.monotonic(), list(m.data))), 10)
    peer.create_subscription(DiagnosticArray, "/diagnostics", lambda m: diagnostics.extend(m.status), 10)
    peer.create_subscription(String, "/vla_accel_node/stats", lambda m: stats.append(json.loads(m.data)), 10)
    joints = peer.create_publisher(JointState, "/joint_states", 10)
    camera = peer.create_publisher(Image, "/camera/image_raw", 10)
    stop = rig.stop

    def feed() -> None:
        image = Image(height=IMAGE_SIZE, width=IMAGE_SIZE, encoding="rgb8", step=IMAGE_SIZE * 3)
        image.data = np.full((IMAGE_SIZE, IMAGE_SIZE, 3), 90, np.uint8).tobytes()
        k = 0
        while not stop.is_set():
            joints.publish(JointState(name=list(KIN.joint_names), position=Q.tolist()))
            if k % 5 == 0:
                camera.publish(image)
            k += 1
            stop.wait(0.01)

    rig.spin(node, executor="split", feed=feed)
    child = node.worker.pid if node.worker is not None else None
    try:
        assert child is not None and pid_alive(child)
        assert wait(lambda: bool(stats) and stats[-1]["inference_actions"] >= 3 and stats[-1]["policy_ticks"] > 0)
        applied: list[int] = []  # in a throw-away thread: FIFO must not leak into the test runner's
        prio_thread = threading.Thread(target=lambda: applied.append(node.apply_realtime_priority()))
        prio_thread.start()
        prio_thread.join()
        assert applied[0] in (0, node.cfg.realtime_priority)  # 0 where the system refuses SCHED_FIFO
        assert wait(lambda: stats[-1]["realtime_priority"] == applied[0], 5.0)
        os.kill(child, signal.SIGKILL)
        assert wait(lambda: any(s.level == DiagnosticStatus.ERROR and "SIGKILL" in s.message for s in diagnostics),
                    10.0)
        assert wait(lambda: stats[-1]["source"] == "hold" and "inference unavailable" in stats[-1]["reason"], 5.0)
        n = len(commands)
        assert wait(lambda: len(commands) >= n + 10, 5.0)  # every tick still publishes: the hold position
        held = np.array([c for _, c in commands[-4:]])  # (the first held ones may still ramp, rate-limited)
        assert np.all(np.isfinite(held)) and np.ptp(held, axis=0).max() < 1e-9
        assert stats[-1]["inference_alive"] is False
    finally:
        rig.close()
    assert not pid_alive(child)


def second_interpreter(root: Path) -> Path:
    """A virtual environment of its own (its own interpreter and site directory) that sees this
    one's packages through a .pth file, as a team's pinned venv would see this package after
    ``pip install --no-deps``."""
    import site
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = [f"import site; site.addsitedir({p!r})" for p in ours]  # runs the .pth files there too
    Path(purelib, "vla_accel_host.pth").write_text("\n".join(lines) + "\n")
    return python


def test_the_child_runs_under_another_interpreter(checkpoint, tmp_path, wait):
    python = second_interpreter(tmp_path / "pinned_venv")
    ctrl = make_controller()
    worker = ProcessInferenceWorker(ctrl, spec_for(checkpoint), time.monotonic, max_restarts=0, python=str(python))
    worker.start()
    robot = Robot(ctrl)
    try:
        assert worker.child_python == str(python) != sys.executable
        assert wait(lambda: worker.stats()["actions"] >= 3)  # the same protocol, no pickle
    finally:
        robot.close()
        worker.stop()
    with pytest.raises(ValueError, match="not an executable"):
        ProcessInferenceWorker(ctrl, spec_for(checkpoint), time.monotonic, python=str(tmp_path / "nope"))
