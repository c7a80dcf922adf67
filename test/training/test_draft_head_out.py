"""``vla-accel train-draft --out``: the head of a model whose directory is read-only goes into a
directory of its own, with a ``vla_spec.json`` that points at the model; the loader attaches it when
``draft_head`` names that directory (``predict --draft-head``, the node's ``draft_head`` parameter,
``RunnerConfig.draft_head``), and refuses a ``draft_head`` that holds none."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models.load import load_policy
from vla_accel_ros.models.token_vla.draft import DRAFT_META_FILE, DRAFT_WEIGHTS_FILE
from vla_accel_ros.models.token_vla.spec import SPEC_FILE
from vla_accel_ros.ros.parameters import PolicySettings
from vla_accel_ros.runtime.builder import build_runner
from vla_accel_ros.training.hf_draft import LOSS_PLOT

torch.set_num_threads(1)
HF_SMALL = Path(__file__).resolve().parents[2] / "checkpoints" / "hf_small"
EPISODES, STEPS = 3, 6


def _contents(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def read_only_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """checkpoints/hf_small without its own head, every file and the directory read-only."""
    target = tmp_path_factory.mktemp("read_only") / "hf_small"
    shutil.copytree(HF_SMALL, target, ignore=shutil.ignore_patterns("draft_head.*", "draft_loss.png"))
    for path in [*target.iterdir(), target]:
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXUSR if path.is_dir() else 0))
    return target


@pytest.fixture(scope="module")
def demos(random_demos: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_demos(tmp_path_factory.mktemp("draft_out") / "demos", EPISODES, STEPS, seed=1)


@pytest.fixture(scope="module")
def head_dir(read_only_model: Path, demos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    before = _contents(read_only_model)
    out = tmp_path_factory.mktemp("draft_out") / "head"
    assert main(["train-draft", "--checkpoint", str(read_only_model), "--data", str(demos), "--out", str(out),
                 "--epochs", "1", "--val-fraction", "0", "--threads", "1", "--no-progress"]) == 0
    assert _contents(read_only_model) == before  # nothing written into, or changed in, the model's directory
    return out


def test_the_head_and_a_spec_pointing_at_the_model_are_written_outside(head_dir: Path,
                                                                       read_only_model: Path) -> None:
    for name in (DRAFT_WEIGHTS_FILE, DRAFT_META_FILE, LOSS_PLOT):
        assert (head_dir / name).stat().st_size > 0, name
    pointer = json.loads((head_dir / SPEC_FILE).read_text())
    assert pointer == {"checkpoint": str(read_only_model.resolve()), "draft_head": str(head_dir.resolve())}
    assert json.loads((head_dir / DRAFT_META_FILE).read_text())["recipe"]["checkpoint"] == str(
        read_only_model.resolve())


def test_the_loader_attaches_the_head_draft_head_names(head_dir: Path, read_only_model: Path) -> None:
    assert not load_policy(read_only_model).capabilities().draft_head
    policy = load_policy(read_only_model, draft_head=head_dir)
    assert policy.capabilities().draft_head and "draft" in policy.n_parameters()


def _predict(model: Path, image: Path, *extra: str) -> list[str]:
    return ["predict", "--checkpoint", str(model), "--image", str(image), "--instruction", "pick up the red cube",
            "--json", "--decoder", "sd", *extra]


def test_predict_with_draft_head_drafts_with_it(head_dir: Path, read_only_model: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    image = tmp_path / "frame.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(image)
    assert main(_predict(read_only_model, image)) == 2  # sd needs a head: the model has none beside it
    assert "draft head" in capsys.readouterr().err
    assert main(_predict(read_only_model, image, "--draft-head", str(head_dir))) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["decoder"] == "sd" and len(result["action_token_ids"]) == 7


def test_the_node_parameter_reaches_the_runner(head_dir: Path, read_only_model: Path) -> None:
    settings = PolicySettings(checkpoint=str(read_only_model), decoder="sd", draft_head=str(head_dir))
    config = settings.runner_config()
    assert config.draft_head == str(head_dir)
    runner = build_runner(config, ArmKinematics(default_urdf()))
    assert runner.policy.capabilities().draft_head


def test_a_draft_head_directory_without_a_head_is_refused_in_one_line(read_only_model: Path,
                                                                      tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        load_policy(read_only_model, draft_head=tmp_path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{tmp_path}: no draft head") and "draft_head" in message


def test_draft_head_does_not_apply_to_a_family_without_one(tiny_checkpoint: Callable[..., Path],
                                                           tmp_path: Path) -> None:
    own = tiny_checkpoint(tmp_path / "own")
    with pytest.raises(ValueError, match="draft_head does not apply to a checkpoint of the own family"):
        load_policy(own, draft_head=tmp_path)
