"""``vla-accel soak``'s arithmetic, its refusal of bad flags, and a short soak of a tiny SmolVLA-layout
policy with ``--chunk-execution async`` (the soak itself, 30 minutes, is a benchmark)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla_accel_ros.cli import main
from vla_accel_ros.ros.soak import PROCESSES, SoakOptions, node_parameters, slope_mb_per_min, summarize

SOAK_DOMAIN_ID = 139


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


def test_the_chunk_execution_flag_reaches_the_node_and_a_bad_one_is_refused(capsys):
    assert node_parameters(SoakOptions(chunk_execution="wait"))["chunk_execution"] == "wait"
    assert node_parameters(SoakOptions())["chunk_execution"] == "async"  # the node's own default
    with pytest.raises(SystemExit) as exit_info:
        main(["soak", "--chunk-execution", "later"])
    assert exit_info.value.code == 2 and "--chunk-execution: invalid choice: 'later'" in capsys.readouterr().err


def test_a_short_soak_of_a_chunked_policy_in_async_execution(tmp_path, monkeypatch, capsys, fixture_layout):
    pytest.importorskip("rclpy")
    pytest.importorskip("transformers")
    layout = fixture_layout("lerobot")
    monkeypatch.setenv("HF_HOME", str(layout.hf_cache(tmp_path / "hf")))  # the tokenizer, for the node's child
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    policy = layout.write_smolvla_dir(tmp_path / "smolvla_tiny")
    out = tmp_path / "soak"
    code = main(["soak", "--minutes", "0.4", "--warmup-min", "0.1", "--sample-s", "2", "--rate", "20",
                 "--max-slope", "1000", "--checkpoint", str(policy), "--decoder", "flow10",
                 "--chunk-execution", "async", "--domain-id", str(SOAK_DOMAIN_ID), "--out", str(out)])
    printed = capsys.readouterr().out
    print(printed)
    assert code == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["chunk_execution"] == "async" and summary["checkpoint"] == str(policy)
    assert summary["ticks"] > 100 and summary["ticks_published"] == summary["ticks"]
    assert summary["policy_ticks"] > 0 and summary["chunks_planned"] > 0
    for process in PROCESSES:
        assert np.isfinite(summary[process]["slope_mb_per_min"]) and not summary[process]["restarted"]
