"""Training of the continuous action head: the teacher, then the distilled 2-step student (``vla-accel train-flow``).
A LeRobot flow policy (SmolVLA, π0, π0.5) is its own teacher: only its 2-step sampler is fitted
(:mod:`vla_accel_ros.training.lerobot_flow`).

Both heads read the frozen target's prefix features, so those are computed once for every demo
step; training the heads then costs seconds. Writes ``flow_head.safetensors`` and
``flow_head.json`` (config, recipe, held-out metrics) into the checkpoint directory (or ``--out``),
and ``flow_loss.png``.

Held-out metrics, in bins of the action tokenizer (1 bin = 2/255 in normalised units):
``teacher_abs_bins`` / ``student_abs_bins`` (mean |sample - expert action|) and the
teacher-versus-student agreement ``agreement_abs_bins`` and ``agreement_within2`` on the same noise.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.own.checkpoint import (
    FLOW_META_FILE,
    FLOW_WEIGHTS_FILE,
    copy_checkpoint,
    load_checkpoint,
    load_flow_heads,
    save_flow_heads,
)
from vla_accel_ros.models.own.flow import (
    FlowHeadConfig,
    FlowHeads,
    euler_sample,
    flow_matching_loss,
    prefix_condition,
)
from vla_accel_ros.models.own.policy import Policy
from vla_accel_ros.models.tokenizer import N_BINS
from vla_accel_ros.training.common import optimise_epochs, plot_loss_panels
from vla_accel_ros.training.configs import FlowTrainConfig
from vla_accel_ros.training.data import action_windows, load_demos

BIN = 2.0 / (N_BINS - 1)  # one tokenizer bin in normalised action units


def prefix_features(policy: Policy, images: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor,
                    batch_size: int = 256, progress: bool = True) -> torch.Tensor:
    """The flow head's condition (N, 2d) for every step, from the frozen target's prefill."""
    out = []
    for start in progress_bar(range(0, len(images), batch_size), desc="prefix features", unit="batch",
                              disable=not progress):
        end = start + batch_size
        prefix = policy.prefill_tensors(images[start:end], text[start:end], proprio[start:end]).prefix
        out.append(prefix_condition(prefix.hidden_last, prefix.pooled))
    return torch.cat(out)


def _optimise(module: torch.nn.Module, batch_loss: Callable[[torch.Tensor], torch.Tensor], n: int,
              cfg: FlowTrainConfig, epochs: int, lr: float, generator: torch.Generator, desc: str) -> list[float]:
    """AdamW with a one-cycle schedule over ``epochs`` shuffled passes of ``n`` samples;
    ``batch_loss(indices)`` gives each batch's loss. Returns the per-step losses."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=1e-4)
    total = epochs * math.ceil(n / cfg.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total, pct_start=0.05)
    with progress_bar(total=total, desc=desc, disable=not cfg.progress) as bar:
        return optimise_epochs(optimizer, schedule, batch_loss, n, epochs, cfg.batch_size, generator, bar)


