"""``vla-accel soak``'s arithmetic and its refusal of bad flags (the soak itself is a benchmark)."""

from __future__ import annotations

import numpy as np
import pytest

from vla_accel_ros.cli import main
from vla_accel_ros.ros.soak import PROCESSES, SoakOptions, slope_mb_per_min, summarize


def test_the_slope_is_in_mb_per_minute_and_ignores_a_process_that_was_gone():
    t = np.arange(0.0, 600.0, 10.0)
    rss = 100.0 + 0.5 * t / 60.0
    assert slope_mb_per_min(t, rss) == pytest.approx(0.5)
    rss[3] = np.nan
    assert slope_mb_per_min(t, rss) == pytest.approx(0.5)
    assert np.isnan(slope_mb_per_min(t[:2], rss[:2]))


def test_the_summary_takes_the_slope_after_the_warm_up_only():
    samples = []
    for k in range(61):
        t = 10.0 * k
        grows = 50.0 * min(t, 120.0) / 120.0  # 50 MB in the first two minutes, then flat
        samples.append({"t_s": t, **{f"{p}_rss_mb": 100.0 + grows for p in PROCESSES},
                        **{f"{p}_pid": 7 for p in PROCESSES}, "ticks": 500 * k, "ticks_published": 500 * k,
                        "commands_received": 500 * k, "policy_ticks": 100 * k})
    summary = summarize(samples, {"stalls": 2}, SoakOptions(minutes=10.0, warmup_min=2.0))
    for p in PROCESSES:
        assert summary[p]["rss_start_mb"] == 100.0 and summary[p]["rss_end_mb"] == 150.0
        assert summary[p]["slope_mb_per_min"] == pytest.approx(0.0, abs=1e-9) and not summary[p]["restarted"]
    assert summary["ticks"] == summary["ticks_published"] == 30_000 and summary["ticks_expected"] == 30_000
    assert summary["stalls"] == 2


def test_a_soak_of_no_minutes_is_one_error_line(capsys):
    assert main(["soak", "--minutes", "0"]) == 2
    assert capsys.readouterr().err.strip() == "soak: error: --minutes must be positive"
