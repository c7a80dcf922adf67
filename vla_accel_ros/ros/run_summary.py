"""The control node's record of a run for ``stats_file``: every tick (wall time, stamp, the command's
source, the command and the measured position; NaN where there was none) up to ``MAX_TICK_LOG``,
the tick-period jitter, the ticks a fault affected (every tick of the run whose command did not come
from the policy, counted by its cause) and the file written whole at shutdown. Without a ``stats_file`` nothing
needs the whole run: the log is a ring of the newest ``RECENT_TICKS``, so the node's memory stays
flat however long it runs. Also the process's peak RSS, which ``~/stats`` reports. ROS-free.
"""

from __future__ import annotations

import json
import os
import re
import resource
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.controller import TickResult
from vla_accel_ros.runtime.process_worker import peak_rss_mb

SOURCE_CODES = {"policy": 0, "fallback": 1, "hold": 2}
MAX_TICK_LOG = 200_000
RECENT_TICKS = 4096


def own_peak_rss_mb() -> float:
    """Peak resident set size of this process (MiB); from getrusage where /proc cannot tell."""
    return peak_rss_mb(os.getpid()) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# (wall, stamp, source code, command, measured, a plan started, jumps accepted so far)
TickEntry = tuple[float, float, int, np.ndarray, np.ndarray, bool, int]
SETTLED_RAD = 0.1  # a command this close to the measured arm after a reset: the ramp to it is over
_CAUSE_END = re.compile(r"[:;(\d]")  # a reason's details (times, pids, limits) start at the first of these


def tick_cause(source: str, reason: str) -> str:
    """What made a tick's command: its source and the leading words of its reason, without the
    details that differ from tick to tick ("hold: inference unavailable", "fallback: no fresh
    action", "hold: camera stale")."""
    words = _CAUSE_END.split(reason, maxsplit=1)[0].strip()
    return f"{source}: {words}" if words else source


class TickLog:
    """The ticks of a run: (wall, stamp, source code, command, measured, chunk start, jumps) each;
    the first ``MAX_TICK_LOG`` with ``whole_run``, else the newest ``RECENT_TICKS``."""

    def __init__(self, whole_run: bool = True) -> None:
        self.whole_run = whole_run
        self.entries: list[TickEntry] | deque[TickEntry] = [] if whole_run else deque(maxlen=RECENT_TICKS)
        self.affected: dict[str, int] = {}  # over the whole run, the ring's evicted ticks too

    def add(self, wall: float, result: TickResult, dof: int) -> None:
        if result.source != "policy":
            cause = tick_cause(result.source, result.reason)
            self.affected[cause] = self.affected.get(cause, 0) + 1
        if self.whole_run and len(self.entries) >= MAX_TICK_LOG:
            return
        measured = result.q_measured if result.q_measured is not None else np.full(dof, np.nan)
        command = result.q_command if result.q_command is not None else np.full(dof, np.nan)
        self.entries.append((wall, result.stamp, SOURCE_CODES[result.source], command, measured,
                             result.chunk_start, result.stats.jumps_accepted))

    def jitter_ms(self, period_s: float) -> dict[str, float]:
        """|tick period - ``period_s``| on the node's clock: p50, p99 and max (ms)."""
        stamps = np.array([t[1] for t in self.entries], dtype=float)
        jitter = np.abs(np.diff(stamps) - period_s) * 1e3 if stamps.size > 1 else np.zeros(0)
        return {"period_jitter_ms_p50": float(np.percentile(jitter, 50)) if jitter.size else 0.0,
                "period_jitter_ms_p99": float(np.percentile(jitter, 99)) if jitter.size else 0.0,
                "period_jitter_ms_max": float(jitter.max()) if jitter.size else 0.0}

    def affected_ticks(self) -> dict[str, Any]:
        """``affected_ticks``: the ticks of the run whose command did not come from the policy (the
        fallback or a hold), by cause (:func:`tick_cause`), the most frequent first."""
        return {"affected_ticks": dict(sorted(self.affected.items(), key=lambda kv: -kv[1]))}

    def to_json(self) -> dict[str, list[Any]]:
        return {
            "wall": [t[0] for t in self.entries],
            "ros": [t[1] for t in self.entries],
            "source": [t[2] for t in self.entries],
            "command": [np.asarray(t[3]).tolist() for t in self.entries],
            "measured": [np.asarray(t[4]).tolist() for t in self.entries],
            "chunk_start": [bool(t[5]) for t in self.entries],
            "jumps": [int(t[6]) for t in self.entries],
        }


