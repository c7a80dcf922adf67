"""The control node's camera, taken in a child process: no camera message ever reaches the process that
runs the control timer.

Why a process, not a thread: rclpy takes and converts a message with the interpreter's lock held.
A 10000 x 10000 rgb8 image (300 MB) held it for 2 to 4 s here, and every thread of the process
waited, the control timer's included. The child subscribes to the camera, refuses an image above
``max_pixels`` (a compressed one from the size its header declares, before decoding:
``core/images.py``), converts and decodes the rest to RGB at the model's size, and sends each
frame (a few hundred kB at most) or each refusal to the node over a socket; the node's reader
thread hands them to its callbacks. The subscription keeps one message (the newest wins) while the
child is busy.

The child's output (rclpy's log lines, and what libpng, libjpeg and OpenCV print about bad images)
goes through a pipe to the node, which logs it throttled. A child that dies is restarted after
``RESTART_DELAY_S`` (the camera counts as stale meanwhile; the death and the restart are each
reported through ``on_event``, which the node shows on ``/diagnostics``); a child whose memory grew past
``RECYCLE_RSS_MB`` (a huge message keeps the middleware's buffers at its size) exits after the
message, and is restarted at once. The child exits with the node (parent-death signal, socket EOF).
Run as ``python -m vla_accel_ros.ros.camera_intake`` only by :class:`CameraIntake`. Importing this
module does not import rclpy; the child does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import IO, Any

import numpy as np

from vla_accel_ros.core.images import compressed_to_rgb, image_to_rgb
from vla_accel_ros.runtime.process_worker import describe_exit, die_with_parent, recv_json, send_json, stop_child

START_TIMEOUT_S = 60.0  # spawn + import rclpy and OpenCV + create the subscription, on a loaded machine
RESTART_DELAY_S = 1.0
RECYCLE_RSS_MB = 1024.0
STOP_TIMEOUT_S = 3.0
POLL_S = 0.1


class CameraIntakeError(RuntimeError):
    """The camera intake process could not be started; the message says why."""


@dataclass(frozen=True)
class IntakeSpec:
    """What the child subscribes to and how it converts: the fully resolved topic (the node applied
    its namespace and remappings), the message type, the model's image size, the pixel bound, the
    QoS reliability, and where the child's node lives (its DDS domain, a hidden name beside the node)."""

    topic: str
    compressed: bool
    image_size: int
    max_pixels: int
    reliable: bool
    domain_id: int
    node_name: str
    namespace: str


FrameCallback = Callable[[float, np.ndarray], None]  # (header stamp, RGB image at the model's size)
RefusalCallback = Callable[[float, str], None]  # (header stamp, why)
LineCallback = Callable[[str], None]


class _Child:
    """One running child: its process, socket, and the thread forwarding its output."""

    def __init__(self, on_output: LineCallback) -> None:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn = Connection(parent_sock.detach())
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vla_accel_ros.ros.camera_intake", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT)
        except OSError as err:
            self.conn.close()
            raise CameraIntakeError(f"cannot start the camera intake process: {err}") from err
        finally:
            child_sock.close()
        assert self.proc.stdout is not None
        self.output = threading.Thread(target=_forward_lines, args=(self.proc.stdout, on_output),
                                       name="vla_camera_output", daemon=True)
        self.output.start()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def init(self, spec: IntakeSpec, timeout_s: float) -> None:
        """Hand the child its spec; return once its subscription exists (CameraIntakeError if not)."""
        try:
            send_json(self.conn, {"op": "init", **asdict(spec)})
            deadline = time.monotonic() + timeout_s
            while not self.conn.poll(POLL_S):
                if not self.running:
                    raise CameraIntakeError(f"the camera intake process exited during start-up "
                                            f"({describe_exit(self.proc.returncode)})")
                if time.monotonic() > deadline:
                    raise CameraIntakeError(f"the camera intake process did not start within {timeout_s:.0f} s")
            reply = recv_json(self.conn)
        except (EOFError, OSError) as err:
            raise CameraIntakeError(f"the camera intake process closed its connection during start-up "
                                    f"({describe_exit(self.proc.poll())})") from err
        if reply.get("op") != "ready":
            raise CameraIntakeError(str(reply.get("message", f"unexpected reply {reply}")))

    def close(self, timeout_s: float) -> None:
        """Ask the child to exit, then SIGTERM, then SIGKILL; always reaps it."""
        stop_child(self.proc, self.conn, timeout_s)
        self.output.join(timeout_s)


def _forward_lines(stream: IO[bytes], on_output: LineCallback) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        if line:
            on_output(line)
    stream.close()


