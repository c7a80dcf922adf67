"""`vla-accel vision-fidelity`: the per-frame comparison of incremental vision with the full prefill."""

import json

import numpy as np
import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.evaluation.vision_fidelity import FidelityRecord


def test_record_summary_on_hand_made_frames() -> None:
    record = FidelityRecord()
    full = np.array([10, 20, 30, 40, 50, 60, 254])
    hidden = torch.ones(1, 4)
    record.add(full.copy(), full, hidden, hidden, since_refresh=0, recomputed=1.0)
    record.add(full + np.array([0, 0, 3, 0, 0, 0, 0]), full, hidden * 1.1, hidden, since_refresh=1, recomputed=0.1)
    summary = record.summary()
    assert summary["frames"] == 2
    assert summary["action_agreement"] == 0.5  # the second frame differs in one token
    assert summary["token_agreement"] == pytest.approx(13 / 14)
    assert summary["token_within_2"] == pytest.approx(13 / 14)
    assert summary["max_token_distance"] == 3
    assert summary["recomputed_fraction"] == pytest.approx(0.55)
    assert summary["by_frames_since_refresh"][0] == {"frames": 1, "action_agreement": 1.0, "hidden_rel_error_mean": 0.0}
    assert summary["by_frames_since_refresh"][1]["hidden_rel_error_mean"] == pytest.approx(0.1)


@pytest.mark.skipif(not (default_checkpoint() / "model.json").is_file(), reason="no shipped checkpoint")
def test_threshold_zero_without_reused_keys_matches_the_full_prefill(tmp_path, capsys) -> None:
    out = tmp_path / "fidelity"
    assert main(["vision-fidelity", "--episodes", "1", "--max-steps", "6", "--vision-threshold", "0",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iv"]["frames"] == summary["ivkv"]["frames"] == 6
    assert summary["iv"]["action_agreement"] == 1.0  # every changed patch re-encoded: the full prefill
    assert summary["iv"]["hidden_rel_error_p99"] < 1e-5  # float rounding of the smaller batches only
    assert 0.0 <= summary["ivkv"]["action_agreement"] <= 1.0
    assert (out / "fidelity.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main(["vision-fidelity", "--episodes", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "vision-fidelity: error: --episodes must be >= 1" in capsys.readouterr().err
