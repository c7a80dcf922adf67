"""The inference worker: policy prefill + decoder on the newest observation, in its own thread.

The control timer never waits for it. The worker takes the newest observation the controller holds
(older ones are skipped, never queued), decodes one action and hands it to the controller with the
observation's stamp; the controller decides at its next tick whether the action is still fresh.

torch releases the GIL inside its operators, so a thread is enough for the tick to stay on time
(the node shortens the interpreter's switch interval so the Python parts between operators yield
quickly too). ROS-free.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_accel_ros.controller import Controller
from vla_accel_ros.kalman import JointKalmanFilter
from vla_accel_ros.kinematics import ArmKinematics
from vla_accel_ros.observation import Observation
from vla_accel_ros.sampling import SamplingConfig

if TYPE_CHECKING:
    from vla_accel_ros.vision_reuse import VisionReuseConfig

log = logging.getLogger(__name__)

# A measured joint jump this large (rad) between two observations is a new episode (sim reset):
# the decoder's history (filter, tokens, gripper) no longer describes the arm.
EPISODE_JUMP_RAD = 0.3


def _make_decoder(name: str) -> Any:
    from vla_accel_ros import decoding

    return decoding.make_decoder(name)


class PolicyRunner:
    """Observation -> action (and the decoder's accounting) for one policy and one decoder.

    Keeps the per-episode history the decoders read (recent joints through a joint-space Kalman
    filter, previous tokens and gripper values) and restarts it when the task or the arm's
    position changes abruptly.
    """

    def __init__(self, policy: Any, decoder_name: str, kin: ArmKinematics, *, action_dt_s: float,
                 period_s: float, max_steps: int = 120, clock: Callable[[], float] = time.perf_counter,
                 vision: VisionReuseConfig | None = None, sampling: SamplingConfig | None = None) -> None:
        from vla_accel_ros.decoding.base import EpisodeHistory
        from vla_accel_ros.vision_reuse import IncrementalVisionEncoder

        self.policy = policy
        self.decoder = _make_decoder(decoder_name)
        if decoder_name in ("flow10", "flow2") and getattr(policy, "flow", None) is None:
            raise ValueError(f"decoder '{decoder_name}' needs a checkpoint with a continuous action head "
                             "(vla-accel train-flow)")
        self.decoder_name = decoder_name
        self.period_s = period_s
        self.history = EpisodeHistory(JointKalmanFilter(kin, action_dt_s), max_steps=max_steps,
                                      control_period_s=action_dt_s, clock=clock, sampling=sampling)
        self._last_instruction: str | None = None
        self._last_q: np.ndarray | None = None
        self.vision = IncrementalVisionEncoder(policy, vision) if vision is not None else None

    @classmethod
    def load(cls, checkpoint: str | Path, decoder_name: str, kin: ArmKinematics, **kwargs: Any) -> PolicyRunner:
        """Load a checkpoint directory (safetensors + JSON; raises CheckpointError naming the problem).
        A decoder that needs a file beside the checkpoint (heisd: CHECKPOINT/retrieval_store) gets it
        here, so that a missing one is reported at start-up, not at every step."""
        from vla_accel_ros.models import load_checkpoint

        runner = cls(load_checkpoint(Path(checkpoint)), decoder_name, kin, **kwargs)
        attach = getattr(runner.decoder, "attach_checkpoint_store", None)
        if callable(attach):
            attach(Path(checkpoint), runner.policy)
        return runner

    @property
    def image_size(self) -> int:
        return int(self.policy.config.image_size)

    def __call__(self, obs: Observation) -> Any:
        from vla_accel_ros.decoding.base import run_policy_step

        q = np.asarray(obs.joint_pos, dtype=float)
        jumped = self._last_q is not None and float(np.max(np.abs(q - self._last_q))) > EPISODE_JUMP_RAD
        if obs.instruction != self._last_instruction or jumped:
            self.history.reset()
            if self.vision is not None:
                self.vision.reset()
            reset = getattr(self.decoder, "reset", None)
            if callable(reset):
                reset()
        self._last_instruction, self._last_q = obs.instruction, q
        self.history.observe_joints(q, obs.stamp)
        context = self.history.context(time_left_s=self.period_s)
        result = run_policy_step(self.policy, obs, self.decoder, context, self.vision)
        self.history.record(result)
        return result


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


class WorkerBase:
    """What both inference workers share: the daemon thread that serves the newest observation of
    ``controller``, the action hand-over and the counters behind ``stats()``. Subclasses implement
    ``_acquire`` (what decodes, or None to skip a turn) and ``_serve`` (decode one observation)."""

    log_prefix = "inference failed"
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

    def _start_thread(self, name: str) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _stop_thread(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _deliver(self, action: np.ndarray, obs: Observation, latency_ms: float,
                 counts: tuple[Any, Any, Any] | None, vision_fraction: float | None = None) -> None:
        """Hand ``action`` to the controller and count it; ``counts`` is the decoder's
        (accepted_len, drafted, target_passes), None when it reports none; ``vision_fraction`` the
        share of image patches the prefill re-encoded."""
        message = self.controller.on_action(action, obs.stamp, self.clock(), instruction=obs.instruction)
        with self._lock:
            self.actions += 1
            self._latency_ms.append(latency_ms)
            if counts is not None:
                self._accept.append((int(counts[0]), int(counts[1])))
                self._passes.append(int(counts[2]))
            if vision_fraction is not None:
                self._vision.append(float(vision_fraction))
            if message:
                self.last_error = message

    def _note_error(self, message: str) -> None:
        with self._lock:
            self.errors += 1
            self.last_error = message
        self._log.error("%s: %s", self.log_prefix, message)

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
        out["latency_ms_p50"] = _percentile(lat, 50)
        out["latency_ms_p99"] = _percentile(lat, 99)
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

    def __init__(self, controller: Controller, runner: Callable[[Observation], Any], clock: Callable[[], float],
                 *, torch_threads: int = 1, window: int = 1000) -> None:
        super().__init__(controller, clock, window)
        self.runner = runner
        self.torch_threads = torch_threads

    def start(self) -> None:
        self._start_thread("vla_inference")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_thread(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            import torch

            torch.set_num_threads(self.torch_threads)
        except ImportError:  # a runner without torch is fine
            pass
        super()._run()

    def _acquire(self) -> Callable[[Observation], Any]:
        return self.runner

    def _serve(self, runner: Callable[[Observation], Any], obs: Observation, t0: float) -> None:
        try:
            result = runner(obs)
            action = np.asarray(getattr(result, "action", result), dtype=float)
        except Exception as err:  # keep serving: the controller falls back meanwhile
            self._note_error(f"{type(err).__name__}: {err}")
            self._stop.wait(0.1)
            return
        latency_ms = (time.perf_counter() - t0) * 1e3
        counts = (result.accepted_len, result.drafted, result.target_passes) if hasattr(result, "accepted_len") else None
        self._deliver(action, obs, latency_ms, counts, getattr(result, "vision_fraction", None))
