"""The inference worker as a child process: the policy's Python glue never holds the node's GIL.

``inference_mode: process`` (the node's default): a thread beside the control timer shares one interpreter,
so every Python step between torch operators can delay a tick by up to a switch interval. Here the
policy (the ``PolicyRunner`` that :func:`~vla_accel_ros.runtime.builder.build_runner` makes of the
node's ``RunnerConfig``: checkpoint, decoder, episode history) lives in a child interpreter; the
node keeps a small feeder thread that does what ``InferenceWorker`` does (newest observation from
``Controller.wait_observation``, actions to ``Controller.on_action_chunk``) but hands the decoding over:

- image: written into a shared memory buffer (a Linux memfd passed to the child: it has no name,
  so nothing is left in /dev/shm when either side is killed);
- everything else: small JSON messages over a Unix socket pair (no pickle), one request in flight,
  so the buffer is never written while the child reads it.

Child death (crash, OOM kill, signal) is noticed within ~0.1 s: the controller holds the measured
position with the reason (``Controller.set_inference_fault``, shown on /diagnostics), the child is
restarted up to ``max_restarts`` times, then the worker stays down and says why. ``stop()`` ends
the child (asked, then SIGTERM, then SIGKILL) and the child also exits by itself when the node
dies (parent-death signal, socket EOF). Run as ``python -m vla_accel_ros.runtime.process_worker`` only
by the worker. ROS-free.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_accel_ros.core.controller import Controller
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.runtime.builder import RunnerConfig
from vla_accel_ros.runtime.thread_worker import StepReport, WorkerBase, percentile

if TYPE_CHECKING:
    from vla_accel_ros.runtime.runner import PolicyRunner

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # spawn + import torch + load the checkpoint, on a loaded machine
REPLY_TIMEOUT_S = 30.0  # one decode taking this long means a hung child: kill and restart it
STOP_TIMEOUT_S = 3.0
POLL_S = 0.05  # how often a waiting feeder looks at the child and the stop flag
PR_SET_PDEATHSIG = 1


class InferenceProcessError(ValueError):
    """The inference process could not be started; the message says why (checkpoint, decoder...)."""


@dataclass(frozen=True)
class ChildSpec:
    """What the child needs to build the same runner the thread mode would: the runner's settings and
    the arm (URDF and TCP frame) its Kalman filter models."""

    runner: RunnerConfig
    urdf_xml: str
    tcp_frame: str

    def __post_init__(self) -> None:
        if not self.urdf_xml.strip():
            raise ValueError("ChildSpec.urdf_xml must hold the URDF")

    def to_message(self) -> dict[str, Any]:
        """The spec as JSON-ready values (the child's ``init`` message; :meth:`RunnerConfig.to_json`:
        a resolved checkpoint goes as its record, which the child loads without reading it again)."""
        return {"runner": self.runner.to_json(), "urdf_xml": self.urdf_xml, "tcp_frame": self.tcp_frame}

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> ChildSpec:
        """The spec an ``init`` message carries (the inverse of :meth:`to_message`)."""
        return cls(RunnerConfig.from_json(message["runner"]), str(message["urdf_xml"]), str(message["tcp_frame"]))


def send_json(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message).encode())


def recv_json(conn: Connection) -> dict[str, Any]:
    return json.loads(conn.recv_bytes())


def peak_rss_mb(pid: int) -> float:
    """Peak resident set size (MiB) of a live process; 0.0 when it is gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def describe_exit(returncode: int | None) -> str:
    """'exit code 3' / 'killed by SIGKILL' for a child's return code."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def stop_child(proc: subprocess.Popen[bytes], conn: Connection, timeout_s: float) -> None:
    """Ask a child process that speaks ``send_json`` to exit ({"op": "stop"}), then SIGTERM, then
    SIGKILL, ``timeout_s`` each; always reaps it and closes ``conn``."""
    if proc.poll() is None:
        try:
            send_json(conn, {"op": "stop"})
        except OSError:
            pass
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and proc.poll() is None:
                proc.send_signal(sig)
            try:
                proc.wait(timeout_s)
                break
            except subprocess.TimeoutExpired:
                continue
    proc.wait()
    conn.close()


class _Child:
    """One running child process: its handle, socket and image buffer (parent side)."""

    def __init__(self, spec: ChildSpec, timeout_s: float, python: str = "") -> None:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.memfd = os.memfd_create("vla_accel_image", os.MFD_CLOEXEC)
        self.buffer: mmap.mmap | None = None
        self.conn = Connection(parent_sock.detach())
        env = dict(os.environ)
        # Thread pools are sized when torch loads: set them before the child imports it.
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(spec.runner.torch_threads)
        try:
            self.proc = subprocess.Popen(
                [python or sys.executable, "-m", "vla_accel_ros.runtime.process_worker", str(child_sock.fileno()),
                 str(self.memfd)],
                pass_fds=(child_sock.fileno(), self.memfd), env=env, stdin=subprocess.DEVNULL)
        except OSError as err:
            self.conn.close()
            os.close(self.memfd)
            raise InferenceProcessError(f"cannot start the inference process: {err}") from err
        finally:
            child_sock.close()
        try:
            send_json(self.conn, {"op": "init", **spec.to_message()})
            reply = self._await(timeout_s, "start")
        except BaseException:
            self.close(0.5)
            raise
        if reply.get("op") != "ready":
            self.close(STOP_TIMEOUT_S)
            raise InferenceProcessError(str(reply.get("message", f"unexpected reply {reply}")))
        self.image_size = int(reply["image_size"])
        self.image_slots = int(reply.get("image_slots", 1))
        self.warnings: list[str] = [str(w) for w in reply.get("warnings", [])]
        self.python = str(reply.get("python", ""))  # the interpreter the child reports it runs
        self.pid = self.proc.pid

    def _await(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not self.conn.poll(POLL_S):
            if self.proc.poll() is not None:
                raise InferenceProcessError(f"inference process died during {what} "
                                            f"({describe_exit(self.proc.returncode)}); see its log above")
            if time.monotonic() > deadline:
                raise InferenceProcessError(f"inference process did not answer within {timeout_s:.0f} s ({what})")
        try:
            return recv_json(self.conn)
        except (EOFError, OSError) as err:
            raise InferenceProcessError(f"inference process closed its connection during {what} "
                                        f"({describe_exit(self.proc.poll())})") from err

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def request(self, obs: Observation) -> None:
        """Images into the buffer (the cameras' stacked, in slot order), header over the socket (the
        child is idle: one request at a time)."""
        image = np.ascontiguousarray(np.stack(obs.images) if obs.extra_images else obs.image, dtype=np.uint8)
        if self.buffer is None or len(self.buffer) != image.nbytes:
            if self.buffer is not None:
                self.buffer.close()
            os.ftruncate(self.memfd, image.nbytes)
            self.buffer = mmap.mmap(self.memfd, image.nbytes)
        np.frombuffer(self.buffer, dtype=np.uint8)[:] = image.reshape(-1)
        send_json(self.conn, {"op": "obs", "shape": list(image.shape), "instruction": obs.instruction,
                              "joint_pos": np.asarray(obs.joint_pos, dtype=float).tolist(),
                              "gripper": float(obs.gripper), "stamp": float(obs.stamp)})

    def close(self, timeout_s: float) -> None:
        """Ask the child to exit, then SIGTERM, then SIGKILL; always reaps it."""
        stop_child(self.proc, self.conn, timeout_s)
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None
        os.close(self.memfd)


class ProcessInferenceWorker(WorkerBase):
    """Same role and ``stats()`` keys as ``InferenceWorker``, with the policy in a child process.

    ``start()`` blocks until the child has loaded the checkpoint (raises InferenceProcessError
    naming the problem otherwise), so a bad checkpoint refuses the node's start as in thread mode.
    """

    log_prefix = "inference process"
    _log = log

    def __init__(self, controller: Controller, spec: ChildSpec, clock: Callable[[], float], *,
                 max_restarts: int = 3, restart_delay_s: float = 1.0, start_timeout_s: float = START_TIMEOUT_S,
                 window: int = 1000, python: str = "") -> None:
        """``python``: the interpreter the child runs under (empty: this one), e.g. a virtual
        environment with the packages a model's own code pins, this package installed into it."""
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if python and not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ValueError(f"inference_python '{python}' is not an executable file")
        self.python = python
        super().__init__(controller, clock, window)
        self.spec = spec
        self.max_restarts = max_restarts
        self.restart_delay_s = restart_delay_s
        self.start_timeout_s = start_timeout_s
        self._child: _Child | None = None
        self._child_ms: deque[float] = deque(maxlen=window)
        self.restarts = 0
        self.down_reason = ""
        self.image_size = 0
        self.image_slots = 1
        self.warnings: list[str] = []  # the decoder's fallbacks for what the policy lacks
        self.child_python = ""  # the interpreter the running child reported
        self._child_peak_rss_mb = 0.0  # over all children so far (read while they live)
        self._policy_stats: dict[str, Any] = {}  # a policy server's counters, as of the child's last reply

    # --- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("ProcessInferenceWorker already started")
        self._child = _Child(self.spec, self.start_timeout_s, self.python)
        self.image_size = self._child.image_size
        self.image_slots = self._child.image_slots
        self.warnings = self._child.warnings
        self.child_python = self._child.python
        self._start_thread("vla_inference_feeder")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_thread(timeout)
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            self._note_rss(child)
            child.close(STOP_TIMEOUT_S)

    def set_realtime_priority(self, priority: int) -> None:
        """Run the feeder thread under SCHED_FIFO like the node's control thread (raises OSError when
        not permitted). It holds the node's GIL for a moment per action; preempted there at normal
        priority by busy processes, it stalled the control tick for tens of ms (priority inversion).
        Children it restarts get normal scheduling back (SCHED_RESET_ON_FORK)."""
        if self._thread is None or self._thread.native_id is None:
            raise RuntimeError("start() the worker before setting its priority")
        os.sched_setscheduler(self._thread.native_id, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                              os.sched_param(priority))

    @property
    def alive(self) -> bool:
        child = self._child
        return child is not None and child.running and not self.down_reason

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None else None

    # --- the feeder thread ------------------------------------------------------------------
    def _acquire(self) -> _Child | None:
        child = self._child
        if child is None or not child.running:
            self._recover(child)
            return None
        return child

    def _serve(self, child: _Child, obs: Observation, t0: float) -> None:
        try:
            child.request(obs)
            reply = self._await_reply(child)
        except (EOFError, OSError):
            return  # the child died mid-request: the next loop recovers
        if reply is None:
            return
        self._handle(reply, obs, (time.perf_counter() - t0) * 1e3)

    def _await_reply(self, child: _Child) -> dict[str, Any] | None:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while not child.conn.poll(POLL_S):
            if self._stop.is_set() or not child.running:
                return None
            if time.monotonic() > deadline:
                self._note_error(f"inference process hung (no reply in {REPLY_TIMEOUT_S:.0f} s); killing it")
                child.proc.kill()
                return None
        return recv_json(child.conn)

    def _handle(self, reply: dict[str, Any], obs: Observation, latency_ms: float) -> None:
        if isinstance(reply.get("policy_stats"), dict):
            with self._lock:
                self._policy_stats = reply["policy_stats"]
        if reply.get("op") != "action":
            self._note_error(str(reply.get("message", f"unexpected reply {reply.get('op')}")))
            self._stop.wait(0.1)
            return
        with self._lock:
            self._child_ms.append(float(reply["latency_ms"]))
        report = StepReport(np.asarray(reply["actions"], dtype=float), int(reply["accepted_len"]),
                            int(reply["drafted"]), int(reply["target_passes"]), float(reply["vision_fraction"]))
        self._deliver(report, obs.stamp, obs.instruction, latency_ms)

    def _recover(self, dead: _Child | None) -> None:
        """Hold, reap the dead child, restart it (with a pause) unless the restarts are used up."""
        if dead is not None:
            why = f"inference process (pid {dead.pid}) {describe_exit(dead.proc.poll())}"
            dead.close(0.0)
        else:
            why = f"inference process could not be restarted ({self.last_error})"
        with self._lock:
            self._child = None
            restart = self.restarts < self.max_restarts
        if not restart:
            reason = f"{why}; not restarting (restarted {self.restarts} of max {self.max_restarts} times)"
            self._go_down(reason)
            self._stop.wait()  # stay down until the node stops
            return
        self._go_down(f"{why}; restarting ({self.restarts + 1}/{self.max_restarts})")
        if self._stop.wait(self.restart_delay_s):
            return
        with self._lock:
            self.restarts += 1
        try:
            child = _Child(self.spec, self.start_timeout_s, self.python)
        except InferenceProcessError as err:
            self._note_error(f"restart failed: {err}")
            with self._lock:  # counts as a death: the loop retries or gives up
                self._child = None
            return
        with self._lock:
            if self._stop.is_set():  # stop() ran meanwhile: do not leave this child behind
                child.close(STOP_TIMEOUT_S)
                return
            self._child = child
            self.down_reason = ""
        self.controller.set_inference_fault("")
        log.warning("inference process restarted (pid %d)", child.pid)

    def _go_down(self, reason: str) -> None:
        with self._lock:
            self.down_reason = reason
            self.errors += 1
            self.last_error = reason
        self.controller.set_inference_fault(reason)
        log.error("%s", reason)

    # --- reporting --------------------------------------------------------------------------
    def _note_rss(self, child: _Child | None) -> None:
        if child is not None:
            self._child_peak_rss_mb = max(self._child_peak_rss_mb, peak_rss_mb(child.pid))

    def stats(self) -> dict[str, Any]:
        """``InferenceWorker.stats()`` keys (latency = observation handed over -> action back),
        plus the child's own decode time and peak RSS, restarts, pid and why it is down ('' when up), and
        what the child's policy counts of itself (a policy server's ``server_*`` counters), as of its
        last reply."""
        self._note_rss(self._child)
        out = super().stats()
        with self._lock:
            out.update(self._policy_stats)
        return out

    def _counters(self) -> dict[str, Any]:
        return super()._counters() | {"mode": "process", "restarts": self.restarts, "down_reason": self.down_reason,
                                      "pid": self.pid or 0, "child_peak_rss_mb": self._child_peak_rss_mb}

    def _latency_extras(self) -> dict[str, float]:
        with self._lock:
            child_ms = np.asarray(self._child_ms, dtype=float)
        return {"child_latency_ms_p50": percentile(child_ms, 50)}


