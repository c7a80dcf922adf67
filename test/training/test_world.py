"""`vla-accel train-world` end to end on a tiny generated dataset and a tiny random checkpoint."""

import argparse
import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros import cli
from vla_accel_ros.commands.train_world import add_arguments
from vla_accel_ros.models import load_checkpoint
from vla_accel_ros.models.own.checkpoint import WORLD_META_FILE, WORLD_WEIGHTS_FILE
from vla_accel_ros.training.world import WorldTrainConfig, train_world

torch.set_num_threads(1)
SIZE = 32


def make_episode(rng: np.random.Generator, steps: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """A red square sliding right on a noisy background; the action is its next displacement."""
    images = rng.integers(0, 40, (steps, SIZE, SIZE, 3), dtype=np.uint8)
    y, x0 = rng.integers(0, SIZE - 8), rng.integers(0, 6)
    for t in range(steps):
        x = min(x0 + 2 * t, SIZE - 8)
        images[t, y : y + 8, x : x + 8] = (220, 40, 40)
    actions = np.zeros((steps, 7), np.float32)
    actions[:, 0] = 0.01
    actions[:, 6] = 1.0
    return images, actions


@pytest.fixture(scope="module")
def setup(demo_set) -> tuple[Path, Path]:
    return demo_set("world", lambda rng: (make_episode(rng) for _ in range(5)),
                    image_size=SIZE, patch_size=8, keypoints=2, max_text_len=16)


def test_train_world_writes_a_world_aware_checkpoint(setup, tmp_path: Path) -> None:
    data, base = setup
    before = sorted(p.name for p in base.iterdir())
    out = tmp_path / "wa"
    cfg = WorldTrainConfig(checkpoint=str(base), data=str(data), out=str(out), ae_epochs=2, bias_epochs=3,
                           finetune_epochs=1, draft_epochs=1, batch_size=16, latent_channels=4, width=8, hidden=16,
                           head_hidden=16, progress=False, threads=1)
    metrics = train_world(cfg)
    assert sorted(p.name for p in base.iterdir()) == before  # the base is read only
    names = {p.name for p in out.iterdir()}
    assert {"model.json", "model.safetensors", WORLD_META_FILE, WORLD_WEIGHTS_FILE, "world_loss.png"} <= names
    policy = load_checkpoint(out)
    assert policy.world is not None and policy.world.autoencoder.config.grid == 4
    meta = json.loads((out / WORLD_META_FILE).read_text())
    for key in ("ae_val_mse", "ae_val_psnr_db", "next_val_mse", "next_val_mse_persistence",
                "next_val_mse_bias_zeroed", "bias_rms_ratio", "base", "finetuned"):
        assert key in meta["metrics"], key
    assert meta["recipe"]["command"].startswith("vla-accel train-world") and meta["recipe"]["seed"] == 0
    assert metrics["finetuned"]["val_samples"] == metrics["base"]["val_samples"] > 0
    assert json.loads((out / "model.json").read_text())["recipe"]["command"] == meta["recipe"]["command"]
    assert sum(p.stat().st_size for p in out.iterdir()) <= 15e6
    with pytest.raises(ValueError, match="differ"):
        train_world(WorldTrainConfig(checkpoint=str(base), data=str(data), out=str(base), progress=False))


def test_cli_and_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--checkpoint", "b", "--data", "d", "--out", "o", "--ae-epochs", "3", "--max-episodes",
                              "300", "--lr", "2e-3", "--seed", "1", "--bias-epochs", "5", "--finetune-epochs", "1"])
    cfg = WorldTrainConfig(**{k: v for k, v in vars(args).items() if k in WorldTrainConfig.__dataclass_fields__})
    assert (cfg.ae_epochs, cfg.max_episodes, cfg.lr, cfg.seed, cfg.bias_epochs) == (3, 300, 2e-3, 1, 5)
    command = shlex.split(cfg.command())
    assert command[:2] == ["vla-accel", "train-world"] and "--ae-epochs" in command and "--width" not in command
    assert "train-world" in cli.COMMANDS
    with pytest.raises(ValueError, match="ae_epochs"):
        WorldTrainConfig(checkpoint="b", data="d", out="o", ae_epochs=-1)
    with pytest.raises(ValueError, match="max_episodes"):
        WorldTrainConfig(checkpoint="b", data="d", out="o", max_episodes=0)


def test_scene_weight_trains_a_probe_on_the_bias_and_reports_it(setup, tmp_path: Path) -> None:
    data, base = setup
    common = {"checkpoint": str(base), "data": str(data), "ae_epochs": 1, "bias_epochs": 2, "finetune_epochs": 0,
              "draft_epochs": 0, "batch_size": 16, "latent_channels": 4, "width": 8, "hidden": 16, "head_hidden": 16,
              "progress": False, "threads": 1}
    plain = train_world(WorldTrainConfig(out=str(tmp_path / "plain"), **common))
    scene = train_world(WorldTrainConfig(out=str(tmp_path / "scene"), scene_weight=1.0, **common))
    assert "scene_val_contact_acc" not in plain
    assert 0.0 <= scene["scene_val_contact_acc"] <= 1.0 and 0.5 <= scene["scene_val_contact_base_rate"] <= 1.0
    assert scene["bias_rms"] != plain["bias_rms"]  # the probe's loss reaches the bias
    meta = json.loads((tmp_path / "scene" / WORLD_META_FILE).read_text())
    assert "scene probe" in meta["recipe"]["bias_objective"] and meta["recipe"]["scene_weight"] == 1.0
    with pytest.raises(ValueError, match="scene_weight"):
        WorldTrainConfig(checkpoint="b", data="d", out="o", scene_weight=-1.0)
