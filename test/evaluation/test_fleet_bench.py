"""fleet-bench on two tiny fleets: the summary's contract keys, the plot, and the streams it
decoded (the same observations for the batched process and the separate ones)."""

from __future__ import annotations

import json

from vla_accel_ros.evaluation.fleet_bench import (
    FleetBenchOptions,
    fleet_bench,
    load_stream,
)


def test_fleet_bench_writes_the_contract(tmp_path, tiny_checkpoint):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    opts = FleetBenchOptions(robots=(1, 2), out=str(tmp_path / "fleet"), checkpoint=str(ckpt), steps=3,
                             server_threads=2)
    summary = fleet_bench(opts, progress=False)
    assert [r["robots"] for r in summary["runs"]] == [1, 2]
    for run in summary["runs"]:
        for key in ("actions_per_s", "latency_ms_p50", "latency_ms_p99", "separate_actions_per_s"):
            assert run[key] > 0, key
        assert run["stage_ms"]["batched_pass"] > 0
        assert (run["server_threads"], run["separate_threads"]) == (2, 1)  # the fleet's at N = 1 too
    assert summary["runs"][0]["latency_p99_vs_one"] == 1.0
    assert json.loads((tmp_path / "fleet" / "summary.json").read_text())["runs"] == summary["runs"]
    assert (tmp_path / "fleet" / "fleet.png").stat().st_size > 1000
    a, b = load_stream(tmp_path / "fleet" / "streams.npz", 0), load_stream(tmp_path / "fleet" / "streams.npz", 1)
    assert len(a) == len(b) == 3 and a[0].instruction and (a[0].image != b[0].image).any()
