"""Demo loading and `vla-accel train` end to end on a tiny generated dataset."""

import argparse
import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros import cli
from vla_accel_ros.commands.train import add_arguments
from vla_accel_ros.models import load_checkpoint
from vla_accel_ros.training.common import cosine_schedule, random_shift
from vla_accel_ros.training.data import DatasetError, load_demos
from vla_accel_ros.training.target import TrainConfig

torch.set_num_threads(1)
COLOURS = {"red": (230, 20, 20), "green": (20, 210, 20), "blue": (20, 20, 230)}
SIZE = 32


def write_episode(
    path: Path, rng: np.random.Generator, colour: str, steps: int = 16, success: bool = True,
    policy_in_loop: bool = False
) -> None:
    """One episode in the demo format: random background, a coloured square; the action depends on
    the square's position and colour and on the proprio, so there is something to learn."""
    images = rng.integers(0, 60, (steps, SIZE, SIZE, 3), dtype=np.uint8)
    corner = rng.integers(0, SIZE - 10, (steps, 2))
    for t, (r, c) in enumerate(corner):
        images[t, r : r + 10, c : c + 10] = COLOURS[colour]
    joint_pos = rng.normal(0, 0.5, (steps, 7)).astype(np.float32)
    gripper = rng.uniform(0, 0.04, steps).astype(np.float32)
    actions = np.zeros((steps, 7), np.float32)
    actions[:, 0] = (corner[:, 1] / SIZE - 0.5) * 0.02
    actions[:, 1] = (corner[:, 0] / SIZE - 0.5) * 0.02
    actions[:, 2] = 0.01 * np.tanh(joint_pos[:, 0])
    actions[:, 3:6] = 0.05 * (list(COLOURS).index(colour) - 1)
    actions[:, 6] = gripper > 0.02
    np.savez_compressed(
        path, images=images, joint_pos=joint_pos, gripper=gripper, actions=actions, near_contact=gripper < 0.015,
        target_clearance=gripper, instruction=np.array(f"pick up the {colour} cube"), color=np.array(colour),
        success=np.array(success), seed=np.array(0, np.int64), policy_in_loop=np.array(policy_in_loop),
    )


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demos")
    rng = np.random.default_rng(0)
    for i in range(10):
        write_episode(out / f"episode_{i:05d}.npz", rng, list(COLOURS)[i % 3], success=i != 4)
    (out / "summary.json").write_text(json.dumps({"episodes": 10}))
    return out


def test_load_demos(demo_dir: Path) -> None:
    data = load_demos(demo_dir, max_text_len=8, progress=False)
    assert data.n_episodes == 9 and "episode_00004.npz" not in data.files  # the failed one is skipped
    assert len(data) == 9 * 16 and data.images.dtype == torch.uint8 and data.images.shape[1:] == (SIZE, SIZE, 3)
    assert data.proprio.shape == (144, 8) and data.actions.shape == (144, 7) and data.text.shape == (144, 8)
    assert bytes(data.text[0].numpy().astype(np.uint8)) == b"pick up "
    train_idx, val_idx = data.split(0.1)
    assert len(val_idx) == 16 and set(data.episode[val_idx].tolist()) == {8}
    assert len(train_idx) + len(val_idx) == len(data)
    everything = load_demos(demo_dir, max_text_len=8, only_success=False, max_episodes=5, progress=False)
    assert everything.n_episodes == 5 and "episode_00004.npz" in everything.files


def test_load_demos_keeps_failed_policy_in_loop_episodes(tmp_path: Path) -> None:
    """A DAgger episode's labels are the expert's even when the mixed run failed, so it is kept."""
    rng = np.random.default_rng(1)
    write_episode(tmp_path / "episode_00000.npz", rng, "red")
    write_episode(tmp_path / "episode_00001.npz", rng, "red", success=False)
    write_episode(tmp_path / "episode_00002.npz", rng, "blue", success=False, policy_in_loop=True)
    data = load_demos(tmp_path, max_text_len=8, progress=False)
    assert data.files == ("episode_00000.npz", "episode_00002.npz")


def test_load_demos_errors(tmp_path: Path, demo_dir: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_demos(tmp_path / "missing", 8)
    with pytest.raises(DatasetError, match="no episode"):
        load_demos(tmp_path, 8)
    (tmp_path / "episode_00000.npz").write_bytes(b"not a zip file")
    with pytest.raises(DatasetError, match="episode_00000.npz"):
        load_demos(tmp_path, 8, progress=False)
    with np.load(demo_dir / "episode_00000.npz") as src:
        arrays = {k: src[k] for k in src.files if k != "actions"}
    np.savez(tmp_path / "episode_00000.npz", **arrays)
    with pytest.raises(DatasetError, match="missing arrays \\['actions'\\]"):
        load_demos(tmp_path, 8, progress=False)


def test_random_shift_and_schedule() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8, generator=g)
    same, moved = random_shift(images, 0, g)
    assert torch.equal(same, images) and torch.all(moved == 0)
    shifted, moved = random_shift(images, 2, g)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8 and moved.shape == (4, 2)
    assert not torch.equal(shifted, images) and moved.abs().max() <= 2
    for b in range(4):  # away from the border, content moved by exactly ``moved`` (x, y) pixels
        mx, my = int(moved[b, 0]), int(moved[b, 1])
        assert torch.equal(shifted[b, 2 + my : 14 + my, 2 + mx : 14 + mx], images[b, 2:14, 2:14])
    assert cosine_schedule(0, 100, 10) == pytest.approx(0.1)
    assert cosine_schedule(10, 100, 10) == pytest.approx(1.0)
    assert cosine_schedule(100, 100, 10) == pytest.approx(0.1)


