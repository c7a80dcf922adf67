"""Stalls of the control loop (runtime/stalls.py): a late tick counted, attributed to the slowest
callback that ran during it, and reported for the hold-off; on plain values, no rclpy."""

from __future__ import annotations

import gc

import pytest

from vla_accel_ros.runtime.stalls import KEPT_WAITING, UNKNOWN_CAUSE, StallMonitor

PERIOD = 0.05


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def monitor(clock: FakeClock, holdoff_s: float = 10.0, cpu_clock=None) -> StallMonitor:
    """A monitor on ``clock``; its callbacks busy on the CPU all the time they run unless ``cpu_clock``."""
    return StallMonitor(PERIOD, stall_after_periods=3.0, holdoff_s=holdoff_s, clock=clock, cpu_clock=cpu_clock or clock)


def run(mon: StallMonitor, clock: FakeClock, ticks: int, stamp: float) -> float:
    for _ in range(ticks):
        assert mon.tick(stamp) is None
        clock.t += PERIOD
        stamp += PERIOD
    return stamp


def test_a_tick_later_than_the_bound_is_a_stall_named_with_the_callback_that_ran_during_it():
    clock = FakeClock()
    mon = monitor(clock)
    stamp = run(mon, clock, 10, 50.0)
    assert mon.report(stamp) == "" and mon.stats() == {"stalls": 0, "ticks_missed": 0,
                                                        "longest_tick_gap_s": pytest.approx(PERIOD)}
    with mon.timed("joint state callback"):
        clock.t += 2.0
    mon.record("instruction callback", clock.t - 0.1, clock.t)  # shorter: not the cause
    assert mon.overdue_s(stamp + 2.0) == pytest.approx(2.05)  # the last tick was one period before ``stamp``
    assert mon.report(stamp + 2.0).startswith("control loop stalled: no tick for 2.050 s (stall bound 0.150 s)")
    stall = mon.tick(stamp + 2.0)
    assert stall is not None and stall.gap_s == pytest.approx(2.05) and stall.missed == 40
    assert stall.cause == "joint state callback ran 2.000 s"
    report = mon.report(stamp + 2.0)
    assert report == ("control loop stalled 1 time(s) in the last 10 s: longest gap 2.050 s (40 tick(s) missed, "
                      "bound 0.150 s); likely cause: joint state callback ran 2.000 s")
    assert mon.stats() == {"stalls": 1, "ticks_missed": 40, "longest_tick_gap_s": pytest.approx(2.05)}
    clock.t += 9.0
    stamp = run(mon, clock, 5, stamp + 2.05)
    assert "longest gap 2.050 s" in mon.report(stamp)  # within the hold-off
    clock.t += 1.0
    assert mon.report(stamp - PERIOD) == ""  # the hold-off has passed


def test_a_late_tick_within_the_bound_is_none_and_a_stall_without_a_slow_callback_is_unexplained():
    clock = FakeClock()
    mon = monitor(clock)
    mon.tick(10.0)
    clock.t += 0.15
    assert mon.tick(10.15) is None  # exactly three periods: the bound
    clock.t += 0.4
    stall = mon.tick(10.55)
    assert stall is not None and stall.cause == UNKNOWN_CAUSE and stall.missed == 7


def test_restart_forgets_the_last_tick_and_a_clock_that_went_back_is_no_stall():
    clock = FakeClock()
    mon = monitor(clock)
    mon.tick(10.0)
    mon.restart()  # deactivated for a while, then activated again
    clock.t += 30.0
    assert mon.tick(40.0) is None
    assert mon.tick(5.0) is None  # sim reset
    assert mon.stats()["stalls"] == 0


def test_garbage_collections_are_timed_like_callbacks():
    clock = FakeClock()
    mon = monitor(clock)
    mon.tick(10.0)
    mon.gc_callback("start", {"generation": 2})
    clock.t += 0.3
    mon.gc_callback("stop", {"generation": 2})
    stall = mon.tick(10.3)
    assert stall is not None and stall.cause == "garbage collection (generation 2) ran 0.300 s"
    real = StallMonitor(PERIOD, 3.0, 10.0)
    gc.callbacks.append(real.gc_callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(real.gc_callback)


def test_a_wrapped_callback_is_timed_and_returns_its_result():
    clock = FakeClock()
    mon = monitor(clock)

    def slow(x: int) -> int:
        clock.t += 0.2
        return 2 * x

    mon.tick(1.0)
    assert mon.wrap("the slow one", slow)(21) == 42
    assert mon.tick(1.0 + 0.2 + PERIOD).cause == "the slow one ran 0.200 s"


def test_a_slow_callback_that_was_kept_off_the_cpu_is_named_as_waiting_not_busy():
    clock = FakeClock()
    mon = monitor(clock, cpu_clock=lambda: 0.0)  # no CPU time passes in the callback: it was preempted
    stamp = run(mon, clock, 5, 50.0)
    with mon.timed("report"):
        clock.t += 0.5
    stall = mon.tick(stamp + 0.5)
    assert stall is not None and stall.cause == f"report ran 0.500 s (0.000 s on the CPU: {KEPT_WAITING})"