def train_heads(cfg: FlowTrainConfig, cond: torch.Tensor, actions: torch.Tensor,
                train_idx: torch.Tensor) -> tuple[FlowHeads, dict[str, list[float]]]:
    """Flow matching for the teacher, then distillation of the 2-step student from it."""
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    x, y = cond[train_idx], actions[train_idx]
    if cfg.teacher_from:
        trained = load_flow_heads(cfg.teacher_from, cond.shape[1] // (2 * cfg.cameras))
        if trained is None:
            raise ValueError(f"--teacher-from {cfg.teacher_from}: no flow head there (vla-accel train-flow)")
        if trained.config.horizon != cfg.horizon:
            raise ValueError(f"--teacher-from {cfg.teacher_from}: its head's horizon is {trained.config.horizon}, "
                             f"not {cfg.horizon}")
        heads = FlowHeads(replace(trained.config, student_hidden=cfg.student_hidden))
        heads.teacher.load_state_dict(trained.teacher.state_dict())
        history = {"teacher": []}
    else:
        heads = FlowHeads(FlowHeadConfig(d_model=cond.shape[1] // (2 * cfg.cameras), hidden=cfg.hidden,
                                         layers=cfg.layers, student_hidden=cfg.student_hidden, horizon=cfg.horizon,
                                         cameras=cfg.cameras))
        history = {"teacher": _optimise(
            heads.teacher, lambda idx: flow_matching_loss(heads.teacher, x[idx], y[idx], generator), len(x), cfg,
            cfg.epochs, cfg.lr, generator, "flow teacher")}

    same_width = cfg.student_hidden in (0, heads.config.hidden)
    if same_width:  # start from the teacher: distillation then only has to shorten its path
        heads.student.load_state_dict(heads.teacher.state_dict())
    heads.teacher.requires_grad_(False)

    def distillation_loss(idx: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(len(idx), y.shape[1], generator=generator)
        with torch.no_grad():
            want = euler_sample(heads.teacher, x[idx], noise, heads.config.teacher_steps)
        return F.mse_loss(euler_sample(heads.student, x[idx], noise, heads.config.student_steps), want)

    history["student"] = _optimise(heads.student, distillation_loss, len(x), cfg, cfg.distill_epochs,
                                   cfg.lr / 2 if same_width else cfg.lr, generator, "flow student (distil)")
    return heads.eval(), history


def evaluate_heads(heads: FlowHeads, cond: torch.Tensor, actions: torch.Tensor, seed: int) -> dict[str, float]:
    """Held-out errors against the expert and the teacher-versus-student agreement, in bins."""
    noise = torch.randn(actions.shape, generator=torch.Generator().manual_seed(seed + 1))
    with torch.inference_mode():
        teacher = heads.sample(cond, noise, student=False)
        student = heads.sample(cond, noise, student=True)
    gap = (teacher - student).abs() / BIN
    return {
        "val_samples": int(len(actions)),
        "teacher_abs_bins": float(((teacher - actions).abs() / BIN).mean()),
        "student_abs_bins": float(((student - actions).abs() / BIN).mean()),
        "agreement_abs_bins": float(gap.mean()),
        "agreement_within2": float((gap <= 2.0).float().mean()),
    }


def plot_flow_losses(history: dict[str, list[float]], path: Path) -> None:
    def draw(ax: Any, key: str) -> None:
        if not history[key]:  # e.g. a teacher reused with --teacher-from
            ax.text(0.5, 0.5, "not trained in this run", ha="center", va="center", transform=ax.transAxes)
            return
        ax.plot(history[key], alpha=0.5)
        ax.set_yscale("log")

    panels = (("teacher: flow matching", "teacher"), ("student: distillation", "student"))
    plot_loss_panels(path, panels, (10, 3.5), draw)


def train_flow(cfg: FlowTrainConfig) -> dict[str, Any]:
    from vla_accel_ros.models.load import recognise

    if "flow_chunks" in recognise(cfg.checkpoint).capabilities:  # a flow VLA's own flow: fit its 2-step sampler
        from vla_accel_ros.training.lerobot_flow import distil_lerobot

        return distil_lerobot(cfg)
    if cfg.method != "distilled":
        raise ValueError(f"--method {cfg.method} applies to LeRobot flow policies; the own head's student is distilled")
    if cfg.student_from is not None:
        raise ValueError("--student-from applies to LeRobot flow policies; the own head's student is trained afresh")
    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    policy = load_checkpoint(cfg.checkpoint)
    data = load_demos(cfg.data, policy.config.max_text_len, cfg.max_episodes, progress=cfg.progress)
    train_idx, val_idx = data.split(cfg.val_fraction)
    cond = prefix_features(policy, data.images, data.text, data.proprio, progress=cfg.progress)
    if cfg.cameras == 2:  # the wrist image's features after the front image's, as the policy's image slots
        if data.wrist_images is None:
            raise ValueError(f"--cameras 2: the demos in {cfg.data} hold no wrist_images (vla-accel demos --wrist)")
        wrist = prefix_features(policy, data.wrist_images, data.text, data.proprio, progress=cfg.progress)
        cond = torch.cat([cond, wrist], dim=-1)
    actions = torch.from_numpy(policy.tokenizer.normalise(data.actions.numpy())).to(torch.float32)
    actions = action_windows(actions, data.episode, cfg.horizon)
    heads, history = train_heads(cfg, cond, actions, train_idx)
    metrics = evaluate_heads(heads, cond[val_idx], actions[val_idx], cfg.seed) if len(val_idx) else {}
    metrics["train_seconds"] = round(time.perf_counter() - start, 2)
    out = Path(cfg.out or cfg.checkpoint)
    if cfg.out and Path(cfg.out).resolve() != Path(cfg.checkpoint).resolve():  # a complete checkpoint there
        copy_checkpoint(cfg.checkpoint, out, exclude=(FLOW_WEIGHTS_FILE, FLOW_META_FILE))
    recipe = {**{k: v for k, v in asdict(cfg).items() if k != "progress"},
              "data": str(Path(cfg.data).resolve()), "n_train_samples": len(train_idx)}
    save_flow_heads(heads, out, recipe, metrics)
    plot_flow_losses(history, out / "flow_loss.png")
    print("held-out flow-head metrics:\n" + json.dumps(metrics, indent=2))
    print(f"flow head written to {out} (loss plot flow_loss.png)")
    return metrics