def motion_segments(log: dict[str, list[Any]]) -> list[slice]:
    """The ticks of each episode the policy drove: from the first policy tick after a jump (an
    episode reset) whose command is within ``SETTLED_RAD`` of the arm (the ramp to the new start is
    over) up to the next jump."""
    source = np.asarray(log["source"], dtype=int)
    jumps = np.asarray(log.get("jumps", [0] * len(source)), dtype=int)
    cmd, meas = np.asarray(log["command"], dtype=float), np.asarray(log["measured"], dtype=float)
    if source.size == 0:
        return []
    close = np.all(np.abs(cmd - meas) < SETTLED_RAD, axis=1)
    edges = [0, *(np.flatnonzero(np.diff(jumps)) + 1).tolist(), len(source)]
    segments = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        start = np.flatnonzero((source[lo:hi] == SOURCE_CODES["policy"]) & close[lo:hi])
        if start.size and hi - (lo + start[0]) > 3:
            segments.append(slice(lo + int(start[0]), hi))
    return segments


def chunk_metrics(log: dict[str, list[Any]], period_s: float) -> dict[str, float]:
    """Smoothness of the commanded joint positions over the episodes' motion (:func:`motion_segments`):
    ``jerk_rms`` and ``jerk_max`` (rad/s^3, third differences at the nominal period, every joint)
    and ``chunk_boundary_step_max`` (rad: the largest change of a joint's command at a tick that
    started a new plan)."""
    cmd = np.asarray(log["command"], dtype=float)
    starts = np.asarray(log.get("chunk_start", [False] * len(cmd)), dtype=bool)
    jerks, steps = [], []
    for seg in motion_segments(log):
        q = cmd[seg]
        if len(q) > 3 and np.all(np.isfinite(q)):
            jerks.append(np.diff(q, 3, axis=0).ravel() / period_s**3)
        boundary = np.flatnonzero(starts[seg][1:]) + 1
        if boundary.size:
            steps.append(np.abs(q[boundary] - q[boundary - 1]).max(axis=1))
    jerk = np.concatenate(jerks) if jerks else np.zeros(0)
    step = np.concatenate(steps) if steps else np.zeros(0)
    return {"jerk_rms": float(np.sqrt(np.mean(jerk**2))) if jerk.size else 0.0,
            "jerk_max": float(np.abs(jerk).max()) if jerk.size else 0.0,
            "chunk_boundary_step_max": float(step.max()) if step.size else 0.0}


def episode_tick_counts(log: dict[str, list[Any]], first_episode_wall: float) -> dict[str, Any]:
    """The ticks from the first episode's start (``first_episode_wall``, the node's tick clock:
    ``time.monotonic``) on, apart from the ticks before it, when the node ran with nothing to do
    yet (holding: no instruction, or waiting for its first action): ``pre_episode_ticks``,
    ``episode_ticks``, ``episode_hold_ticks``, ``episode_fallback_ticks`` and ``hold_tick_share``
    (hold ticks of the episodes over their ticks)."""
    wall = np.asarray(log["wall"], dtype=float)
    source = np.asarray(log["source"], dtype=int)[wall >= first_episode_wall]
    holds = int(np.count_nonzero(source == SOURCE_CODES["hold"]))
    return {"pre_episode_ticks": int(wall.size - source.size), "episode_ticks": int(source.size),
            "episode_hold_ticks": holds,
            "episode_fallback_ticks": int(np.count_nonzero(source == SOURCE_CODES["fallback"])),
            "hold_tick_share": holds / source.size if source.size else 0.0}


def write_stats_file(path: str, summary: dict[str, Any]) -> None:
    """``summary`` as JSON at ``path``, replaced whole (a reader never sees half a file)."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(file.suffix + ".tmp")
    tmp.write_text(json.dumps(summary))  # NaN marks ticks without a command
    os.replace(tmp, file)
