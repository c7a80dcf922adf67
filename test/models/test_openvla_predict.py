"""``vla-accel predict`` for every family: its ``--json`` contract, the logits in id order, and bad
input as one line naming the file or key, with exit status 2 and no traceback."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vla_accel_ros.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "openvla"
_spec = importlib.util.spec_from_file_location("openvla_layout", FIXTURES / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)
KEYS = {"action_token_ids", "action_normalized", "action", "timing_ms", "family", "checkpoint", "decoder", "dtype",
        "unnorm_key", "target_passes"}


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("predict") / "frame.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def openvla_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layout.write_openvla_dir(tmp_path_factory.mktemp("predict") / "openvla")


def predict(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["predict", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_openvla_json_contract_and_logits(capsys, openvla_dir, image) -> None:
    from vla_accel_ros.models.load import load_policy

    out = predict(capsys, "--checkpoint", str(openvla_dir), "--image", str(image), "--instruction",
                  "pick up the red cube", "--dtype", "float32", "--logits")
    assert KEYS | {"action_logits"} <= set(out)
    assert out["family"] == "openvla" and out["dtype"] == "float32" and out["unnorm_key"] == layout.DATASET
    ids = np.array(out["action_token_ids"])
    assert ids.shape == (7,) and np.all((31744 <= ids) & (ids <= 31999))
    logits = np.array(out["action_logits"])
    assert logits.shape == (7, 256)
    np.testing.assert_array_equal(31744 + logits.argmax(axis=1), ids)  # greedy, ids in id order
    centres = (np.linspace(-1, 1, 256)[:-1] + np.linspace(-1, 1, 256)[1:]) / 2
    normalized = centres[np.clip(32000 - ids - 1, 0, 254)]
    np.testing.assert_allclose(out["action_normalized"], normalized)
    stats = layout.STATISTICS[layout.DATASET]["action"]
    q01, q99 = np.array(stats["q01"]), np.array(stats["q99"])
    expected = np.where(stats["mask"], 0.5 * (normalized + 1) * (q99 - q01) + q01, normalized)
    np.testing.assert_allclose(out["action"], expected)
    assert set(out["timing_ms"]) == {"load", "prefill", "decode", "total"}
    assert load_policy(openvla_dir).dtype.is_floating_point  # stored bfloat16 by default:
    assert predict(capsys, "--checkpoint", str(openvla_dir), "--image", str(image), "--instruction",
                   "pick up the red cube")["dtype"] == "bfloat16"


def test_every_family(capsys, tiny_checkpoint, tiny_hf_vla, tmp_path, image) -> None:
    own = predict(capsys, "--checkpoint", str(tiny_checkpoint(tmp_path / "own")), "--image", str(image),
                  "--instruction", "pick up the red cube", "--logits")
    assert own["family"] == "own" and KEYS <= set(own) and np.array(own["action_logits"]).shape == (7, 256)
    hf = predict(capsys, "--checkpoint", f"hf:{tiny_hf_vla(tmp_path / 'hf')}", "--image", str(image),
                 "--instruction", "pick up the red cube")
    assert hf["family"] == "hf" and KEYS <= set(hf) and len(hf["action_token_ids"]) == 7


@pytest.mark.parametrize("damage, words", [
    ("unnorm_key", ["dataset_statistics.json", "no dataset 'bridge_orig'", "tiny_dataset"]),
    ("shard", ["model-00001-of-00002.safetensors: missing"]),
    ("image", ["frame.txt: cannot read it as an image"]),
])
def test_bad_input_is_one_line_without_a_traceback(openvla_dir, image, tmp_path, damage, words) -> None:
    import shutil

    directory = tmp_path / "openvla"
    shutil.copytree(openvla_dir, directory)
    args = ["--checkpoint", str(directory), "--image", str(image), "--instruction", "pick up the red cube"]
    if damage == "unnorm_key":
        args += ["--unnorm-key", "bridge_orig"]
    elif damage == "shard":
        (directory / "model-00001-of-00002.safetensors").unlink()
    else:
        (tmp_path / "frame.txt").write_text("not an image")
        args[3] = str(tmp_path / "frame.txt")
    proc = subprocess.run([sys.executable, "-m", "vla_accel_ros.cli", "predict", *args, "--json"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(word in lines[0] for word in words), lines[0]
