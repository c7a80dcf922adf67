"""The inference workers' shared loop and the thread worker: serve the controller's newest observation
with a runner, hand each action back with its observation's stamp, and count what happened.

The control timer never waits for a worker: older observations are skipped, never queued, and the
controller decides at its next tick whether the action is still fresh. torch releases the GIL inside
its operators, so a thread is enough for the tick to stay on time (the node shortens the
interpreter's switch interval so the Python between operators yields quickly too). ROS-free.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_accel_ros.core.controller import Controller
from vla_accel_ros.core.observation import Observation

if TYPE_CHECKING:  # a runner's result type; importing it would import torch into the node's process
    from vla_accel_ros.decoding.protocol import DecodeResult

log = logging.getLogger(__name__)
# A policy failing on every observation fails many times a second: log it at most this often, with
# the count since the last line (every failure is still counted in stats()).
ERROR_LOG_INTERVAL_S = 5.0


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


@dataclass(frozen=True)
class StepReport:
    """What a worker hands to the controller and counts of one decoded action: the actions (H, 7):
    one, or a chunked policy's chunk) and the decoder's accounting of a
    :class:`~vla_accel_ros.decoding.protocol.DecodeResult`."""

    actions: np.ndarray
    accepted_len: int  # draft tokens accepted
    drafted: int  # draft tokens proposed
    target_passes: int
    vision_fraction: float  # share of image patches the prefill re-encoded

    @classmethod
    def of(cls, result: DecodeResult) -> StepReport:
        actions = result.action[None] if result.chunk is None else result.chunk
        return cls(np.asarray(actions, dtype=float), int(result.accepted_len), int(result.drafted),
                   int(result.target_passes), float(result.vision_fraction))


class WorkerBase:
    """What the inference workers share: the daemon thread that serves the newest observation of
    ``controller``, the action hand-over and the counters behind ``stats()``. Subclasses implement
    ``_acquire`` (what decodes, or None to skip this pass of the loop) and ``_serve`` (decode one
    observation). ``start``, ``stop`` and ``alive`` run that thread, named ``thread_name``."""

    log_prefix = "inference failed"
    thread_name = "vla_inference"
    _log = log

    def __init__(self, controller: Controller, clock: Callable[[], float], window: int) -> None:
        self.controller = controller
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._latency_ms: deque[float] = deque(maxlen=window)
        self._accept: deque[tuple[int, int]] = deque(maxlen=window)
        self._passes: deque[int] = deque(maxlen=window)
        self._vision: deque[float] = deque(maxlen=window)  # share of image patches re-encoded per action
        self.actions = 0
        self.errors = 0
        self.last_error = ""
        self._logged_at = -math.inf  # time.monotonic() of the last error line
        self._errors_logged = 0  # self.errors when that line was written

    def _acquire(self) -> Any:
        raise NotImplementedError

    def _serve(self, decoder: Any, obs: Observation, t0: float) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            decoder = self._acquire()
            if decoder is None:
                continue
            got = self.controller.wait_observation(seq, timeout=0.1)
            if got is None:
                continue
            seq, obs = got
            self._serve(decoder, obs, time.perf_counter())

    def start(self) -> None:
        self._start_thread(self.thread_name)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_thread(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start_thread(self, name: str) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _stop_thread(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _deliver(self, report: StepReport, obs_stamp: float, instruction: str, latency_ms: float) -> None:
        """Hand the actions of the observation stamped ``obs_stamp`` to the controller and count them."""
        message = self.controller.on_action_chunk(report.actions, obs_stamp, self.clock(), instruction=instruction)
        with self._lock:
            self.actions += 1
            self._latency_ms.append(latency_ms)
            self._accept.append((report.accepted_len, report.drafted))
            self._passes.append(report.target_passes)
            self._vision.append(report.vision_fraction)
            if message:
                self.last_error = message

    def _note_error(self, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.errors += 1
            self.last_error = message
            if now - self._logged_at < ERROR_LOG_INTERVAL_S:
                return
            since, self._logged_at, self._errors_logged = self.errors - self._errors_logged, now, self.errors
        more = f" ({since} failures since the last report)" if since > 1 else ""
        self._log.error("%s: %s%s", self.log_prefix, message, more)

    def _counters(self) -> dict[str, Any]:
        """The counters at the head of ``stats()`` (called under the lock)."""
        return {"actions": self.actions, "errors": self.errors, "last_error": self.last_error}

    def _latency_extras(self) -> dict[str, float]:
        """Latency statistics a subclass adds after the worker's own."""
        return {}

    def stats(self) -> dict[str, Any]:
        """Actions, latency percentiles (ms), acceptance rate and target passes per action."""
        with self._lock:
            lat = np.asarray(self._latency_ms, dtype=float)
            acc = np.asarray(self._accept, dtype=float).reshape(-1, 2)
            passes = np.asarray(self._passes, dtype=float)
            vision = np.asarray(self._vision, dtype=float)
            out = self._counters()
        out["latency_ms_p50"] = percentile(lat, 50)
        out["latency_ms_p99"] = percentile(lat, 99)
        out.update(self._latency_extras())
        out["acceptance"] = float(acc[:, 0].sum() / acc[:, 1].sum()) if acc.size and acc[:, 1].sum() > 0 else 0.0
        out["accepted_len_mean"] = float(acc[:, 0].mean()) if acc.size else 0.0
        out["target_passes_mean"] = float(passes.mean()) if passes.size else 0.0
        out["vision_recomputed_last"] = float(vision[-1]) if vision.size else 1.0
        out["vision_recomputed_mean"] = float(vision.mean()) if vision.size else 1.0
        return out


class InferenceWorker(WorkerBase):
    """Runs ``runner(obs)`` on the newest observation of ``controller`` in a daemon thread.

    ``clock`` is the controller's clock (ROS time in the node) for the freshness of actions;
    latencies are measured on ``time.perf_counter``. Errors are logged with their reason and
    counted; the worker keeps going (the controller falls back meanwhile).
    """

    def __init__(self, controller: Controller, runner: Callable[[Observation], DecodeResult],
                 clock: Callable[[], float], *, torch_threads: int = 1, window: int = 1000) -> None:
        super().__init__(controller, clock, window)
        self.runner = runner
        self.torch_threads = torch_threads

    def _run(self) -> None:
        try:
            import torch

            torch.set_num_threads(self.torch_threads)
        except ImportError:  # a runner without torch is fine
            pass
        super()._run()

    def _acquire(self) -> Callable[[Observation], DecodeResult]:
        return self.runner

    def stats(self) -> dict[str, Any]:
        """``WorkerBase.stats()`` plus what the runner's policy counts of itself (a policy server's
        ``server_*`` requests, lost and bad replies, round trips)."""
        out = super().stats()
        policy_stats = getattr(self.runner, "policy_stats", None)  # a plain callable counts nothing
        if callable(policy_stats):
            out.update(policy_stats())
        return out

    def _serve(self, runner: Callable[[Observation], DecodeResult], obs: Observation, t0: float) -> None:
        try:
            report = StepReport.of(runner(obs))
        except Exception as err:  # keep serving: the controller falls back meanwhile
            self._note_error(f"{type(err).__name__}: {err}")
            self._stop.wait(0.1)
            return
        self._deliver(report, obs.stamp, obs.instruction, (time.perf_counter() - t0) * 1e3)
