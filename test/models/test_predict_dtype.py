"""``vla-accel predict --json`` reports the dtype the policy computes in (its ``compute_dtype``), not
the dtype of a part kept in float32: a LeRobot π0 in bfloat16 keeps its vision tower, projector and
norms in float32 and computes in bfloat16; a Hugging Face VLA computes in the dtype asked for."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vla_accel_ros.cli import main

LEROBOT = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_lerobot_policy_reports_the_dtype_it_computes_in(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           dtype: str) -> None:
    ref = dict(np.load(LEROBOT / "pi0_reference.npz"))
    np.save(tmp_path / "front.npy", ref["front"][0])
    np.save(tmp_path / "wrist.npy", ref["wrist"][0])
    state = ",".join(repr(float(v)) for v in ref["state"][0])
    argv = ["predict", "--checkpoint", str(LEROBOT / "pi0"), "--image", str(tmp_path / "front.npy"), "--image",
            str(tmp_path / "wrist.npy"), f"--state={state}", "--instruction", str(ref["tasks"][0]),
            "--tokenizer-dir", str(LEROBOT / "tokenizers" / "paligemma"), "--dtype", dtype, "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == dtype


def test_the_tower_lerobot_keeps_in_float32_does_not_set_the_reported_dtype() -> None:
    from vla_accel_ros.models.load import load_policy

    policy = load_policy(LEROBOT / "pi0", dtype="bfloat16", tokenizer_dir=LEROBOT / "tokenizers" / "paligemma")
    tower = next(p for n, p in policy.model.named_parameters() if "vision_tower" in n)  # type: ignore[attr-defined]
    assert str(tower.dtype) == "torch.float32" and str(policy.compute_dtype) == "torch.bfloat16"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_token_vla_reports_the_dtype_it_computes_in(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      tiny_hf_vla: Callable[..., Path], dtype: str) -> None:
    from PIL import Image

    directory = tiny_hf_vla(tmp_path / "hf")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "frame.png")
    argv = ["predict", "--checkpoint", f"hf:{directory}", "--image", str(tmp_path / "frame.png"), "--instruction",
            "pick up the red cube", "--dtype", dtype, "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == dtype