class CameraIntake:
    """The camera of the node, in a child process (see the module docstring). ``spawn()`` starts the
    child (its imports run while the node configures the rest); ``start(spec)`` hands it the
    subscription and returns once that exists, then a reader thread calls ``on_frame`` for each
    frame, ``on_refused`` for each refused image, ``on_event`` for what happens to the child (a death,
    a restart), and ``on_output`` for each line it prints. ``stop()`` ends it all."""

    def __init__(self, on_frame: FrameCallback, on_refused: RefusalCallback, on_event: LineCallback,
                 on_output: LineCallback, *, restart_delay_s: float = RESTART_DELAY_S,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.on_frame, self.on_refused, self.on_event, self.on_output = on_frame, on_refused, on_event, on_output
        self.restart_delay_s = restart_delay_s
        self.start_timeout_s = start_timeout_s
        self.spec: IntakeSpec | None = None
        self.frames = 0
        self.refused = 0
        self.restarts = 0
        self._child: _Child | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def spawn(self) -> None:
        if self._child is None:
            self._child = _Child(self.on_output)

    def start(self, spec: IntakeSpec) -> None:
        """Subscribe as ``spec`` says; CameraIntakeError naming the problem when the child cannot."""
        self.spec = spec
        self.spawn()
        assert self._child is not None
        try:
            self._child.init(spec, self.start_timeout_s)
        except CameraIntakeError:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._run, name="vla_camera_intake", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s + POLL_S)
        child, self._child = self._child, None
        if child is not None:
            child.close(timeout_s)

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.proc.pid if child is not None else None

    def stats(self) -> dict[str, Any]:
        return {"frames": self.frames, "refused": self.refused, "restarts": self.restarts, "pid": self.pid or 0}

    # --- the reader thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            child = self._child
            if child is None:
                self._restart(None, 0.0)
                continue
            try:
                if not child.conn.poll(POLL_S):
                    if not child.running:
                        raise EOFError
                    continue
                message = recv_json(child.conn)
                if message.get("op") == "frame":
                    pixels = child.conn.recv_bytes()
            except (EOFError, OSError):
                self._restart(child, self.restart_delay_s)
                continue
            self._handle(child, message, pixels if message.get("op") == "frame" else b"")

    def _handle(self, child: _Child, message: dict[str, Any], pixels: bytes) -> None:
        op = message.get("op")
        if op == "frame":
            self.frames += 1
            shape = tuple(int(n) for n in message["shape"])
            self.on_frame(float(message["stamp"]), np.frombuffer(pixels, dtype=np.uint8).reshape(shape).copy())
        elif op == "refused":
            self.refused += 1
            self.on_refused(float(message["stamp"]), str(message["message"]))
        elif op == "recycle":
            self.on_event(f"camera intake process grew to {float(message['rss_mb']):.0f} MB after a large "
                          f"message (more than {RECYCLE_RSS_MB:.0f} MB); restarting it")
            self._restart(child, 0.0)

    def _restart(self, dead: _Child | None, delay_s: float) -> None:
        """Reap ``dead`` and start another child (after ``delay_s``); the camera is stale meanwhile."""
        if dead is not None:
            dead.close(0.5)
            if delay_s > 0.0:
                self.on_event(f"camera intake process (pid {dead.proc.pid}) {describe_exit(dead.proc.returncode)}; "
                              f"restarting it in {delay_s:g} s")
        self._child = None
        if self._stop.wait(delay_s) or self.spec is None:
            return
        self.restarts += 1
        try:
            child = _Child(self.on_output)
        except CameraIntakeError as err:
            self.on_event(str(err))
            self._stop.wait(self.restart_delay_s)
            return
        try:
            child.init(self.spec, self.start_timeout_s)
        except CameraIntakeError as err:
            child.close(0.5)
            self.on_event(f"camera intake restart failed: {err}")
            self._stop.wait(self.restart_delay_s)
            return
        if self._stop.is_set():  # stop() ran meanwhile: leave no child behind
            child.close(STOP_TIMEOUT_S)
            return
        self._child = child
        self.on_event(f"camera intake restarted (pid {child.proc.pid}; {self.restarts} restart(s) so far)")


# --- the child ----------------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child_main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the node, which stops us in order
    die_with_parent()
    if os.getppid() == 1:  # the node died before the parent-death signal was armed
        return 1
    conn = Connection(int(argv[0]))
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import CompressedImage, Image

    try:
        init = recv_json(conn)
    except (EOFError, OSError):
        return 1
    if init.get("op") != "init":
        return 1
    spec = IntakeSpec(**{k: v for k, v in init.items() if k != "op"})
    context = Context()
    try:
        rclpy.init(args=["--ros-args", "--disable-rosout-logs", "--disable-external-lib-logs"], context=context,
                   domain_id=spec.domain_id)
        node = rclpy.create_node(spec.node_name, namespace=spec.namespace, context=context,
                                 use_global_arguments=False, start_parameter_services=False, enable_rosout=False)
    except Exception as err:  # rcl's errors: tell the node why
        send_json(conn, {"op": "fatal", "message": f"camera intake cannot join ROS: {type(err).__name__}: {err}"})
        return 3
    convert = compressed_to_rgb if spec.compressed else image_to_rgb
    recycle = threading.Event()

    def on_image(msg: Any) -> None:
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        try:
            rgb = convert(msg, spec.image_size, spec.max_pixels)
        except ValueError as err:
            send_json(conn, {"op": "refused", "stamp": stamp, "message": str(err)})
        else:
            send_json(conn, {"op": "frame", "stamp": stamp, "shape": list(rgb.shape)})
            conn.send_bytes(memoryview(rgb).cast("B"))
        del msg
        if _rss_mb() > RECYCLE_RSS_MB:
            send_json(conn, {"op": "recycle", "rss_mb": _rss_mb()})
            recycle.set()

    qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST,
                     reliability=ReliabilityPolicy.RELIABLE if spec.reliable else ReliabilityPolicy.BEST_EFFORT)
    node.create_subscription(CompressedImage if spec.compressed else Image, spec.topic, on_image, qos)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    send_json(conn, {"op": "ready", "pid": os.getpid()})
    try:
        while not recycle.is_set():
            executor.spin_once(timeout_sec=POLL_S)
            if conn.poll(0):  # "stop", or EOF: the node is gone
                break
    except (EOFError, OSError):  # the node closed the socket while a frame was sent
        pass
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown(context=context)
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
