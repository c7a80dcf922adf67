"""``vla-accel train-draft`` on the tiny random Hugging Face VLA and a few tiny demo episodes: what it
writes beside the model, that loading attaches the head and the decoders use it, and that training
on the target's own tokens lifts the head's agreement with them above what ignoring its inputs gives."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.protocol import DecodeContext
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.models.token_vla.draft import DRAFT_META_FILE, DRAFT_WEIGHTS_FILE
from vla_accel_ros.runtime.runner import run_policy_step
from vla_accel_ros.training.data import load_demos
from vla_accel_ros.training.hf_draft import (
    LOSS_PLOT,
    HFDraftTrainConfig,
    acceptance,
    episode_instructions,
    observation_at,
    train_hf_draft,
)

torch.set_num_threads(1)
EPISODES, STEPS = 4, 8


@pytest.fixture(scope="module")
def model_dir(tiny_hf_vla: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_vla(tmp_path_factory.mktemp("train_draft") / "model")


@pytest.fixture(scope="module")
def demos(random_demos: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EPISODES episodes of STEPS random 32-px frames and actions within the model's statistics."""
    return random_demos(tmp_path_factory.mktemp("train_draft") / "demos", EPISODES, STEPS, seed=0)


def copy_of(directory: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(directory, target)
    return target


def test_train_draft_writes_the_head_beside_the_model_and_loading_attaches_it(
        model_dir: Path, demos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = copy_of(model_dir, tmp_path)
    assert main(["train-draft", "--checkpoint", f"hf:{directory}", "--data", str(demos), "--epochs", "3",
                 "--val-fraction", "0.25", "--threads", "1", "--no-progress"]) == 0
    assert "draft head written" in capsys.readouterr().out
    for name in (DRAFT_WEIGHTS_FILE, DRAFT_META_FILE, LOSS_PLOT):
        assert (directory / name).stat().st_size > 0
    assert (directory / LOSS_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meta = json.loads((directory / DRAFT_META_FILE).read_text())
    assert meta["format"] == "vla_accel_ros.hf_draft_head" and meta["format_version"] == 1
    assert meta["config"]["hidden_size"] == 32 and meta["config"]["vocab_size"] == 384
    recipe, metrics = meta["recipe"], meta["metrics"]
    assert (recipe["epochs"] == 3 and recipe["teacher"] == "expert"
            and recipe["command"].startswith("vla-accel train-draft"))
    assert recipe["checkpoint"] == str(directory.resolve()) and recipe["n_episodes"] == EPISODES
    assert (metrics["train_steps"], metrics["val_steps"]) == ((EPISODES - 1) * STEPS, STEPS)
    for key in ("val_draft_acc_pos1_6", "val_majority_acc_pos1_6", "val_target_expert_acc", "val_loss"):
        assert 0.0 <= metrics[key] < np.inf
    assert len(metrics["val_draft_acc_per_pos1_6"]) == 6 and metrics["chance_acc"] == 1 / 256
    assert 1.0 <= metrics["val_accept_len_r0"] <= metrics["val_accept_len_r9"] <= 7.0  # the first token is the target's
    assert metrics["val_draft_agreement_per_pos"][0] == 1.0

    policy = load_hf_vla(f"hf:{directory}")
    assert policy.capabilities().draft_head and "draft" in policy.n_parameters()
    data = load_demos(demos, 1, progress=False)
    obs = observation_at(data, episode_instructions(demos, data), 3)
    ar = run_policy_step(policy, obs, make_decoder("ar"), DecodeContext())
    sd = run_policy_step(policy, obs, make_decoder("sd", r=0), DecodeContext())
    np.testing.assert_array_equal(sd.tokens, ar.tokens)
    assert sd.draft_passes > 0


def test_training_on_the_targets_tokens_beats_ignoring_the_inputs(model_dir: Path, demos: Path,
                                                                 tmp_path: Path) -> None:
    directory = copy_of(model_dir, tmp_path)

    def config(epochs: int) -> HFDraftTrainConfig:
        return HFDraftTrainConfig(checkpoint=str(directory), data=str(demos), teacher="target", epochs=epochs,
                                  val_fraction=0.0, threads=1, progress=False)

    untrained = train_hf_draft(config(0))
    data = load_demos(demos, 1, progress=False)
    steps = torch.arange(len(data))
    instructions = episode_instructions(demos, data)
    before = acceptance(load_hf_vla(directory), data, instructions, steps, progress=False)
    trained = train_hf_draft(config(150))
    after = acceptance(load_hf_vla(directory), data, instructions, steps, progress=False)
    # one step from the target's own hidden state: the target's next token far more often than the
    # most common token per dimension (a head ignoring its inputs), and than chance or no training
    assert trained["train_draft_acc_pos1_6"] > trained["train_majority_acc_pos1_6"] + 0.2
    assert trained["train_draft_acc_pos1_6"] > untrained["train_draft_acc_pos1_6"] + 0.2
    assert trained["train_majority_acc_pos1_6"] == untrained["train_majority_acc_pos1_6"]
    assert untrained["train_draft_acc_pos1_6"] < 0.2 and trained["chance_acc"] < 0.01
    # and drafting as sd does, from the prompt's end on its own predictions, is accepted further
    assert after["accept_len_r0"] > before["accept_len_r0"] + 0.5
    assert "val_draft_acc_pos1_6" not in trained  # nothing held out


@pytest.mark.parametrize(("changes", "match"), [({"teacher": "demo"}, "teacher"), ({"width": 0}, "width"),
                                                 ({"lr": 0.0}, "learning rates"),
                                                 ({"val_fraction": 1.0}, "val_fraction"),
                                                 ({"dtype": "int8"}, "dtype"), ({"blocks": 0}, "blocks")])
def test_bad_settings_are_refused_before_any_work(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HFDraftTrainConfig(checkpoint="hf:/nowhere", data="/nowhere", **changes)  # type: ignore[arg-type]


def test_a_model_directory_that_is_not_a_vla_is_refused(demos: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        train_hf_draft(HFDraftTrainConfig(checkpoint=f"hf:{tmp_path / 'missing'}", data=str(demos), progress=False))
