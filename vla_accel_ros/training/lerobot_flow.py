"""``vla-accel train-flow`` for a LeRobot flow policy (SmolVLA, π0, π0.5): its 2-step sampler fitted to
its own 10-step sampler on the user's demonstrations (:mod:`vla_accel_ros.models.lerobot.student`).

Every batch of demo steps runs the policy's prefix once (frozen), the policy's own sampler in its
``num_steps`` from fresh noise (the teacher), and the student's 2 steps from the same noise; the
loss is the mean squared gap over the action's real width (the padding is cut before use). AdamW,
one-cycle schedule, gradient norm clipped at 1. The last episodes are held out: the student's and
plain 2-step Euler's mean |gap| to the teacher, and each one's to the demonstrated actions, in
normalised units, are written into ``flow_student.json``.

The demos' front camera feeds the policy's first camera and the wrist camera its second, in the
config's camera order; the state is the joints then the gripper opening.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.lerobot.checkpoint import load_lerobot
from vla_accel_ros.models.lerobot.policy import LeRobotPolicy, ModelInputs
from vla_accel_ros.models.lerobot.processor import resize_with_pad
from vla_accel_ros.models.lerobot.student import STUDENT_META, STUDENT_WEIGHTS, FlowStudent, load_student
from vla_accel_ros.training.configs import FlowTrainConfig
from vla_accel_ros.training.data import DemoDataset, action_windows, load_demos
from vla_accel_ros.training.hf_draft import episode_instructions


class DemoInputs:
    """Demo steps as the policy's batched model inputs, and its normalised action chunks."""

    def __init__(self, policy: LeRobotPolicy, data: DemoDataset, instructions: list[str]) -> None:
        config = policy.config
        cameras = [data.images] + ([data.wrist_images] if data.wrist_images is not None else [])
        if len(config.camera_names) > len(cameras):
            raise ValueError(f"{config.path}: the policy takes {len(config.camera_names)} cameras "
                             f"({', '.join(config.camera_names)}); the demos hold {len(cameras)} "
                             "(record the wrist camera with vla-accel demos --wrist)")
        self.policy, self.cameras = policy, cameras[: len(config.camera_names)]
        if data.proprio.shape[1] != config.state_dim or data.actions.shape[1] != config.action_dim:
            raise ValueError(f"{config.path}: the policy takes a state of {config.state_dim} and gives actions of "
                             f"{config.action_dim}; the demos hold {data.proprio.shape[1]} and {data.actions.shape[1]}")
        settings = {**policy.token_settings, "padding": "max_length"}  # one length for a batch; pads are masked
        state = policy.statistics.state.normalise(data.proprio.to(torch.float32))
        if config.type == "pi05":  # the prompt carries the state: one per demo step
            steps = [instructions[e] for e in data.episode.tolist()]
            self.lang_ids, self.lang_masks = policy.prompt_tokens(steps, state, settings)
        else:  # one per episode
            ids, masks = policy.prompt_tokens(instructions, None, settings)
            self.lang_ids, self.lang_masks = ids[data.episode], masks[data.episode]
        self.state = F.pad(state, (0, config.max_state_dim - config.state_dim))
        actions = policy.statistics.action.normalise(data.actions.to(torch.float32))
        self.actions = action_windows(actions, data.episode, config.chunk_size).reshape(len(actions),
                                                                                         config.chunk_size, -1)

    def inputs(self, idx: torch.Tensor) -> ModelInputs:
        height, width = self.policy.config.image_hw
        centred = self.policy.config.paligemma
        pixels = [resize_with_pad(images[idx].permute(0, 3, 1, 2).to(torch.float32) / 255.0, height, width,
                                  centred=centred) * 2.0 - 1.0 for images in self.cameras]
        return ModelInputs(pixels, self.state[idx], self.lang_ids[idx], self.lang_masks[idx])


