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
