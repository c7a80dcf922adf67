"""``vla-accel train-hf`` on three tiny demo episodes: one epoch writes a directory that
``load_hf_vla`` runs (a decoded action in our action space), with OpenVLA's statistics layout, the
robot record, the loss plot and the recorded command; every prompt word is one token."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.robot_record import read_robot_record
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.models.token_vla.spec import OPENVLA_PROMPT
from vla_accel_ros.sim.env import INSTRUCTION_TEMPLATE
from vla_accel_ros.sim.scene import CUBE_COLORS
from vla_accel_ros.training.data import load_demos
from vla_accel_ros.training.hf_draft import episode_instructions, greedy_rollout
from vla_accel_ros.training.hf_vla import (
    DATASET_KEY,
    LOSS_PLOT,
    PROMPT_LAYOUTS,
    STATISTICS_FILE,
    TRAINING_FILE,
    UNUSED_TEXT_LEN,
    HFTrainConfig,
    HFTrainer,
    prompt_words,
)

torch.set_num_threads(1)
SIZE, STEPS = 32, 6
TINY = ["--vision-hidden", "32", "--vision-layers", "1", "--vision-heads", "2", "--hidden-size", "32",
        "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "64"]


def episodes(rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Three episodes of random 32-px frames and in-range actions (gripper open, then closed)."""
    for _ in range(3):
        images = rng.integers(0, 256, (STEPS, SIZE, SIZE, 3), dtype=np.uint8)
        actions = np.concatenate([rng.uniform(-0.02, 0.02, (STEPS, 3)), np.zeros((STEPS, 3)),
                                  (np.arange(STEPS) < STEPS // 2)[:, None]], axis=1).astype(np.float32)
        yield images, actions


@pytest.fixture(scope="module")
def trained(demo_set: Callable[..., tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    demos, _ = demo_set("train_hf", episodes)
    out = tmp_path_factory.mktemp("train_hf") / "model"
    assert main(["train-hf", "--data", str(demos), "--out", str(out), "--epochs", "1", "--batch-size", "4",
                 "--val-fraction", "0.34", "--threads", "1", "--no-progress", *TINY]) == 0
    return out


def test_output_loads_and_decodes_an_action(trained: Path) -> None:
    policy = load_hf_vla(f"hf:{trained}")
    assert policy.config.image_size == SIZE and policy.config.n_image_tokens == (SIZE // 16) ** 2
    assert policy.action_ids[0] == policy.config.vocab_size - 1  # bin b = id vocab_size - 1 - b
    obs = Observation(image=np.zeros((SIZE, SIZE, 3), np.uint8), joint_pos=np.zeros(7), gripper=0.04,
                      instruction="pick up the red cube")
    _, tokens = greedy_rollout(policy, obs)
    action = policy.tokens_to_action(tokens)
    assert action.shape == (7,) and np.all(np.isfinite(action)) and 0.0 <= action[6] <= 1.0
    assert np.all(np.abs(action[:3]) <= 0.02 + 1e-6)  # within the training actions' q01..q99


def test_statistics_have_openvla_layout(trained: Path) -> None:
    statistics = json.loads((trained / STATISTICS_FILE).read_text())
    assert list(statistics) == [DATASET_KEY]
    entry = statistics[DATASET_KEY]
    assert {"q01", "q99", "mask", "mean", "std", "min", "max"} <= set(entry["action"])
    assert entry["action"]["mask"] == [True] * 6 + [False]
    assert all(len(entry["action"][k]) == 7 for k in ("q01", "q99", "mean", "std"))
    assert entry["num_trajectories"] == 2 and entry["num_transitions"] == 2 * STEPS  # the held-out episode excluded


def test_side_files(trained: Path) -> None:
    robot = read_robot_record(trained)
    assert robot is not None and robot.dof == 7 and robot.image_size == SIZE
    assert (trained / LOSS_PLOT).stat().st_size > 0
    record = json.loads((trained / TRAINING_FILE).read_text())
    assert record["command"].startswith("vla-accel train-hf --data ")
    assert 0.0 <= record["metrics"]["val_token_acc"] <= 1.0
    assert not list(trained.glob("*.bin"))  # safetensors only


def test_every_prompt_word_is_one_token(trained: Path) -> None:
    policy = load_hf_vla(f"hf:{trained}")
    for color in CUBE_COLORS:
        prompt = OPENVLA_PROMPT.format(instruction=INSTRUCTION_TEMPLATE.format(color=color))
        ids = policy.text_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(prompt.split()) + 1  # the words and the newline
    assert "green" in prompt_words()


def test_instruction_first_layout_is_written_and_kept_by_a_fine_tune(
        demo_set: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    demos, _ = demo_set("train_hf", episodes)
    out, tuned = tmp_path / "text_first", tmp_path / "tuned"
    common = ["--epochs", "1", "--batch-size", "4", "--threads", "1", "--no-progress", *TINY]
    assert main(["train-hf", "--data", str(demos), "--out", str(out), "--prompt-layout", "instruction_first",
                 *common]) == 0
    spec = json.loads((out / "vla_spec.json").read_text())
    assert spec["prompt"] == PROMPT_LAYOUTS["instruction_first"] and "robot" in spec
    policy = load_hf_vla(f"hf:{out}")
    ids = policy.prompt_ids(INSTRUCTION_TEMPLATE.format(color="red"))[0]
    first_image = int((ids == policy.image_token_id).nonzero()[0])
    assert first_image > 5  # BOS and the instruction come before the image
    assert main(["train-hf", "--data", str(demos), "--out", str(tuned), "--init", f"hf:{out}", *common]) == 0
    assert json.loads((tuned / "vla_spec.json").read_text())["prompt"] == spec["prompt"]


def test_proprio_layout_reads_the_arm_state_and_keypoints_add_a_loss(
        demo_set: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    demos, _ = demo_set("train_hf", episodes)
    out = tmp_path / "proprio"
    assert main(["train-hf", "--data", str(demos), "--out", str(out), "--prompt-layout", "instruction_first+proprio",
                 "--keypoint-weight", "1.0", "--epochs", "1", "--batch-size", "4", "--threads", "1", "--no-progress",
                 *TINY]) == 0
    assert json.loads((out / "vla_spec.json").read_text())["prompt"] == PROMPT_LAYOUTS["instruction_first+proprio"]
    policy = load_hf_vla(f"hf:{out}")
    instruction = INSTRUCTION_TEMPLATE.format(color="red")
    still, moved = (policy.prompt_ids(instruction, np.append(np.full(7, q), 0.04))[0] for q in (0.0, 0.5))
    assert len(still) == len(policy.prompt_ids(instruction, np.zeros(8))[0])
    assert (still != moved).sum() == 7  # one token per joint; the gripper's stays
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    action = policy.tokens_to_action(greedy_rollout(policy, Observation(
        image=image, instruction=instruction, joint_pos=np.zeros(7), gripper=0.04))[1])
    assert action.shape == (7,) and np.all(np.isfinite(action))

    data = load_demos(demos, UNUSED_TEXT_LEN, None, True, False)
    seen = replace(data, keypoint_targets=torch.full_like(data.keypoint_targets, 0.5))  # the sim's labels
    instructions = episode_instructions(demos, data)
    trainers = [HFTrainer(HFTrainConfig(data=str(demos), out=str(out), keypoint_weight=w, progress=False), policy, seen,
                          instructions) for w in (0.0, 1.0)]
    idx = torch.arange(4)
    without, _, _ = trainers[0].loss(idx, augment=False)
    trainers[1].keypoint_head.load_state_dict(trainers[0].keypoint_head.state_dict())
    with_keypoints, _, _ = trainers[1].loss(idx, augment=False)
    assert with_keypoints > without
    with_keypoints.backward()
    assert trainers[1].keypoint_head.weight.grad is not None and trainers[1].keypoint_head.weight.grad.abs().sum() > 0
    states = torch.randn(2, policy.config.n_image_tokens, policy.config.d_model)
    where = trainers[1].keypoint_positions(states)
    assert where.shape == (2, 2, 2) and bool((where.abs() <= 1.0).all())


def test_bfloat16_autocast_trains_in_bfloat16_and_keeps_float32_weights(
        demo_set: Callable[..., tuple[Path, Path]], trained: Path) -> None:
    with pytest.raises(ValueError, match="autocast"):
        HFTrainConfig(data="d", out="o", autocast="float16")
    demos, _ = demo_set("train_hf", episodes)
    policy = load_hf_vla(f"hf:{trained}", draft=False)
    data = load_demos(demos, UNUSED_TEXT_LEN, None, True, False)
    instructions = episode_instructions(demos, data)
    seen: list[torch.dtype] = []
    hook = policy.model.model.language_model.layers[0].mlp.down_proj.register_forward_hook(
        lambda module, inputs, output: seen.append(output.dtype))
    losses = []
    for autocast in ("float32", "bfloat16"):
        trainer = HFTrainer(HFTrainConfig(data=str(demos), out=str(trained), autocast=autocast, progress=False),
                            policy, data, instructions)
        with trainer.autocast():
            loss, _, _ = trainer.loss(torch.arange(4), augment=False)
        loss.backward()
        losses.append(loss.item())
    hook.remove()
    assert seen == [torch.float32, torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    assert np.isfinite(losses).all() and abs(losses[1] - losses[0]) < 0.1 * abs(losses[0])
