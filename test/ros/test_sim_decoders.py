"""`vla-accel sim --decoders`: the live node with each decoder on the same seeds, its inference
latency next to the first decoder's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rclpy")


def test_each_decoder_runs_on_the_same_seeds_and_is_compared(tmp_path, tiny_checkpoint):
    from vla_accel_ros.ros.launcher import SimRunOptions, run_sim_decoders
    from vla_accel_ros.ros.parameters import PolicySettings

    policy = PolicySettings(checkpoint=str(tiny_checkpoint(tmp_path / "ckpt")), kinematic_r_min=2, kinematic_r_max=6)
    opts = SimRunOptions(episodes=1, duration_s=1.5, out=str(tmp_path / "run"), domain_id=212, inference_mode="thread",
                         policy=policy, realtime_priority=0)
    result = run_sim_decoders(opts, ["ar", "kerv"], progress=False)
    assert [r["decoder"] for r in result["decoders"]] == ["ar", "kerv"] and result["baseline"] == "ar"
    rows = {r["decoder"]: r for r in result["decoders"]}
    assert rows["ar"]["latency_ratio_vs_ar"] == pytest.approx(1.0)
    assert rows["ar"]["inference_target_passes_mean"] == pytest.approx(7.0)
    assert rows["kerv"]["inference_target_passes_mean"] < 7.0 and rows["kerv"]["latency_ratio_vs_ar"] > 0
    for decoder in ("ar", "kerv"):  # one run per decoder, the same seed
        summary = json.loads((tmp_path / "run" / decoder / "summary.json").read_text())
        assert summary["per_episode"][0]["seed"] == opts.seed and summary["options"]["decoder"] == decoder
    # the bounds go to the decoder with the kinematic threshold only (ar's node would refuse them)
    runs = {d: json.loads((tmp_path / "run" / d / "summary.json").read_text())["options"] for d in ("ar", "kerv")}
    assert runs["ar"]["kinematic_r_bounds"] is None and runs["kerv"]["kinematic_r_bounds"] == [2, 6]
    assert json.loads((tmp_path / "run" / "decoders.json").read_text())["decoders"] == result["decoders"]
