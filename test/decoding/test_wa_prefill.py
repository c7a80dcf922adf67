"""``wa_prefill+X`` names: parsing, one decoding step on a world-aware policy, and the bench/eval
rows that set each against X."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.decoding import DecodeContext, make_decoder
from vla_accel_ros.decoding.sd import SDDecoder
from vla_accel_ros.decoding.wa_prefill import split_prefill
from vla_accel_ros.evaluation.bench import bench_entries, wa_comparison
from vla_accel_ros.models import (
    Policy,
    VLAConfig,
    WorldPrefill,
    load_checkpoint,
    save_checkpoint,
)
from vla_accel_ros.models.tokenizer import ActionTokenizer
from vla_accel_ros.runtime.runner import run_policy_step

torch.set_num_threads(1)


def test_names_parse() -> None:
    assert split_prefill("wa_prefill+sd") == ("sd", True)
    assert split_prefill("wa_prefill+kerv") == ("kerv", True)
    assert split_prefill("sd") == ("sd", False)
    for bad in ("wa_prefill+", "wa_prefill+nope", "nope", "wa_prefill+wa_prefill+sd"):
        with pytest.raises(ValueError, match="unknown decoder"):
            split_prefill(bad)
    assert isinstance(make_decoder(split_prefill("wa_prefill+sd")[0], r=3), SDDecoder)


def test_wa_prefill_sd_runs_one_step_on_a_world_aware_policy() -> None:
    config = VLAConfig(image_size=32, patch_size=16, d_model=32, n_heads=2, n_layers=2, max_text_len=16,
                       local_channels=8, contact_hidden=8)
    policy = Policy.create(config, ActionTokenizer(-np.full(7, 0.02), np.full(7, 0.02)), seed=3)
    obs = Observation(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8), "pick up the red cube",
                      np.zeros(7, np.float32), 0.04)
    plain = run_policy_step(policy, obs, make_decoder(split_prefill("sd")[0]), DecodeContext())
    torch.manual_seed(0)
    policy.world = WorldPrefill.for_target(config, latent_channels=4, width=8, hidden=16, head_hidden=16)
    result = run_policy_step(policy, obs, make_decoder(split_prefill("wa_prefill+sd")[0]), DecodeContext())
    assert result.tokens.shape == (7,) and np.all(np.isfinite(result.action)) and result.target_passes >= 1
    np.testing.assert_array_equal(result.tokens, plain.tokens)  # a fresh (zero) bias changes nothing


def test_bench_entries_and_comparison() -> None:
    entries = bench_entries(["ar", "sd", "wa_prefill+sd"], sweep=False, incremental_vision=True)
    by_name = {e.name: e for e in entries}
    assert by_name["wa_prefill+sd"].decoder == "sd" and by_name["wa_prefill+sd"].wa_prefill
    assert by_name["wa_prefill+sd+iv"].decoder == "sd" and by_name["wa_prefill+sd+iv"].incremental_vision
    assert not by_name["sd"].wa_prefill
    row = dict(success_rate=0.5, ncf_share=0.5, mean_accepted_len=3.0, total_ms_p50=10.0, decode_ms_p50=4.0)
    rows = {"sd": row, "wa_prefill+sd": dict(row, success_rate=0.6, ncf_share=0.25, total_ms_p50=8.0),
            "wa_prefill+kerv": row}  # no kerv row: nothing to compare with
    comparison = wa_comparison(rows)
    assert set(comparison) == {"wa_prefill+sd"}
    c = comparison["wa_prefill+sd"]
    assert c["base"] == "sd" and c["speedup_vs_base"] == pytest.approx(1.25)
    assert c["ncf_share_relative_change"] == pytest.approx(-0.5) and c["base_success_rate"] == 0.5


CHECKPOINT = default_checkpoint()


@pytest.mark.skipif(not (CHECKPOINT / "model.json").is_file(), reason="no shipped checkpoint")
def test_bench_and_eval_run_wa_rows(tmp_path, capsys) -> None:
    """With a zero bias the world-aware rows must reproduce their base decoder exactly."""
    policy = load_checkpoint(CHECKPOINT)
    policy.world = WorldPrefill.for_target(policy.config)
    wa = save_checkpoint(policy, tmp_path / "wa", {"test": "zero bias"})
    out = tmp_path / "bench"
    assert main(["bench", "--episodes", "1", "--max-steps", "5", "--decoders", "wa_prefill+sd", "--sweep-r", "9",
                 "--sweep-decoders", "sd", "--wa-checkpoint", str(wa), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"ar", "sd", "wa_prefill+sd"}  # the base X is added for the comparison
    assert set(summary["wa_prefill+sd"]) == set(summary["sd"])
    for key in ("success_rate", "mean_accepted_len", "target_passes_per_action"):
        assert summary["wa_prefill+sd"][key] == summary["sd"][key]
    comparison = json.loads((out / "wa_comparison.json").read_text())
    assert comparison["wa_prefill+sd"]["base"] == "sd" and comparison["wa_prefill+sd"]["speedup_vs_base"] > 0
    assert json.loads((out / "meta.json").read_text())["wa_checkpoint_mb"] <= 15
    # the relaxation sweep: wa_prefill+sd follows sd's sweep and is compared at the same r
    assert set(json.loads((out / "sweep.json").read_text())) == {"sd@r=9", "wa_prefill+sd@r=9"}
    assert comparison["wa_prefill+sd@r=9"]["base"] == "sd@r=9"
    assert set(json.loads((out / "matched_success.json").read_text())) == {"sd", "wa_prefill+sd"}
    assert (out / "wa_relaxation.png").is_file()

    capsys.readouterr()
    assert main(["bench", "--episodes", "1", "--decoders", "wa_prefill+sd", "--out", str(tmp_path / "b2")]) == 2
    assert "bench: error:" in (err := capsys.readouterr().err) and "wa-checkpoint" in err
    assert main(["bench", "--episodes", "1", "--decoders", "wa_prefill+sd", "--wa-checkpoint", str(CHECKPOINT),
                 "--out", str(tmp_path / "b3")]) == 2
    assert "no world component" in capsys.readouterr().err
    out = tmp_path / "eval"
    assert main(["eval", "--decoder", "wa_prefill+sd", "--wa-checkpoint", str(wa), "--episodes", "1",
                 "--max-steps", "3", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["decoder"] == "wa_prefill+sd"
    capsys.readouterr()
    assert main(["eval", "--decoder", "wa_prefill+nope", "--out", str(tmp_path / "e2")]) == 2
    assert "eval: error:" in (err := capsys.readouterr().err) and "unknown decoder" in err
    assert main(["eval", "--decoder", "wa_prefill+sd", "--out", str(tmp_path / "e3")]) == 2
    assert "no world component" in capsys.readouterr().err
