"""The run summary's reading of a node's tick log: the ticks before the first episode apart."""

from __future__ import annotations

import numpy as np
import pytest

from vla_accel_ros.ros.run_summary import SOURCE_CODES, episode_tick_counts

HOLD, FALLBACK, POLICY = SOURCE_CODES["hold"], SOURCE_CODES["fallback"], SOURCE_CODES["policy"]


def test_holds_before_the_first_episode_are_not_the_episodes() -> None:
    # 30 holding ticks while the node waits, then an episode: 2 fallback, 1 hold, 67 policy ticks
    sources = [HOLD] * 30 + [FALLBACK, FALLBACK, HOLD] + [POLICY] * 67
    log = {"wall": (100.0 + 0.05 * np.arange(len(sources))).tolist(), "source": sources}
    counts = episode_tick_counts(log, first_episode_wall=100.0 + 0.05 * 30 - 0.01)
    assert counts == {"pre_episode_ticks": 30, "episode_ticks": 70, "episode_hold_ticks": 1,
                      "episode_fallback_ticks": 2, "hold_tick_share": pytest.approx(1 / 70)}


def test_a_run_without_episode_ticks_has_no_hold_share() -> None:
    counts = episode_tick_counts({"wall": [1.0, 2.0], "source": [HOLD, HOLD]}, first_episode_wall=5.0)
    assert counts["episode_ticks"] == 0 and counts["hold_tick_share"] == 0.0 and counts["pre_episode_ticks"] == 2


def test_the_ticks_a_fault_affected_are_counted_by_cause_without_their_details() -> None:
    from vla_accel_ros.ros.run_summary import TickLog, tick_cause

    assert tick_cause("hold", "inference unavailable: inference process (pid 7) killed by SIGKILL; restarting (1/3)") \
        == "hold: inference unavailable"
    assert tick_cause("hold", "camera stale (0.612 s > 0.5 s)") == "hold: camera stale"
    assert tick_cause("hold", "no fresh policy action for 0.300 s (fallback_max_s = 0.25 s)") == \
        "hold: no fresh policy action for"
    assert tick_cause("fallback", "no fresh action; kalman prediction") == "fallback: no fresh action"
    assert tick_cause("fallback", "") == "fallback"

    class Tick:  # the fields TickLog reads of a TickResult
        def __init__(self, source: str, reason: str) -> None:
            self.source, self.reason, self.stamp, self.chunk_start = source, reason, 0.0, False
            self.q_command = self.q_measured = np.zeros(7)
            self.stats = type("Stats", (), {"jumps_accepted": 0})()

    log = TickLog(whole_run=False)
    for source, reason in [("policy", "")] * 3 + [("hold", "camera stale (0.6 s > 0.5 s)")] * 2 + \
            [("fallback", "no fresh action; kf")]:
        log.add(0.0, Tick(source, reason), 7)  # type: ignore[arg-type]
    assert log.affected_ticks() == {"affected_ticks": {"hold: camera stale": 2, "fallback: no fresh action": 1}}
