"""Checkpoint round trip and every kind of bad checkpoint (each must name the file at fault)."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vla_accel_ros.core.robot_record import (
    ROBOT_KEY,
    package_robot,
    read_robot_record,
    robot_in_use,
)
from vla_accel_ros.models import (
    CheckpointError,
    ParallelDraftHead,
    Policy,
    VLAConfig,
    load_checkpoint,
    save_checkpoint,
)
from vla_accel_ros.models.own.checkpoint import (
    PARALLEL_DRAFT_META_FILE,
    PARALLEL_DRAFT_WEIGHTS_FILE,
    save_parallel_draft,
)
from vla_accel_ros.models.tokenizer import ActionTokenizer

torch.set_num_threads(1)
TINY = dict(image_size=32, patch_size=8, d_model=32, n_heads=2, n_layers=2, vision_layers=1, max_text_len=8,
            local_channels=8, contact_hidden=8)
RECIPE = {"seed": 3, "data": "demos/", "epochs": 1, "lr": 1e-3, "command": "vla-accel train --data demos/ --out x"}


def make_policy() -> Policy:
    policy = Policy.create(VLAConfig(**TINY), ActionTokenizer(np.linspace(-1, 0, 7), np.linspace(0.5, 2, 7)),
                           proprio_mean=np.arange(8.0), proprio_std=np.full(8, 0.5), seed=1)
    with torch.no_grad():  # make every part (draft, contact head included) non-trivial
        for module in (policy.target, policy.draft, policy.contact_head):
            for p in module.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    return policy


def outputs(policy: Policy) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8, generator=g)
    text = torch.randint(0, 257, (2, 8), generator=g)
    proprio = torch.randn(2, 8, generator=g)
    prefix = policy.prefill_tensors(images, text, proprio).prefix
    tokens = policy.greedy_decode(prefix)
    return [policy.score(prefix, tokens).logits, *policy.draft_tokens(prefix, 7, None), policy.contact_logits(prefix)]


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Policy, Path]:
    policy = make_policy()
    return policy, save_checkpoint(policy, tmp_path / "ckpt", RECIPE, metrics={"target_token_acc": 0.5})


def test_round_trip_gives_identical_outputs(saved) -> None:
    policy, path = saved
    assert sorted(p.name for p in path.iterdir()) == ["model.json", "model.safetensors"]
    loaded = load_checkpoint(path)
    for a, b in zip(outputs(policy), outputs(loaded)):
        assert torch.equal(a, b)
    assert loaded.config == policy.config
    np.testing.assert_array_equal(loaded.tokenizer.q01, policy.tokenizer.q01)
    np.testing.assert_array_equal(loaded.tokenizer.q99, policy.tokenizer.q99)
    np.testing.assert_array_equal(loaded.proprio_std, policy.proprio_std)
    np.testing.assert_array_equal(loaded.proprio_mean, policy.proprio_mean)
    assert loaded.info["recipe"] == RECIPE and loaded.info["metrics"]["target_token_acc"] == 0.5
    meta = json.loads((path / "model.json").read_text())
    assert {"format_version", "config", "tokenizer", "proprio_stats", "recipe"} <= set(meta)


def test_float16_weights_load_close(tmp_path: Path) -> None:
    policy = make_policy()
    path = save_checkpoint(policy, tmp_path / "half", RECIPE, dtype="float16")
    assert all(t.dtype == torch.float16 for t in load_file(str(path / "model.safetensors")).values())
    loaded = load_checkpoint(path)
    torch.testing.assert_close(outputs(loaded)[0], outputs(policy)[0], atol=0.05, rtol=0.05)


def expect_error(path: Path, file_name: str, *fragments: str) -> None:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert file_name in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_missing_directory(tmp_path: Path) -> None:
    expect_error(tmp_path / "nowhere", "nowhere", "does not exist")


@pytest.mark.parametrize("name", ["model.json", "model.safetensors"])
def test_missing_file(saved, name: str) -> None:
    _, path = saved
    (path / name).unlink()
    expect_error(path, name, "not found")


def test_truncated_safetensors(saved) -> None:
    _, path = saved
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    expect_error(path, "model.safetensors", "truncated", "bytes of tensor data where its safetensors header describes")


def test_garbage_safetensors(saved) -> None:
    _, path = saved
    (path / "model.safetensors").write_bytes(b"\x00\x01not a safetensors file" * 3)
    expect_error(path, "model.safetensors", "not safetensors")


def test_bad_json(saved) -> None:
    _, path = saved
    (path / "model.json").write_text('{"format_version": 1, "config": ')
    expect_error(path, "model.json", "cannot read it as JSON")


def rewrite_json(path: Path, change: Callable[[dict], object]) -> None:
    """Apply ``change`` to the parsed model.json of checkpoint ``path`` and write it back."""
    meta = json.loads((path / "model.json").read_text())
    change(meta)
    (path / "model.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("key", ["config", "tokenizer", "proprio_stats", "format_version"])
def test_missing_json_key(saved, key: str) -> None:
    _, path = saved
    rewrite_json(path, lambda meta: meta.pop(key))
    expect_error(path, "model.json", f"missing key '{key}'")


@pytest.mark.parametrize("change, fragment", [
    (lambda meta: meta.update(format_version=99), "unknown format_version 99"),
    (lambda meta: meta["config"].update(n_heads=5), "bad config"),
], ids=["unknown_format_version", "bad_config_values"])
def test_bad_json_values(saved, change, fragment: str) -> None:
    _, path = saved
    rewrite_json(path, change)
    expect_error(path, "model.json", fragment)


def _set_nan(tensors: dict) -> None:
    tensors["contact_head.net.0.bias"][0] = float("nan")


@pytest.mark.parametrize("change, fragments", [
    (lambda tensors: tensors.pop("draft.fc.weight"), ("missing tensors", "draft.fc.weight")),
    (lambda tensors: tensors.update({"target.lm_head.weight": torch.zeros(256, 16)}),
     ("target.lm_head.weight", "(256, 16)", "(256, 32)")),
    (_set_nan, ("contact_head.net.0.bias",)),
], ids=["missing_tensor", "shape_mismatch", "non_finite_weights"])
def test_bad_tensors(saved, change, fragments: tuple[str, ...]) -> None:
    _, path = saved
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))
    expect_error(path, "model.safetensors", *fragments)


def test_config_that_does_not_match_the_weights(saved, tmp_path: Path) -> None:
    _, path = saved
    other = tmp_path / "other"
    shutil.copytree(path, other)
    rewrite_json(other, lambda meta: meta["config"].update(d_model=64))
    expect_error(other, "model.safetensors", "shape")


# --- the optional parallel draft head (parallel_draft.*) ----------------------------------------
def with_parallel_draft(policy: Policy) -> Policy:
    policy.parallel_draft = ParallelDraftHead.from_sequential(policy.config, policy.draft).eval()
    with torch.no_grad():
        for p in policy.parallel_draft.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() + 1)) * 0.1)
    return policy


def parallel_outputs(policy: Policy) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prefix = policy.prefill_tensors(torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8, generator=g),
                                  torch.randint(0, 257, (2, 8), generator=g), torch.randn(2, 8, generator=g)).prefix
    return policy.draft_tokens_parallel(prefix, 7)


def test_parallel_draft_round_trip(saved) -> None:
    policy, path = saved
    assert load_checkpoint(path).parallel_draft is None  # a checkpoint without one loads as before
    with_parallel_draft(policy)
    save_parallel_draft(policy.parallel_draft, path, recipe={"epochs": 1}, metrics={"parallel_agreement_pos1_6": 0.5})
    for name in (PARALLEL_DRAFT_WEIGHTS_FILE, PARALLEL_DRAFT_META_FILE):
        assert (path / name).stat().st_mode & 0o777 == 0o644
    meta = json.loads((path / PARALLEL_DRAFT_META_FILE).read_text())
    assert meta["format_version"] == 1 and meta["recipe"] == {"epochs": 1}
    assert meta["config"] == {"d_model": 32, "n_heads": 2, "draft_mlp_ratio": 2, "n_action_tokens": 7}
    loaded = load_checkpoint(path)
    for a, b in zip(parallel_outputs(policy), parallel_outputs(loaded)):
        assert torch.equal(a, b)
    for a, b in zip(outputs(policy), outputs(loaded)):  # the rest is untouched
        assert torch.equal(a, b)
    assert loaded.n_parameters()["parallel_draft"] == policy.n_parameters()["draft"]


def test_bad_parallel_draft_files_name_the_file(saved) -> None:
    policy, path = saved
    save_parallel_draft(with_parallel_draft(policy).parallel_draft, path, recipe={}, metrics={})
    weights, meta_path = path / PARALLEL_DRAFT_WEIGHTS_FILE, path / PARALLEL_DRAFT_META_FILE
    good_weights, good_meta = load_file(str(weights)), meta_path.read_text()

    tensors = dict(good_weights, **{"fc.weight": torch.zeros(32, 32)})
    save_file(tensors, str(weights))
    expect_error(path, PARALLEL_DRAFT_WEIGHTS_FILE, "fc.weight", "(32, 32)", "(32, 64)")
    save_file({k: v for k, v in good_weights.items() if k != "index_emb.weight"}, str(weights))
    expect_error(path, PARALLEL_DRAFT_WEIGHTS_FILE, "missing tensors", "index_emb.weight")
    weights.write_bytes(b"garbage")
    expect_error(path, PARALLEL_DRAFT_WEIGHTS_FILE, "truncated", "no safetensors header")
    weights.unlink()
    expect_error(path, PARALLEL_DRAFT_WEIGHTS_FILE, "file not found")

    save_file(good_weights, str(weights))
    meta = json.loads(good_meta)
    meta_path.write_text(json.dumps({**meta, "config": {**meta["config"], "n_heads": 4}}))
    expect_error(path, PARALLEL_DRAFT_META_FILE, "does not match the target", "n_heads 4")
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "config"}))
    expect_error(path, PARALLEL_DRAFT_META_FILE, "missing key 'config'")
    meta_path.write_text("{")
    expect_error(path, PARALLEL_DRAFT_META_FILE, "cannot read it as JSON")
    meta_path.unlink()
    expect_error(path, PARALLEL_DRAFT_META_FILE, "file not found")


def test_save_checkpoint_drops_a_parallel_draft(saved) -> None:
    """A re-saved target may differ from the one the parallel head was trained on: the head is
    neither written nor counted in model.json, and stale parallel_draft.* files go."""
    policy, path = saved
    save_parallel_draft(with_parallel_draft(policy).parallel_draft, path, recipe={}, metrics={})
    save_checkpoint(policy, path, RECIPE)
    assert not (path / PARALLEL_DRAFT_WEIGHTS_FILE).exists() and load_checkpoint(path).parallel_draft is None
    assert "parallel_draft" not in json.loads((path / "model.json").read_text())["n_parameters"]


# --- the robot a checkpoint was made for (model.json "robot") -----------------------------------
def test_robot_record_round_trip(saved, tmp_path: Path) -> None:
    policy, path = saved
    assert read_robot_record(path) == package_robot(TINY["image_size"])  # the default: the package arm
    assert json.loads((path / "model.json").read_text())[ROBOT_KEY] == package_robot(32).to_json()
    other = robot_in_use(("a1", "a2", "a3", "a4", "a5", "a6"), "tool0", action_dt_s=0.1, image_size=32)
    saved_other = save_checkpoint(policy, tmp_path / "other_arm", RECIPE, robot=other)
    assert read_robot_record(saved_other) == other
    load_checkpoint(saved_other)  # the record does not change how the weights load


def test_checkpoint_without_a_robot_record_loads_as_the_package_arm(saved) -> None:
    policy, path = saved
    rewrite_json(path, lambda meta: meta.pop(ROBOT_KEY))
    loaded = load_checkpoint(path)
    for a, b in zip(outputs(policy), outputs(loaded)):
        assert torch.equal(a, b)
    assert read_robot_record(path) == package_robot(TINY["image_size"])


def test_malformed_robot_record_names_the_file(saved) -> None:
    _, path = saved
    rewrite_json(path, lambda meta: meta[ROBOT_KEY].update(dof=6))
    expect_error(path, "model.json", "bad robot record", "dof 6")
