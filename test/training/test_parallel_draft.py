"""`vla-accel train-parallel-draft` end to end on a tiny generated dataset and a tiny random checkpoint,
and its objective against what ``draft_tokens_parallel`` sees at inference."""

import argparse
import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros import cli
from vla_accel_ros.commands.train_parallel_draft import add_arguments
from vla_accel_ros.models import ParallelDraftHead, load_checkpoint
from vla_accel_ros.models.own.checkpoint import (
    PARALLEL_DRAFT_META_FILE,
    PARALLEL_DRAFT_WEIGHTS_FILE,
)
from vla_accel_ros.training.common import greedy_rollout
from vla_accel_ros.training.data import load_demos
from vla_accel_ros.training.parallel_draft import (
    AGREEMENT_RADII,
    ParallelDraftTrainConfig,
    parallel_draft_loss,
    parallel_queries,
    train_head,
    train_parallel_draft,
)

torch.set_num_threads(1)
SIZE = 32


def make_episode(rng: np.random.Generator, colour: tuple[int, int, int],
                 steps: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """A coloured square at a random place on a noisy background; the action follows the square."""
    images = rng.integers(0, 60, (steps, SIZE, SIZE, 3), dtype=np.uint8)
    corner = rng.integers(0, SIZE - 8, (steps, 2))
    for t, (r, c) in enumerate(corner):
        images[t, r : r + 8, c : c + 8] = colour
    actions = np.zeros((steps, 7), np.float32)
    actions[:, :2] = (corner / SIZE - 0.5) * 0.02
    actions[:, 6] = 1.0
    return images, actions


@pytest.fixture(scope="module")
def setup(demo_set) -> tuple[Path, Path]:
    def episodes(rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return (make_episode(rng, ((220, 40, 40), (40, 220, 40))[i % 2]) for i in range(6))

    demos, base = demo_set("pdraft", episodes, image_size=SIZE, patch_size=8, max_text_len=16)
    (base / "retrieval_store").mkdir()  # a component folder: --out copies it along
    (base / "retrieval_store" / "store.json").write_text("{}")
    return demos, base


def test_queries_cover_every_start_and_later_position() -> None:
    starts, positions = parallel_queries(7)
    assert len(starts) == 21 and torch.all(starts < positions) and int(positions.max()) == 6
    assert sorted(zip(starts.tolist(), positions.tolist())) == [(j, i) for j in range(6) for i in range(j + 1, 7)]


def test_training_queries_are_what_inference_sees(setup) -> None:
    """The masked batched training call gives, for every start j, the logits draft_tokens_parallel
    proposes after j consumed greedy tokens: the objective trains exactly the inference path."""
    _, base = setup
    policy = load_checkpoint(base)
    policy.parallel_draft = ParallelDraftHead.from_sequential(policy.config, policy.draft).eval()
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, SIZE, SIZE, 3), dtype=torch.uint8, generator=g)
    text, proprio = torch.randint(0, 257, (2, 16), generator=g), torch.randn(2, 8, generator=g)
    rollout = greedy_rollout(policy, images, text, proprio)
    starts, positions = parallel_queries(7)
    with torch.no_grad():
        pred = policy.parallel_draft(policy.target.action_emb(rollout.tokens[:, starts]), rollout.features[:, starts],
                                     positions, rollout.memory, rollout.memory_mask(starts))
        logits = policy.target.lm_head(pred)
    prefix = policy.prefill_tensors(images, text, proprio).prefix
    for j in range(6):
        after_j = policy.score(prefix, rollout.tokens[:, :j]).prefix
        tokens, want = policy.draft_tokens_parallel(after_j, 7 - j, rollout.tokens[:, j - 1] if j else None)
        assert torch.equal(tokens[:, 0], rollout.tokens[:, j])
        torch.testing.assert_close(logits[:, starts == j], want[:, 1:], atol=1e-5, rtol=0)


def test_training_lowers_the_loss_and_leaves_the_rest_frozen(setup) -> None:
    data_dir, base = setup
    policy = load_checkpoint(base)
    data = load_demos(data_dir, policy.config.max_text_len, progress=False)
    head = ParallelDraftHead.from_sequential(policy.config, policy.draft)
    frozen = {k: v.clone() for k, v in policy.draft.state_dict().items()}
    cfg = ParallelDraftTrainConfig(checkpoint=str(base), data=str(data_dir), out="x", epochs=8, batch_size=24,
                                   lr=3e-3, warmup_steps=2, progress=False, threads=1)
    losses = train_head(policy, head, data, torch.arange(len(data)), cfg)
    assert len(losses) == 8 * 3 and np.mean(losses[-3:]) < np.mean(losses[:3])
    assert not head.training and all(torch.equal(policy.draft.state_dict()[k], v) for k, v in frozen.items())
    rollout = greedy_rollout(policy, data.images[:4], data.text[:4], data.proprio[:4])
    assert torch.isfinite(parallel_draft_loss(policy, head, rollout, 1.0))


