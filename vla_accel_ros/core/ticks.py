"""What one control tick decided (:class:`TickResult`), the control core's counters (:class:`TickStats`)
and its tick-period report (:class:`TickPeriods`)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TickStats:
    """Counters since start (a snapshot taken at a tick)."""

    ticks: int = 0
    ticks_published: int = 0
    policy_ticks: int = 0
    fallback_ticks: int = 0
    hold_ticks: int = 0
    deadline_misses: int = 0
    actions_received: int = 0
    actions_used: int = 0
    actions_expired: int = 0
    actions_replaced: int = 0
    inputs_rejected: int = 0
    guard_trips: int = 0
    outliers_rejected: int = 0  # joint-state samples gated (beyond what the velocity limits reach)
    jumps_accepted: int = 0  # runs of agreeing outliers taken as a real jump (reset, moved by hand)
    beyond_limits_rejected: int = 0  # joint-state samples beyond the URDF limits (+ tolerance)
    fallback_expired: int = 0  # times the fallback ran out (fallback_max_s) into a hold
    chunk_wait_ticks: int = 0  # ticks between chunks of a task without a step due (fallback, or its hold)
    chunks_planned: int = 0  # chunks that became the executed plan
    chunk_steps_dropped: int = 0  # steps dropped by alignment: their time passed during inference
    chunk_steps_blended: int = 0  # steps two plans both held, blended
    chunk_replans: int = 0  # early re-plans the kinematic verification requested
    last_outlier: str = ""  # why the last outlier was gated ('' = none yet)


@dataclass(frozen=True)
class TickResult:
    """What one tick decided. ``q_command`` is None only when no joint state was ever received
    (there is no known safe position to command)."""

    stamp: float
    q_command: np.ndarray | None  # arm joint order of the kinematics
    gripper_command: float  # the command asked for: 1 = open, 0 = closed
    finger_positions: np.ndarray  # one per gripper joint (m), within their limits and v*T of the last ones
    source: str
    reason: str
    stats: TickStats
    period_s: float = float("nan")  # measured time since the previous tick
    q_measured: np.ndarray | None = None  # newest joint measurement at the tick
    chunk_start: bool = False  # this tick executed the first step of a new plan (a chunk boundary)


@dataclass
class Counters:
    values: dict[str, int] = field(default_factory=lambda: {
        f: 0 for f, spec in TickStats.__dataclass_fields__.items() if spec.type in (int, "int")})
    last_outlier: str = ""

    def add(self, name: str, n: int = 1) -> None:
        self.values[name] += n

    def snapshot(self) -> TickStats:
        return TickStats(**self.values, last_outlier=self.last_outlier)


class TickPeriods:
    """The time between consecutive ticks, kept over a recent window for the jitter report."""

    def __init__(self, period_s: float, deadline_tolerance: float, window: int) -> None:
        self.period_s = period_s
        self.deadline_tolerance = deadline_tolerance
        self.last: float | None = None  # the previous tick (None: none yet on this clock's timeline)
        self.periods: deque[float] = deque(maxlen=window)

    def record(self, now: float) -> float:
        """The tick at ``now``: its period (nan for the first tick of a timeline)."""
        period = math.nan if self.last is None else now - self.last
        if math.isfinite(period):
            self.periods.append(period)
        self.last = now
        return period

    def late(self, period: float) -> bool:
        """A deadline miss: later than ``deadline_tolerance`` of a period past the period."""
        return math.isfinite(period) and period > self.period_s * (1.0 + self.deadline_tolerance)


def period_report(periods: np.ndarray, period_s: float) -> dict[str, Any]:
    """Rate, period and jitter (|period - ``period_s``|) statistics of ``periods`` (ms)."""
    if periods.size == 0:
        return {"rate_hz": 0.0, "period_ms_p50": 0.0, "jitter_ms_p50": 0.0, "jitter_ms_p99": 0.0,
                "jitter_ms_max": 0.0, "samples": 0}
    jitter = np.abs(periods - period_s) * 1e3
    return {
        "rate_hz": float(1.0 / periods.mean()) if periods.mean() > 0 else 0.0,
        "period_ms_p50": float(np.median(periods) * 1e3),
        "jitter_ms_p50": float(np.percentile(jitter, 50)),
        "jitter_ms_p99": float(np.percentile(jitter, 99)),
        "jitter_ms_max": float(jitter.max()),
        "samples": int(periods.size),
    }
