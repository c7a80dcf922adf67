"""hf-cost at a tiny shape: every pass timed, the implied speed-ups follow from the costs, and the
incremental prefill is timed against the full one over sim frames."""

from __future__ import annotations

import json

import pytest

from vla_accel_ros.cli import main
from vla_accel_ros.evaluation.hf_cost import BENCH_PASSES, CostOptions, hf_cost
from vla_accel_ros.models.configuration import VisionReuseConfig


def test_costs_and_implied_speedups(tmp_path):
    pytest.importorskip("transformers")
    result = hf_cost(CostOptions(hidden=64, layers=1, image_size=56, patch_size=14, repeats=1, out=str(tmp_path)))
    for key in ("prefill_ms", "step_1_token_ms", "verify_6_tokens_ms", "prefill_verifying_6_ms", "vision_ms"):
        assert result[key] > 0, key
    assert result["prefix_tokens"] > 16  # BOS, 16 image tokens, the prompt
    rows = {r["decoder"]: r for r in result["decoders"]}
    assert rows["ar"]["implied_speedup"] == pytest.approx(1.0)
    kerv = result["prefill_ms"] + BENCH_PASSES["kerv"] * result["verify_6_tokens_ms"]
    assert rows["kerv"]["implied_ms"] == pytest.approx(kerv)
    assert (tmp_path / "summary.json").is_file()


def test_full_and_incremental_prefill_over_sim_frames(tmp_path):
    pytest.importorskip("transformers")
    opts = CostOptions(hidden=64, layers=1, image_size=56, patch_size=14, repeats=1, out=str(tmp_path),
                       incremental=True, frames=4)
    inc = hf_cost(opts)["incremental"]
    assert inc["frames"] == 4 and inc["refreshes"] == 1  # the first frame only
    assert 0 < inc["recomputed_fraction_mean"] < 1  # the first frame all, the others what the arm's motion changed
    assert inc["prefill_full_ms_mean"] > 0 and inc["prefill_incremental_ms_mean"] > 0
    assert inc["incremental_prefill_speedup"] == pytest.approx(inc["prefill_full_ms_mean"]
                                                               / inc["prefill_incremental_ms_mean"])


def test_a_checkpoint_is_timed_at_its_own_size_under_the_feature_rule(tmp_path, tiny_hf_vla):
    directory = tiny_hf_vla(tmp_path / "tiny")
    opts = CostOptions(repeats=1, out=str(tmp_path / "out"), checkpoint=f"hf:{directory}", incremental=True, frames=3,
                       vision=VisionReuseConfig(reuse_kv=True, feature_threshold=0.1))
    result = hf_cost(opts)
    assert result["parameters"] < 1_000_000 and result["prefix_tokens"] > 16  # the tiny model, not a built one
    inc = result["incremental"]
    assert inc["frames"] == 3 and inc["refreshes"] == 1
    assert inc["incremental_prefill_speedup_p50"] == pytest.approx(inc["prefill_full_ms_p50"]
                                                                   / inc["prefill_incremental_ms_p50"])


def test_the_incremental_timing_needs_reused_keys_and_values():
    with pytest.raises(ValueError, match="reuse_kv"):
        CostOptions(incremental=True, vision=VisionReuseConfig())


def test_the_tower_reuse_flags_reach_the_incremental_prefill(tmp_path, tiny_hf_vla):
    directory = tiny_hf_vla(tmp_path / "tiny", vision="siglip")
    out = tmp_path / "out"
    assert main(["hf-cost", "--checkpoint", f"hf:{directory}", "--repeats", "1", "--incremental", "--frames", "5",
                 "--vision-reuse-tower", "--vision-tower-threshold", "0", "--vision-tower-refresh", "2",
                 "--out", str(out)]) == 0
    inc = json.loads((out / "summary.json").read_text())["incremental"]
    # frames 1 and 3 (the timer, every 2) run the tower on every patch, the others on the moved ones only
    assert 0 < inc["tower_recomputed_fraction_mean"] < 1 and inc["refreshes"] == 1