# --- the child ------------------------------------------------------------------------------
def die_with_parent() -> None:
    """SIGTERM this process when its parent dies (even by SIGKILL): no orphans. Linux only."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _load(spec: ChildSpec) -> PolicyRunner:
    import torch

    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (only allowed once, before any parallel work)
        pass
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.runtime.builder import build_runner

    return build_runner(spec.runner, ArmKinematics(spec.urdf_xml, tcp_frame=spec.tcp_frame))


def _serve(conn: Connection, memfd: int, runner: PolicyRunner) -> None:
    buffer: mmap.mmap | None = None
    while True:
        try:
            msg = recv_json(conn)
        except (EOFError, OSError):  # the node is gone
            return
        if msg.get("op") == "stop":
            return
        shape = tuple(int(s) for s in msg["shape"])
        nbytes = int(np.prod(shape))
        if buffer is None or len(buffer) != nbytes:
            if buffer is not None:
                buffer.close()
            buffer = mmap.mmap(memfd, nbytes, prot=mmap.PROT_READ)
        image = np.frombuffer(buffer, dtype=np.uint8, count=nbytes).reshape(shape).copy()
        images = tuple(image) if image.ndim == 4 else (image,)  # several cameras: stacked (N, H, W, 3)
        obs = Observation(images[0], str(msg["instruction"]), np.asarray(msg["joint_pos"], dtype=float),
                          float(msg["gripper"]), float(msg["stamp"]), extra_images=images[1:])
        t0 = time.perf_counter()
        try:
            report = StepReport.of(runner(obs))
        except Exception as err:  # keep serving: the node falls back meanwhile
            send_json(conn, {"op": "error", "message": f"{type(err).__name__}: {err}",
                             **_policy_stats(runner)})
            continue
        send_json(conn, {"op": "action", "actions": report.actions.tolist(), **_policy_stats(runner),
                         "latency_ms": (time.perf_counter() - t0) * 1e3, "accepted_len": report.accepted_len,
                         "drafted": report.drafted, "target_passes": report.target_passes,
                         "vision_fraction": report.vision_fraction})


def _policy_stats(runner: PolicyRunner) -> dict[str, Any]:
    """``{"policy_stats": ...}`` for a policy that counts itself (a policy server), else nothing."""
    stats = runner.policy_stats()
    return {"policy_stats": stats} if stats else {}


def child_main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the node, which stops us in order
    die_with_parent()
    if os.getppid() == 1:  # the node died before the parent-death signal was armed
        return 1
    conn, memfd = Connection(int(argv[0])), int(argv[1])
    try:
        init = recv_json(conn)
    except (EOFError, OSError):
        return 1
    try:
        runner = _load(ChildSpec.from_message(init))
    except Exception as err:  # CheckpointError, unknown decoder, bad URDF: tell the node why
        send_json(conn, {"op": "fatal", "message": f"{type(err).__name__}: {err}"})
        return 3
    send_json(conn, {"op": "ready", "image_size": int(runner.image_size), "image_slots": runner.image_slots,
                     "warnings": list(runner.warnings),
                     "pid": os.getpid(), "python": sys.executable})
    gc.collect()
    gc.freeze()  # the loaded model's objects never need scanning again
    _serve(conn, memfd, runner)
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