def student_gap(policy: LeRobotPolicy, student: FlowStudent, demos: DemoInputs, idx: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(student sample, teacher sample, plain 2-step Euler sample) of the same noise, real width."""
    width = policy.config.action_dim
    inputs = demos.inputs(idx)
    with torch.no_grad():
        prefix = policy.prefix(inputs)
        noise = torch.randn(len(idx), *policy.noise_shape(), generator=generator)
        teacher = policy.integrate(prefix, inputs, noise, policy.config.num_steps)
        euler2 = policy.integrate(prefix, inputs, noise, 2)
    sample = student.sample(lambda x, t, model: policy.velocity(prefix, inputs, x, t, model), noise)
    return sample[..., :width], teacher[..., :width], euler2[..., :width]


def distil_lerobot(cfg: FlowTrainConfig) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = load_lerobot(cfg.checkpoint)
    # before the demos load: a student that cannot be continued is refused at once
    student = continued_student(cfg, policy) if cfg.student_from else FlowStudent.fresh(cfg.method, policy.model)
    data = load_demos(cfg.data, 64, cfg.max_episodes, progress=cfg.progress)
    demos = DemoInputs(policy, data, episode_instructions(cfg.data, data))
    train_idx, val_idx = data.split(cfg.val_fraction)
    params = student.parameters()
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=1e-4)
    total = cfg.distill_epochs * math.ceil(len(train_idx) / cfg.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=total, pct_start=0.05)
    generator = torch.Generator().manual_seed(cfg.seed)
    losses = []
    with progress_bar(total=total, desc=f"flow student ({cfg.method})", disable=not cfg.progress) as bar:
        for _ in range(cfg.distill_epochs):
            for idx in train_idx[torch.randperm(len(train_idx), generator=generator)].split(cfg.batch_size):
                sample, teacher, _ = student_gap(policy, student, demos, idx, generator)
                loss = F.mse_loss(sample, teacher)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                schedule.step()
                losses.append(float(loss.detach()))
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.5f}")
    for p in params:
        p.requires_grad_(False)
    metrics = held_out(policy, student, demos, val_idx, cfg)
    metrics["train_seconds"] = round(time.perf_counter() - start, 1)
    out = Path(cfg.out or cfg.checkpoint)
    if cfg.out and out.resolve() != Path(cfg.checkpoint).resolve():
        shutil.copytree(cfg.checkpoint, out, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(STUDENT_WEIGHTS, STUDENT_META))
    recipe = {k: v for k, v in asdict(cfg).items() if k in ("method", "distill_epochs", "batch_size", "lr", "seed",
                                                             "val_fraction", "max_episodes", "student_from")}
    recipe["data"] = str(Path(cfg.data).resolve())
    student.save(out, {"recipe": recipe, "metrics": metrics, "final_train_loss": float(np.mean(losses[-20:]))})
    print("held-out 2-step sampler metrics (normalised action units):")
    for key, value in metrics.items():
        print(f"  {key}: {value}")
    print(f"flow student written to {out / STUDENT_WEIGHTS}")
    return metrics


def continued_student(cfg: FlowTrainConfig, policy: LeRobotPolicy) -> FlowStudent:
    """The student kept in ``cfg.student_from``, to be trained on; ValueError when there is none there,
    or it fits another method."""
    assert cfg.student_from is not None
    where = f"--student-from {cfg.student_from}"
    student = load_student(Path(cfg.student_from), policy.model)
    if student is None:
        raise ValueError(f"{where}: no {STUDENT_META} there (vla-accel train-flow writes one)")
    if student.method != cfg.method:
        raise ValueError(f"{where}: its student is {student.method}, not --method {cfg.method}")
    return student


def held_out(policy: LeRobotPolicy, student: FlowStudent, demos: DemoInputs, val_idx: torch.Tensor,
             cfg: FlowTrainConfig) -> dict[str, float]:
    """Mean |gap| of the student and of plain 2-step Euler to the teacher and to the demonstrated actions."""
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    sums = {"student_vs_teacher": 0.0, "euler2_vs_teacher": 0.0, "teacher_vs_demo": 0.0, "student_vs_demo": 0.0,
            "euler2_vs_demo": 0.0}
    with torch.no_grad():
        for idx in val_idx.split(cfg.batch_size):
            sample, teacher, euler2 = student_gap(policy, student, demos, idx, generator)
            demo = demos.actions[idx]
            for key, (a, b) in {"student_vs_teacher": (sample, teacher), "euler2_vs_teacher": (euler2, teacher),
                                "teacher_vs_demo": (teacher, demo), "student_vs_demo": (sample, demo),
                                "euler2_vs_demo": (euler2, demo)}.items():
                sums[key] += float((a - b).abs().mean()) * len(idx)
    n = max(1, len(val_idx))
    return {"val_steps": int(len(val_idx)), **{k: round(v / n, 5) for k, v in sums.items()}}
