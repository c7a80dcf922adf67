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
from typing import Any

import numpy as np

from vla_accel_ros.controller import Controller
from vla_accel_ros.kalman import JointKalmanFilter
from vla_accel_ros.kinematics import ArmKinematics
from vla_accel_ros.observation import Observation

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
                 period_s: float, max_steps: int = 120, clock: Callable[[], float] = time.perf_counter) -> None:
        from vla_accel_ros.decoding.base import EpisodeHistory

        self.policy = policy
        self.decoder = _make_decoder(decoder_name)
        self.decoder_name = decoder_name
        self.period_s = period_s
        self.history = EpisodeHistory(JointKalmanFilter(kin, action_dt_s), max_steps=max_steps,
                                      control_period_s=action_dt_s, clock=clock)
        self._last_instruction: str | None = None
        self._last_q: np.ndarray | None = None

    @classmethod
    def load(cls, checkpoint: str | Path, decoder_name: str, kin: ArmKinematics, **kwargs: Any) -> PolicyRunner:
        """Load a checkpoint directory (safetensors + JSON; raises CheckpointError naming the problem)."""
        from vla_accel_ros.models import load_checkpoint

        return cls(load_checkpoint(Path(checkpoint)), decoder_name, kin, **kwargs)

    @property
    def image_size(self) -> int:
        return int(self.policy.config.image_size)

    def __call__(self, obs: Observation) -> Any:
        from vla_accel_ros.decoding.base import run_policy_step

        q = np.asarray(obs.joint_pos, dtype=float)
        jumped = self._last_q is not None and float(np.max(np.abs(q - self._last_q))) > EPISODE_JUMP_RAD
        if obs.instruction != self._last_instruction or jumped:
            self.history.reset()
            reset = getattr(self.decoder, "reset", None)
            if callable(reset):
                reset()
        self._last_instruction, self._last_q = obs.instruction, q
        self.history.observe_joints(q, obs.stamp)
        result = run_policy_step(self.policy, obs, self.decoder, self.history.context(time_left_s=self.period_s))
        self.history.record(result)
        return result


class InferenceWorker:
    """Runs ``runner(obs)`` on the newest observation of ``controller`` in a daemon thread.

    ``clock`` is the controller's clock (ROS time in the node) for the freshness of actions;
    latencies are measured on ``time.perf_counter``. Errors are logged with their reason and
    counted; the worker keeps going (the controller falls back meanwhile).
    """

    def __init__(self, controller: Controller, runner: Callable[[Observation], Any], clock: Callable[[], float],
                 *, torch_threads: int = 1, window: int = 1000) -> None:
        self.controller = controller
        self.runner = runner
        self.clock = clock
        self.torch_threads = torch_threads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._latency_ms: deque[float] = deque(maxlen=window)
        self._accept: deque[tuple[int, int]] = deque(maxlen=window)
        self._passes: deque[int] = deque(maxlen=window)
        self.actions = 0
        self.errors = 0
        self.last_error = ""

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("InferenceWorker already started")
        self._thread = threading.Thread(target=self._run, name="vla_inference", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            import torch

            torch.set_num_threads(self.torch_threads)
        except ImportError:  # a runner without torch is fine
            pass
        seq = 0
        while not self._stop.is_set():
            got = self.controller.wait_observation(seq, timeout=0.1)
            if got is None:
                continue
            seq, obs = got
            t0 = time.perf_counter()
            try:
                result = self.runner(obs)
                action = np.asarray(getattr(result, "action", result), dtype=float)
            except Exception as err:  # keep serving: the controller falls back meanwhile
                with self._lock:
                    self.errors += 1
                    self.last_error = f"{type(err).__name__}: {err}"
                log.error("inference failed: %s", self.last_error)
                self._stop.wait(0.1)
                continue
            latency_ms = (time.perf_counter() - t0) * 1e3
            message = self.controller.on_action(action, obs.stamp, self.clock(), instruction=obs.instruction)
            with self._lock:
                self.actions += 1
                self._latency_ms.append(latency_ms)
                if hasattr(result, "accepted_len"):
                    self._accept.append((int(result.accepted_len), int(result.drafted)))
                    self._passes.append(int(result.target_passes))
                if message:
                    self.last_error = message

    def stats(self) -> dict[str, Any]:
        """Actions, latency percentiles (ms), acceptance rate and target passes per action."""
        with self._lock:
            lat = np.asarray(self._latency_ms, dtype=float)
            acc = np.asarray(self._accept, dtype=float).reshape(-1, 2)
            passes = np.asarray(self._passes, dtype=float)
            out: dict[str, Any] = {"actions": self.actions, "errors": self.errors, "last_error": self.last_error}
        out["latency_ms_p50"] = float(np.percentile(lat, 50)) if lat.size else 0.0
        out["latency_ms_p99"] = float(np.percentile(lat, 99)) if lat.size else 0.0
        out["acceptance"] = float(acc[:, 0].sum() / acc[:, 1].sum()) if acc.size and acc[:, 1].sum() > 0 else 0.0
        out["accepted_len_mean"] = float(acc[:, 0].mean()) if acc.size else 0.0
        out["target_passes_mean"] = float(passes.mean()) if passes.size else 0.0
        return out
