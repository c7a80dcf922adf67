"""Training of a parallel (Medusa-style) draft head on a trained checkpoint (``vla-accel train-parallel-draft``).

The sequential draft head proposes one token per light step, each step reading the feature the
previous one predicted, so drafting 6 tokens costs 6 dependent steps. The parallel head
(:class:`~vla_accel_ros.models.own.draft.ParallelDraftHead`, the same network) proposes every
remaining position from the prefix end alone, so one call with 6 queries drafts them all; the
``kerv`` decoder then decodes an action with one parallel draft call and one verify pass.

Training, with the target and the sequential head frozen: per batch, the target's greedy rollout
gives its tokens x_0..x_6, its features f_0..f_6 (f_j predicts x_j) and its last-layer KV; for
every start j in 0..5 the queries for positions i = j+1..6 all read (emb(x_j), f_j, index i) over
the KV of the prefix plus j tokens (21 queries in one batched call, one memory mask row each),
exactly what :meth:`Policy.draft_tokens_parallel` sees after j consumed tokens. The loss is the
sequential head's (``train.draft_step_loss``): cross-entropy of the target's LM head on the
prediction against x_i, plus ``feature_weight`` times a smooth-L1 regression onto f_i.

Held-out evaluation (the last episodes, as in ``vla-accel train``): per-position agreement of each
head's proposal from the start of the action with the target's greedy tokens, exactly and within
+-2, +-5 and +-9 bins, and the one-round relaxed acceptance length at those radii (one target pass
verifies the whole proposal). Written into ``parallel_draft.json`` and printed.

OUT (``--out``) becomes a copy of the checkpoint plus ``parallel_draft.*`` and the loss plot;
``--in-place`` adds them to ``--checkpoint`` itself instead (never by default).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.own.checkpoint import (
    PARALLEL_DRAFT_META_FILE,
    PARALLEL_DRAFT_WEIGHTS_FILE,
    copy_checkpoint,
    load_checkpoint,
    save_parallel_draft,
)
from vla_accel_ros.models.own.draft import DraftHead, ParallelDraftHead
from vla_accel_ros.models.own.modules import count_parameters
from vla_accel_ros.models.own.policy import Policy, Prefix
from vla_accel_ros.training.common import (
    GreedyRollout,
    component_recipe,
    cosine_schedule,
    draft_step_loss,
    greedy_rollout,
    optimise_epochs,
    plot_loss_curve,
    plot_loss_panels,
    seed_everything,
)
from vla_accel_ros.training.configs import ParallelDraftTrainConfig
from vla_accel_ros.training.data import DemoDataset, load_demos

AGREEMENT_RADII = (0, 2, 5, 9)  # bins; 0 = exact
HEADS = ("sequential", "parallel")
LOSS_PLOT = "parallel_draft_loss.png"


# --- the objective ----------------------------------------------------------------------------
def parallel_queries(n_action_tokens: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(starts j, positions i), each (S,): every query the parallel head answers, position i after
    j consumed tokens for 0 <= j < i < n (S = 21 for 7 tokens)."""
    pairs = [(j, i) for j in range(n_action_tokens - 1) for i in range(j + 1, n_action_tokens)]
    starts, positions = torch.tensor(pairs, dtype=torch.long, device=device).T
    return starts, positions


def parallel_draft_loss(policy: Policy, head: DraftHead, rollout: GreedyRollout, feature_weight: float) -> torch.Tensor:
    """The parallel head's loss on one batch's greedy rollout: all (j, i) queries in one call, each
    reading the greedy token and feature after j tokens and the KV of the prefix plus j tokens."""
    target = policy.target
    starts, positions = parallel_queries(policy.n_action_tokens, rollout.tokens.device)
    pred = head(target.action_emb(rollout.tokens[:, starts]), rollout.features[:, starts], positions,
                rollout.memory, rollout.memory_mask(starts))
    return draft_step_loss(target.lm_head, pred, rollout.tokens[:, positions], rollout.features[:, positions],
                           feature_weight)


