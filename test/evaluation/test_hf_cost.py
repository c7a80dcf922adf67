"""hf-cost at a tiny shape: every pass timed, and the implied speed-ups follow from the costs."""

from __future__ import annotations

import pytest

from vla_accel_ros.evaluation.hf_cost import BENCH_PASSES, CostOptions, hf_cost


def test_costs_and_implied_speedups(tmp_path):
    pytest.importorskip("transformers")
    result = hf_cost(CostOptions(hidden=64, layers=1, image_size=56, patch_size=14, repeats=1, out=str(tmp_path)))
    for key in ("prefill_ms", "step_1_token_ms", "verify_6_tokens_ms", "prefill_verifying_6_ms"):
        assert result[key] > 0, key
    assert result["prefix_tokens"] > 16  # BOS, 16 image tokens, the prompt
    rows = {r["decoder"]: r for r in result["decoders"]}
    assert rows["ar"]["implied_speedup"] == pytest.approx(1.0)
    kerv = result["prefill_ms"] + BENCH_PASSES["kerv"] * result["verify_6_tokens_ms"]
    assert rows["kerv"]["implied_ms"] == pytest.approx(kerv)
    assert (tmp_path / "summary.json").is_file()
