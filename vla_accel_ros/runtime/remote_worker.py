"""The inference worker of ``inference_mode: remote``: the policy runs on another machine.

A daemon thread sends the controller's newest observation through ``send`` (the node publishes it
on the ROS graph, ``ros/remote_protocol.py``); the node hands each answer, a :class:`RemoteAction`, to
:meth:`RemoteInferenceWorker.on_remote_action`. One observation is awaited at a time: the next is
sent when the answer came, or when ``lost_after_s`` has passed without one. Freshness is judged on
the control node's clock only: an answer echoes the stamp of its observation, so the hosts' clocks
need not agree. An answer older than ``max_age_s`` is dropped (``dropped_late``); an observation
without an answer after twice that is ``lost``. The controller's Kalman fallback and hold cover the
gap exactly as they do for a slow local worker.

Stats add to the workers' own: ``round_trip_ms_*`` (observation sent to answer received),
``action_age_ms_*`` (observation stamp to answer received), ``sent``, ``lost``, ``dropped_late``,
``unmatched`` (answers to no observation in flight). ROS-free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vla_accel_ros.core.controller import Controller
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.runtime.thread_worker import StepReport, WorkerBase, percentile


def observation_key(stamp: float) -> tuple[int, int]:
    """The exact key (seconds, nanoseconds) of the observation stamped ``stamp``, as its messages and
    its answer carry it: a float seconds stamp loses nanoseconds, so answers are matched by this."""
    ns = int(round(stamp * 1e9))
    return ns // 1_000_000_000, ns % 1_000_000_000


@dataclass(frozen=True)
class RemoteAction:
    """One answer of the inference node: the actions decoded for the observation stamped ``obs_stamp``."""

    actions: np.ndarray  # (H, 7)
    obs_stamp: float
    stats: dict[str, float]
    key: tuple[int, int]  # the observation's :func:`observation_key`


class RemoteInferenceWorker(WorkerBase):
    """See the module docstring. ``send(obs)`` publishes an observation; ``clock`` is the
    controller's clock (ROS time in the node)."""

    log_prefix = "remote inference"
    thread_name = "vla_remote_inference"

    def __init__(self, controller: Controller, send: Callable[[Observation], None], clock: Callable[[], float], *,
                 lost_after_s: float = 0.5, max_age_s: float = 0.5, window: int = 1000) -> None:
        if lost_after_s <= 0 or max_age_s <= 0:
            raise ValueError(f"lost_after_s and max_age_s must be > 0, got {lost_after_s}, {max_age_s}")
        super().__init__(controller, clock, window)
        self.send = send
        self.lost_after_s = lost_after_s
        self.max_age_s = max_age_s
        # the observation's stamp key (exact) -> (its stamp, sent at, instruction)
        self._in_flight: dict[tuple[int, int], tuple[float, float, str]] = {}
        self._age_ms: deque[float] = deque(maxlen=window)
        self.sent = self.lost = self.dropped_late = self.unmatched = 0

    def _acquire(self) -> Any:
        """True when an observation may be sent: none awaited younger than ``lost_after_s``."""
        now = self.clock()
        with self._lock:
            # past 2 x max_age_s no answer can be used or even told late: the observation is lost
            gone = [k for k, (_, sent, _) in self._in_flight.items() if now - sent > 2.0 * self.max_age_s]
            for key in gone:
                del self._in_flight[key]
                self.lost += 1
            busy = any(now - sent <= self.lost_after_s for _, sent, _ in self._in_flight.values())
        if busy:
            self._stop.wait(0.002)
            return None
        return True

    def _serve(self, _: Any, obs: Observation, t0: float) -> None:
        with self._lock:
            self._in_flight[observation_key(obs.stamp)] = (obs.stamp, self.clock(), obs.instruction)
            self.sent += 1
        try:
            self.send(obs)
        except Exception as err:  # a publisher torn down at shutdown: counted, the loop goes on
            self._note_error(f"cannot send the observation: {err}")

    def on_remote_action(self, answer: RemoteAction) -> None:
        """An answer arrived (the node's subscription callback)."""
        now = self.clock()
        with self._lock:
            flight = self._in_flight.pop(answer.key, None)
            if flight is None:
                self.unmatched += 1
                return
        obs_stamp, sent_at, instruction = flight
        age = now - obs_stamp
        if age > self.max_age_s:
            with self._lock:
                self.dropped_late += 1
            return
        stats = answer.stats
        report = StepReport(answer.actions, int(stats.get("accepted_len", 0)), int(stats.get("drafted", 0)),
                            int(stats.get("target_passes", 0)), 1.0)
        with self._lock:
            self._age_ms.append(age * 1e3)
        self._deliver(report, obs_stamp, instruction, (now - sent_at) * 1e3)

    def _counters(self) -> dict[str, Any]:
        out = super()._counters()
        out.update(sent=self.sent, lost=self.lost, dropped_late=self.dropped_late, unmatched=self.unmatched,
                   mode="remote")
        return out

    def _latency_extras(self) -> dict[str, float]:
        with self._lock:
            age = np.asarray(self._age_ms, dtype=float)
            rt = np.asarray(self._latency_ms, dtype=float)
        return {"round_trip_ms_p50": percentile(rt, 50), "round_trip_ms_p99": percentile(rt, 99),
                "action_age_ms_p50": percentile(age, 50), "action_age_ms_p99": percentile(age, 99)}

