"""What every trainer shares: hyperparameter checks, the recipe and robot recorded in a checkpoint,
seeding, the cosine schedule and epoch loop, image-shift augmentation, greedy rollouts for draft
targets, and loss plots.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.core.robot_record import RobotRecord, robot_in_use
from vla_accel_ros.models.own.policy import Policy, Prefix
from vla_accel_ros.models.tokenizer import N_BINS
from vla_accel_ros.sim.env import SimConfig
from vla_accel_ros.training.data import DemoDataset

KEYPOINT_LOSS_SCALE = 10.0  # keypoints live in [-1, 1]: x10 puts the smooth-L1 knee at ~3 px of 128


class KeypointHead(torch.nn.Linear):
    """A training aid: per image token of a ``grid`` x ``grid`` camera image, each keypoint's log-mass
    and offset within the token's cell; the softmax-weighted mean over the tokens is where the
    camera sees the keypoint (x, y in [-1, 1])."""

    def __init__(self, width: int, n_keypoints: int, grid: int) -> None:
        super().__init__(width, 3 * n_keypoints)
        centres = (torch.arange(grid, dtype=torch.float32) + 0.5) * (2.0 / grid) - 1.0
        rows, cols = torch.meshgrid(centres, centres, indexing="ij")
        self.register_buffer("centres", torch.stack([cols.flatten(), rows.flatten()], dim=-1), persistent=False)
        self.half_cell = 1.0 / grid

    def positions(self, image_states: torch.Tensor) -> torch.Tensor:
        """(B, K, 2) keypoint positions from the image tokens' hidden states (B, grid², width)."""
        b, p, _ = image_states.shape
        out = self(image_states).view(b, p, -1, 3)
        weights = out[..., 0].softmax(dim=1).unsqueeze(-1)  # (B, P, K, 1) over the tokens
        where = self.centres[None, :, None, :] + torch.tanh(out[..., 1:]) * self.half_cell
        return (weights * where).sum(dim=1)

    def loss(self, image_states: torch.Tensor, keypoints: torch.Tensor) -> torch.Tensor:
        """Smooth-L1 between the predicted and labelled (finite) keypoints, at KEYPOINT_LOSS_SCALE."""
        labelled = torch.isfinite(keypoints)
        if not labelled.any():
            return torch.zeros((), device=image_states.device)
        got = self.positions(image_states)[labelled] * KEYPOINT_LOSS_SCALE
        return F.smooth_l1_loss(got, keypoints[labelled] * KEYPOINT_LOSS_SCALE)


def component_recipe(cfg: Any, data: DemoDataset, n_train: int, n_val: int, *,
                     drop: Sequence[str] = ("progress", "out"), unit: str = "samples") -> dict[str, Any]:
    """The recipe of a component trained on a checkpoint (``cfg`` has ``checkpoint`` and ``data``):
    its settings without ``drop``, both paths resolved, and the episode and split counts."""
    return {
        **{k: v for k, v in asdict(cfg).items() if k not in drop},
        "checkpoint": str(Path(cfg.checkpoint).resolve()),
        "data": str(Path(cfg.data).resolve()),
        "n_episodes": data.n_episodes,
        f"n_train_{unit}": n_train,
        f"n_val_{unit}": n_val,
    }


def demo_robot(image_size: int) -> RobotRecord:
    """The arm the demonstrations are recorded on (``vla-accel demos``): the package URDF's arm and
    TCP frame, stepped at the sim's control rate, its front camera at ``image_size``."""
    sim = SimConfig()
    kin = ArmKinematics(default_urdf(), tcp_frame=sim.tcp_frame)
    return robot_in_use(kin.joint_names, kin.tcp_frame, action_dt_s=1.0 / sim.control_hz, image_size=image_size)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def cosine_schedule(step: int, total: int, warmup: int, floor: float = 0.1) -> float:
    """LR multiplier: linear warm-up, then cosine decay to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimise_epochs(optimizer: torch.optim.Optimizer, schedule: torch.optim.lr_scheduler.LRScheduler,
                    batch_loss: Callable[[torch.Tensor], torch.Tensor], n: int, epochs: int, batch_size: int,
                    generator: torch.Generator, bar: Any,
                    clip: Sequence[torch.nn.Parameter] | None = None) -> list[float]:
    """``epochs`` shuffled passes over ``n`` samples, one optimiser and schedule step per batch of
    indices (``batch_loss(indices)`` gives its loss; gradient norm clipped to 1 over ``clip`` when
    given), counted on ``bar``: the loop of the small heads' trainings (train-world, train-flow).
    Returns the per-step losses, for the loss plots."""
    losses: list[float] = []
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=generator).split(batch_size):
            loss = batch_loss(idx)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(clip, 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.5f}")
    return losses


def random_shift(
    images: torch.Tensor, max_shift: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift each uint8 image (B, H, W, 3) by up to ``max_shift`` pixels, repeating the border.
    Returns the images and how far their content moved, (B, 2) pixels (x, y)."""
    b, h, w, _ = images.shape
    if max_shift == 0:
        return images, torch.zeros(b, 2)
    dy, dx = torch.randint(-max_shift, max_shift + 1, (2, b, 1), generator=generator)
    rows = (torch.arange(h) + dy).clamp_(0, h - 1)
    cols = (torch.arange(w) + dx).clamp_(0, w - 1)
    moved = -torch.cat([dx, dy], dim=1).to(torch.float32)  # output pixel (r, c) shows input (r + dy, c + dx)
    return images[torch.arange(b)[:, None, None], rows[:, :, None], cols[:, None, :]], moved