def test_command_writes_a_copy_with_the_head(setup, tmp_path: Path) -> None:
    data_dir, base = setup
    before = sorted(p.name for p in base.iterdir())
    out = tmp_path / "out"
    argv = ["train-parallel-draft", "--checkpoint", str(base), "--data", str(data_dir), "--out", str(out),
            "--epochs", "1", "--batch-size", "16", "--lr", "2e-3", "--threads", "1", "--seed", "3", "--no-progress"]
    assert cli.main(argv) == 0
    assert sorted(p.name for p in base.iterdir()) == before  # the input checkpoint is read only
    names = {p.name for p in out.iterdir()}
    assert {"model.json", "model.safetensors", "retrieval_store", PARALLEL_DRAFT_WEIGHTS_FILE,
            PARALLEL_DRAFT_META_FILE, "parallel_draft_loss.png"} <= names
    assert (out / "parallel_draft_loss.png").read_bytes()[:4] == b"\x89PNG"
    policy = load_checkpoint(out)
    assert policy.parallel_draft is not None and load_checkpoint(base).parallel_draft is None
    meta = json.loads((out / PARALLEL_DRAFT_META_FILE).read_text())
    metrics = meta["metrics"]
    assert metrics["val_samples"] == 12 and metrics["val_episodes"] == 1
    for head in ("sequential", "parallel"):
        for r in AGREEMENT_RADII:
            key = f"{head}_agreement" if r == 0 else f"{head}_agreement_within{r}"
            per_pos = metrics[key + "_per_pos"]
            assert len(per_pos) == 7 and per_pos[0] == 1.0  # position 0 is the target's own token
            assert 0.0 <= metrics[key + "_pos1_6"] <= 1.0
            assert 1.0 <= metrics[f"{head}_accept_len_r{r}"] <= 7.0
        assert metrics[f"{head}_agreement_within9_pos1_6"] >= metrics[f"{head}_agreement_pos1_6"]
    assert metrics["train_loss_end"] > 0 and metrics["train_seconds"] >= 0  # a fast machine rounds to 0.0 s
    # the recorded command rebuilds the configuration
    words = shlex.split(meta["recipe"]["command"])
    assert words[:2] == ["vla-accel", "train-parallel-draft"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = vars(parser.parse_args(words[2:]))
    assert ParallelDraftTrainConfig(**args) == ParallelDraftTrainConfig(
        checkpoint=str(base), data=str(data_dir), out=str(out), batch_size=16, lr=2e-3, threads=1, seed=3,
        progress=False)


def test_destination_rules(setup) -> None:
    data_dir, base = setup
    with pytest.raises(ValueError, match="--out is required"):
        train_parallel_draft(ParallelDraftTrainConfig(checkpoint=str(base), data=str(data_dir), progress=False))
    with pytest.raises(ValueError, match="--in-place"):
        train_parallel_draft(ParallelDraftTrainConfig(checkpoint=str(base), data=str(data_dir), out=str(base)))
    with pytest.raises(ValueError, match="not both"):
        ParallelDraftTrainConfig(checkpoint=str(base), data=str(data_dir), out="x", in_place=True)
    for bad in (dict(batch_size=0), dict(lr=0.0), dict(epochs=-1), dict(val_fraction=1.0), dict(feature_weight=-1.0)):
        with pytest.raises(ValueError):
            ParallelDraftTrainConfig(checkpoint="c", data="d", out="o", **bad)


def test_in_place_adds_the_head_to_the_checkpoint(setup, tmp_path: Path, tiny_checkpoint) -> None:
    data_dir, _ = setup
    ckpt = tiny_checkpoint(tmp_path / "ckpt", image_size=SIZE, patch_size=8, max_text_len=16)
    cfg = ParallelDraftTrainConfig(checkpoint=str(ckpt), data=str(data_dir), in_place=True, epochs=0,
                                   progress=False, threads=1)
    assert "--in-place" in cfg.command()
    metrics = train_parallel_draft(cfg)  # epochs=0: the sequential head's weights, evaluated in parallel mode
    assert "train_loss_end" not in metrics and metrics["val_samples"] == 12
    policy = load_checkpoint(ckpt)
    for name, tensor in policy.draft.state_dict().items():
        assert torch.equal(policy.parallel_draft.state_dict()[name], tensor)