def test_train_command_end_to_end(demo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    argv = ["train", "--data", str(demo_dir), "--out", str(out), "--epochs", "5", "--batch-size", "16",
            "--lr", "3e-3", "--warmup-steps", "5", "--draft-epochs", "2", "--d-model", "32", "--n-layers", "2",
            "--n-heads", "2", "--max-text-len", "8", "--patch-size", "8", "--local-channels", "8",
            "--threads", "1", "--seed", "7", "--val-fraction", "0.2", "--no-progress"]
    assert cli.main(argv) == 0
    history = json.loads((out / "loss_history.json").read_text())
    bc, draft = history["bc"], history["draft"]
    assert np.mean(bc[-5:]) < np.mean(bc[:5]) - 1.0  # the target learns
    assert np.mean(draft[-5:]) < np.mean(draft[:5])  # so does the draft head
    assert len(history["bc_val"]) == 5
    assert (out / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meta = json.loads((out / "model.json").read_text())
    metrics = meta["metrics"]
    for key in ("target_token_acc", "draft_agreement", "draft_agreement_within2", "accept_len_r0", "contact_bce"):
        assert key in metrics
    assert metrics["val_episodes"] == 2 and 0.0 <= metrics["draft_agreement"] <= 1.0
    assert metrics["accept_len_r9"] >= metrics["accept_len_r0"] >= 1.0  # draft token 0 is the target's own
    assert meta["recipe"]["seed"] == 7 and meta["recipe"]["n_episodes"] == 9
    # the recorded command parses back to the same training configuration
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    words = shlex.split(meta["recipe"]["command"])
    assert words[:2] == ["vla-accel", "train"]
    args = vars(parser.parse_args(words[2:]))
    assert TrainConfig(**args) == TrainConfig(
        data=str(demo_dir), out=str(out), epochs=5, batch_size=16, lr=3e-3, warmup_steps=5, draft_epochs=2,
        d_model=32, n_layers=2, n_heads=2, max_text_len=8, patch_size=8, local_channels=8, threads=1, seed=7,
        val_fraction=0.2, progress=False)
    assert args["epochs"] == 5 and args["lr"] == 3e-3 and args["progress"] is False
    policy = load_checkpoint(out)
    assert policy.config.image_size == SIZE and policy.config.d_model == 32

    # --init fine-tunes that checkpoint: same architecture and statistics, and it starts where it ended
    tuned = tmp_path / "tuned"
    assert cli.main(["train", "--data", str(demo_dir), "--out", str(tuned), "--init", str(out), "--epochs", "1",
                     "--draft-epochs", "0", "--batch-size", "16", "--threads", "1", "--no-progress"]) == 0
    tuned_policy = load_checkpoint(tuned)
    assert tuned_policy.config == policy.config
    np.testing.assert_array_equal(tuned_policy.tokenizer.q01, policy.tokenizer.q01)
    tuned_bc = json.loads((tuned / "loss_history.json").read_text())["bc"]
    assert np.mean(tuned_bc[:3]) < np.mean(bc[:3]) - 1.0


def test_train_flow_command_adds_the_head(demo_dir: Path, tmp_path: Path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ckpt", image_size=SIZE, patch_size=8, max_text_len=8)
    out = tmp_path / "with_flow"
    argv = ["train-flow", "--checkpoint", str(ckpt), "--data", str(demo_dir), "--out", str(out), "--epochs", "3",
            "--distill-epochs", "2", "--batch-size", "32", "--hidden", "32", "--layers", "1", "--threads", "1",
            "--no-progress"]
    assert cli.main(argv) == 0
    meta = json.loads((out / "flow_head.json").read_text())
    for key in ("teacher_abs_bins", "student_abs_bins", "agreement_abs_bins", "agreement_within2"):
        assert key in meta["metrics"]  # teacher-versus-student agreement on the held-out demos
    assert meta["metrics"]["val_samples"] == 16 and meta["config"]["student_steps"] == 2
    assert load_checkpoint(out).flow is not None and load_checkpoint(ckpt).flow is None  # a copy, not in place
    assert (out / "flow_loss.png").read_bytes()[:4] == b"\x89PNG"
