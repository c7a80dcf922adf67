"""Stalls of the control loop, for ``/diagnostics``: a tick that came more than ``stall_after_periods``
periods after the one before (on the node's clock, so a sim slower than real time is no stall), and
the ticks it missed. The node reports each stall as a WARN for ``holdoff_s`` after it ended (and
while a tick is overdue), naming the longest gap of that time and its likely cause: the longest of
the node's own callbacks, or of the garbage collector's passes, that ran during the gap
(:meth:`StallMonitor.timed`, :meth:`StallMonitor.gc_callback`). ROS-free.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

KEEP_SLOW = 64  # slow callbacks remembered for attributing a stall
UNKNOWN_CAUSE = ("no callback of this node ran that long: another thread or process held the CPU or the "
                 "interpreter (a large message being taken, the machine's load)")
# Said of a slow callback that spent most of its time off the CPU: preempted, not busy.
KEPT_WAITING = "its thread was kept waiting for the CPU or the interpreter"


@dataclass(frozen=True)
class Stall:
    gap_s: float  # between the two ticks, on the node's clock
    missed: int  # ticks that should have come in between
    ended: float  # time.monotonic() of the late tick
    cause: str


class StallMonitor:
    """Counts stalls from the ticks (:meth:`tick`) and attributes each to the slowest callback that
    ran during it. Thread-safe: callbacks are timed on every thread of the node."""

    def __init__(self, period_s: float, stall_after_periods: float, holdoff_s: float,
                 clock: Callable[[], float] = time.monotonic, cpu_clock: Callable[[], float] = time.thread_time,
                 ) -> None:
        self.period_s = period_s
        self.bound_s = stall_after_periods * period_s
        self.holdoff_s = holdoff_s
        self.clock = clock
        self.cpu_clock = cpu_clock  # the calling thread's CPU seconds: a slow callback busy, or kept waiting
        self._lock = threading.Lock()
        # (name, start, end, CPU seconds of its thread or None)
        self._slow: deque[tuple[str, float, float, float | None]] = deque(maxlen=KEEP_SLOW)
        self._gc_started: float | None = None
        self._last: tuple[float, float] | None = None  # (stamp, wall) of the last tick
        self._recent: deque[Stall] = deque(maxlen=KEEP_SLOW)
        self.stalls = 0
        self.ticks_missed = 0
        self.longest_gap_s = 0.0  # between any two ticks, stall or not

    # --- what may cause one -----------------------------------------------------------------------
    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the body as the callback ``name``."""
        start, cpu = self.clock(), self.cpu_clock()
        try:
            yield
        finally:
            self.record(name, start, self.clock(), self.cpu_clock() - cpu)

    def wrap(self, name: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        """``callback``, timed as ``name`` on every call."""
        def timed_callback(*args: Any, **kwargs: Any) -> Any:
            with self.timed(name):
                return callback(*args, **kwargs)
        return timed_callback

    def record(self, name: str, start: float, end: float, cpu_s: float | None = None) -> None:
        """A callback ``name`` ran from ``start`` to ``end`` (``clock`` seconds); only those longer
        than half a period are kept."""
        if end - start > 0.5 * self.period_s:
            with self._lock:
                self._slow.append((name, start, end, cpu_s))

    def gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        """For ``gc.callbacks``: a collection is timed like a callback."""
        if phase == "start":
            self._gc_started = self.clock()
        elif self._gc_started is not None:
            self.record(f"garbage collection (generation {info.get('generation', '?')})", self._gc_started,
                        self.clock())
            self._gc_started = None

    # --- the ticks ----------------------------------------------------------------------------
    def restart(self) -> None:
        """The loop starts again (activation): the time before is no gap."""
        with self._lock:
            self._last = None

    def tick(self, stamp: float) -> Stall | None:
        """A tick at ``stamp`` on the node's clock; the stall it ends, if it ends one."""
        wall = self.clock()
        with self._lock:
            last, self._last = self._last, (stamp, wall)
            if last is None:
                return None
            gap = stamp - last[0]
            self.longest_gap_s = max(self.longest_gap_s, gap)
            if not gap > self.bound_s + 1e-9:  # also a clock that went back; 1e-9: stamps' round-off
                return None
            stall = Stall(gap, max(int(round(gap / self.period_s)) - 1, 1), wall, self._cause_locked(last[1], wall))
            self.stalls += 1
            self.ticks_missed += stall.missed
            self._recent.append(stall)
            return stall

    def _cause_locked(self, start: float, end: float) -> str:
        """The slow callback that overlapped [start, end] the longest."""
        best, overlap = "", 0.0
        for name, t0, t1, cpu in self._slow:
            shared = min(t1, end) - max(t0, start)
            if shared > overlap:
                waited = cpu is not None and cpu < 0.5 * (t1 - t0)
                best = f"{name} ran {t1 - t0:.3f} s" + (f" ({cpu:.3f} s on the CPU: {KEPT_WAITING})" if waited else "")
                overlap = shared
        return best or UNKNOWN_CAUSE

    # --- the report ---------------------------------------------------------------------------
    def overdue_s(self, now: float) -> float:
        """How far past the stall bound the next tick is at ``now`` on the node's clock (0.0: it is not)."""
        with self._lock:
            if self._last is None:
                return 0.0
            late = now - self._last[0]
        return late if late > self.bound_s + 1e-9 else 0.0

    def report(self, now: float) -> str:
        """The WARN text while a tick is overdue at ``now`` (the node's clock) or a stall ended less
        than ``holdoff_s`` ago, else ''."""
        overdue = self.overdue_s(now)
        wall = self.clock()
        with self._lock:
            recent = [s for s in self._recent if wall - s.ended <= self.holdoff_s]
        parts = []
        if overdue:
            parts.append(f"control loop stalled: no tick for {overdue:.3f} s (stall bound {self.bound_s:.3f} s)")
        if recent:
            worst = max(recent, key=lambda s: s.gap_s)
            parts.append(f"control loop stalled {len(recent)} time(s) in the last {self.holdoff_s:g} s: longest gap "
                         f"{worst.gap_s:.3f} s ({worst.missed} tick(s) missed, bound {self.bound_s:.3f} s); likely "
                         f"cause: {worst.cause}")
        return "; ".join(parts)

    def stats(self) -> dict[str, Any]:
        """Counters since start for ``~/stats``."""
        with self._lock:
            return {"stalls": self.stalls, "ticks_missed": self.ticks_missed, "longest_tick_gap_s": self.longest_gap_s}