def train_head(policy: Policy, head: DraftHead, data: DemoDataset, train_idx: torch.Tensor,
               cfg: ParallelDraftTrainConfig) -> list[float]:
    """``cfg.epochs`` passes of AdamW (linear warm-up, cosine to 10%) over the training steps, the
    target and the sequential head frozen; leaves ``head`` in eval mode. Returns the per-step losses."""
    policy.target.eval().requires_grad_(False)
    policy.draft.eval().requires_grad_(False)
    if cfg.epochs == 0 or len(train_idx) == 0:
        return []
    head.train().requires_grad_(True)
    params = list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = cfg.epochs * math.ceil(len(train_idx) / cfg.batch_size)
    warmup = min(cfg.warmup_steps, total // 5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_schedule(s, total, warmup))

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        rows = train_idx[idx]
        rollout = greedy_rollout(policy, data.images[rows], data.text[rows], data.proprio[rows])
        return parallel_draft_loss(policy, head, rollout, cfg.feature_weight)

    generator = torch.Generator().manual_seed(cfg.seed)
    with progress_bar(total=total, desc="parallel draft", unit="batch", disable=not cfg.progress,
                      dynamic_ncols=True) as bar:
        losses = optimise_epochs(optimizer, schedule, batch_loss, len(train_idx), cfg.epochs, cfg.batch_size,
                                 generator, bar, clip=params)
    head.eval()
    return losses


# --- held-out evaluation ----------------------------------------------------------------------
def _agreement_key(head: str, radius: int) -> str:
    return f"{head}_agreement" if radius == 0 else f"{head}_agreement_within{radius}"


def evaluate_heads(policy: Policy, data: DemoDataset, val_idx: torch.Tensor, batch_size: int = 256,
                   progress: bool = True) -> dict[str, Any]:
    """Both heads' proposals from the start of the action (j = 0) on the steps ``val_idx``, against
    the target's greedy tokens: per-position agreement at each radius of AGREEMENT_RADII (position
    0 is the target's own token for both, so means over positions 1..6 are reported too), and the
    mean accepted length of one relaxed speculative round at each radius (verified in one pass)."""
    if len(val_idx) == 0:
        return {"val_samples": 0}
    n_act = policy.n_action_tokens
    proposers: dict[str, Callable[[Prefix, int], tuple[torch.Tensor, torch.Tensor]]] = {
        "sequential": policy.draft_tokens, "parallel": policy.draft_tokens_parallel}
    sums: dict[str, torch.Tensor] = {}

    def add(name: str, value: torch.Tensor) -> None:
        sums[name] = sums.get(name, 0) + value.double().sum(dim=0)

    for rows in progress_bar(val_idx.split(batch_size), desc="held-out", unit="batch", disable=not progress):
        prefix = policy.prefill_tensors(data.images[rows], data.text[rows], data.proprio[rows]).prefix
        greedy = policy.greedy_decode(prefix)
        for head, propose in proposers.items():
            draft, _ = propose(prefix, n_act)
            verify = policy.score(prefix, draft).logits[:, :n_act].argmax(-1)
            for r in AGREEMENT_RADII:
                add(_agreement_key(head, r), ((draft - greedy).abs() <= r).float())
                add(f"{head}_accept_len_r{r}", ((draft - verify).abs() <= r).long().cumprod(dim=1).sum(dim=1))
    n = len(val_idx)
    metrics: dict[str, Any] = {"val_episodes": int(data.episode[val_idx].unique().numel()), "val_samples": n}
    for head in HEADS:
        for r in AGREEMENT_RADII:
            per_pos = (sums[_agreement_key(head, r)] / n).tolist()
            metrics[_agreement_key(head, r) + "_per_pos"] = per_pos
            metrics[_agreement_key(head, r) + "_pos1_6"] = float(np.mean(per_pos[1:]))
        for r in AGREEMENT_RADII:
            metrics[f"{head}_accept_len_r{r}"] = float(sums[f"{head}_accept_len_r{r}"] / n)
    return metrics


def format_report(metrics: dict[str, Any]) -> str:
    """The held-out figures as a table: per position, the sequential head above the parallel one."""
    if not metrics.get("val_samples"):
        return "no held-out steps: nothing evaluated"
    n_pos = len(metrics[_agreement_key(HEADS[0], 0) + "_per_pos"])
    lines = [f"held-out agreement with the target's greedy tokens ({metrics['val_samples']} steps, "
             f"{metrics['val_episodes']} episodes), proposals from the start of the action:",
             f"{'':>20}" + "".join(f"{'pos' + str(p):>7}" for p in range(n_pos)) + f"{'pos1-6':>8}"]
    for r in AGREEMENT_RADII:
        for head in HEADS:
            key = _agreement_key(head, r)
            label = f"{'exact' if r == 0 else f'+-{r}':>6} {head:>12} "
            lines.append(label + "".join(f"{v:7.3f}" for v in metrics[key + "_per_pos"])
                         + f"{metrics[key + '_pos1_6']:8.3f}")
    lines.append("one-round accepted length (of 7): " + "; ".join(
        f"r={r}: " + " / ".join(f"{metrics[f'{head}_accept_len_r{r}']:.2f}" for head in HEADS)
        for r in AGREEMENT_RADII) + " (sequential / parallel)")
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------------
def train_parallel_draft(cfg: ParallelDraftTrainConfig) -> dict[str, Any]:
    """Train, evaluate and write the parallel draft head; returns the held-out metrics."""
    start = time.perf_counter()
    out = cfg.destination()
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    policy = load_checkpoint(cfg.checkpoint)
    if policy.parallel_draft is not None:
        print(f"{cfg.checkpoint} already has a parallel draft head: a new one is trained in its place")
    data = load_demos(cfg.data, policy.config.max_text_len, cfg.max_episodes, progress=cfg.progress)
    if data.image_size != policy.config.image_size:
        raise ValueError(f"demo images are {data.image_size}px, the checkpoint expects {policy.config.image_size}px")
    train_idx, val_idx = data.split(cfg.val_fraction)
    # Start from the sequential head's weights: its layer already maps (token, feature, index) to
    # the next feature, which is the parallel task at the first position, so training only has to
    # teach it to reach further ahead without its own intermediate features.
    head = ParallelDraftHead.from_sequential(policy.config, policy.draft)
    print(f"{data.n_episodes} episodes, {len(data)} steps ({len(train_idx)} train / {len(val_idx)} held-out); "
          f"parallel draft head: {count_parameters(head)} parameters")
    losses = train_head(policy, head, data, train_idx, cfg)
    policy.parallel_draft = head
    metrics = evaluate_heads(policy, data, val_idx, cfg.eval_batch_size, cfg.progress)
    if losses:  # the loss's trend at a glance, without the plot
        window = max(1, min(20, len(losses) // 4))
        metrics["train_loss_start"] = float(np.mean(losses[:window]))
        metrics["train_loss_end"] = float(np.mean(losses[-window:]))
    metrics["train_seconds"] = round(time.perf_counter() - start, 2)

    if not cfg.in_place:
        copy_checkpoint(cfg.checkpoint, out, exclude=(PARALLEL_DRAFT_WEIGHTS_FILE, PARALLEL_DRAFT_META_FILE, LOSS_PLOT))
    recipe = {
        **component_recipe(cfg, data, len(train_idx), len(val_idx), drop=("progress", "out", "in_place")),
        "init": "the checkpoint's sequential draft head",
        "objective": "all (j, i) queries, 0 <= j < i <= 6: CE(target LM head) + feature_weight * smooth-L1 feature",
        "optimizer": "AdamW, linear warm-up + cosine to 10%, grad norm clipped to 1",
        "command": cfg.command(),
    }
    save_parallel_draft(head, out, recipe, metrics)
    plot_loss_panels(out / LOSS_PLOT, (("parallel draft head (CE + feature)", "loss"),), (7, 4),
                     lambda ax, key: plot_loss_curve(ax, losses))
    size_kb = (out / PARALLEL_DRAFT_WEIGHTS_FILE).stat().st_size / 1e3
    print(format_report(metrics))
    print(f"parallel draft head written to {out} ({PARALLEL_DRAFT_WEIGHTS_FILE}: {size_kb:.0f} kB, loss plot "
          f"{LOSS_PLOT}) in {metrics['train_seconds']:.0f} s")
    return metrics