@dataclass(frozen=True, eq=False)
class GreedyRollout:
    """The frozen target's greedy decoding of a batch: what the draft heads learn to predict.

    tokens: (B, 7) greedy tokens. features: (B, 7, d) the final-norm features that predict them
    (at BOS and after each of the first 6 tokens). memory: the last-layer (k, v) over the prefix and
    the first 6 tokens, each (B, H, prefix_len + 6, hd). prefix: the prefill (``prefix_len``, ``pooled``).
    """

    tokens: torch.Tensor
    features: torch.Tensor
    memory: tuple[torch.Tensor, torch.Tensor]
    prefix: Prefix

    def memory_mask(self, starts: torch.Tensor) -> torch.Tensor:
        """(S, L) bool: query s may read the prefix and the first ``starts[s]`` tokens, exactly the
        cache a draft head sees after ``starts[s]`` consumed tokens."""
        keys = torch.arange(self.memory[0].shape[2], device=starts.device)
        return keys[None, :] < (self.prefix.prefix_len + starts)[:, None]


def greedy_rollout(policy: Policy, images: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor) -> GreedyRollout:
    """The greedy rollout of ``policy``'s target on a batch, without gradients (the target is frozen
    while draft heads train)."""
    with torch.no_grad():
        prefix = policy._prefill_tensors(images, text, proprio).prefix
        greedy, final = policy._greedy(prefix)
    return GreedyRollout(tokens=greedy, features=final.action_hidden, memory=final.cache.layers[-1], prefix=prefix)


def draft_step_loss(lm_head: torch.nn.Module, pred: torch.Tensor, want_tokens: torch.Tensor,
                    want_features: torch.Tensor, feature_weight: float) -> torch.Tensor:
    """A draft head's loss on predicted features ``pred`` (B, S, d): cross-entropy of the target's
    LM head on them against the target's greedy tokens (B, S), which is what acceptance needs, plus
    ``feature_weight`` times EAGLE's smooth-L1 regression onto the target's features (B, S, d),
    which keeps the prediction in the space the LM head and later steps read."""
    ce = F.cross_entropy(lm_head(pred).reshape(-1, N_BINS), want_tokens.reshape(-1))
    return ce + feature_weight * F.smooth_l1_loss(pred, want_features)


def plot_loss_panels(path: Path, panels: Sequence[tuple[str, str]], figsize: tuple[float, float],
                     draw: Callable[[Any, str], None]) -> None:
    """Save a row of loss panels, one per ``(title, key)``; ``draw(ax, key)`` fills each. The one
    frame of every training command's loss plot (headless Agg, imported here so the CLI starts fast)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=figsize, squeeze=False)
    for ax, (title, key) in zip(axes[0], panels):
        draw(ax, key)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_loss_curve(ax: Any, losses: Sequence[float],
                    held_out: tuple[np.ndarray, Sequence[float]] | None = None) -> None:
    """Per-step training losses with their running mean (the trend through the batch noise) and,
    given as (steps, losses), held-out points; log scale when all positive; a note instead when the
    phase did not run, so a skipped phase is not mistaken for a broken plot."""
    values = np.asarray(losses, dtype=np.float64)
    if values.size:
        ax.plot(values, alpha=0.35, label="train (per step)")
        window = max(1, values.size // 50)
        smooth = np.convolve(values, np.ones(window) / window, mode="valid")
        ax.plot(np.arange(smooth.size) + window - 1, smooth, label=f"train (mean of {window})")
    if held_out is not None:
        ax.plot(*held_out, "o-", label="held-out")
    ax.set_yscale("log" if values.size and values.min() > 0 else "linear")
    if values.size:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "not trained in this run", ha="center", va="center", transform=ax.transAxes)
