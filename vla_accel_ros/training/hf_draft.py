"""Training of an EAGLE-style draft head on a Hugging Face VLA (``vla-accel train-draft``).

Input: ``vla-accel demos`` episodes (``episode_*.npz``, docs/data_layout.md) and a model directory
(a Hugging Face or OpenVLA model). Output, beside the model's weights or in ``--out``:
``draft_head.safetensors`` + ``draft_head.json`` (:mod:`vla_accel_ros.models.token_vla.draft`) and
the loss plot ``draft_loss.png``; in ``--out`` also ``vla_spec.json``, which points at the model
(``checkpoint``) and the head (``draft_head``): the two parameters that run them together. The
loader attaches a head beside the weights from then on, and one in ``--out`` when the ``draft_head``
option (the node's parameter) names it; ``sd``, ``kerv``, ``world_aware`` and ``deadline`` draft
with it.

1. Features. The target is frozen (no gradient, inference mode). With ``--teacher expert`` (the
   default), ONE teacher-forced pass per demo step (``HFTokenVLA.prefill_batch`` with the tokens) over the prompt
   and the first 6 of the expert's 7 action tokens x_0..x_5 (the demo's action in the model's own
   action tokens; the 7th would only predict an 8th token) gives the final-norm hidden states
   f_0..f_6 (f_j after j tokens, the one that predicts dimension j) and the target's argmax token
   at each, g_0..g_6. With ``--teacher target`` the history is the target's own greedy rollout
   instead (x_j = g_j; a prefill and 6 one-token passes per step): exactly what the head sees when
   it drafts for greedy decoding, worth the 7 passes when the target often disagrees with the demos
   (``train_target_expert_acc`` says how often). The features stay in memory (on the CPU, in the
   model's dtype), so the epochs run no target pass.
2. Head. Per batch: (a) one step from every start, (emb(x_{i-1}), f_{i-1}, index i) -> f_i for
   i = 1..6; (b) an unroll from the prompt's end on the head's own predictions (how it drafts the
   first round of every action). Loss of each prediction: cross-entropy of the target's LM head
   on it against the TARGET's argmax g_i, plus ``feature_weight`` times EAGLE's smooth-L1
   regression onto f_i (it keeps predictions in the space the LM head and the next step read).
   The labels are the target's tokens, not the expert's: a draft token is accepted when it
   matches what the target would emit, so matching the target's predictions is what raises
   acceptance (EAGLE trains on the target's features for the same reason); where the target
   disagrees with the demo, learning the demo would only teach rejected drafts.
3. Held-out evaluation (the last episodes, ``--val-fraction``): the head's one-step token accuracy
   against the target's argmax per dimension 1..6 (exact and within +-2 bins) beside the
   majority-token baseline of the training steps; the target's agreement with the expert; and the
   real one-round acceptance length at r = 0, 2 and 9 bins (prefill, draft 7 tokens, one verify
   pass). The same accuracy on the training steps is reported too. All go into draft_head.json.

Every tensor goes to ``--device`` (the model's and the head's); only the stored features stay on
the CPU, and each batch is moved.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.models.load import load_policy
from vla_accel_ros.models.token_vla.draft import (
    DRAFT_META_FILE,
    DRAFT_WEIGHTS_FILE,
    HFDraftConfig,
    HFDraftHead,
    default_width,
    save_hf_draft,
)
from vla_accel_ros.models.token_vla.policy import HFTokenVLA
from vla_accel_ros.models.token_vla.spec import SPEC_FILE
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS
from vla_accel_ros.training.common import (
    cosine_schedule,
    optimise_epochs,
    plot_loss_curve,
    plot_loss_panels,
    seed_everything,
)
from vla_accel_ros.training.configs import HFDraftTrainConfig
from vla_accel_ros.training.data import DatasetError, DemoDataset, load_demos

LOSS_PLOT = "draft_loss.png"
ACCEPT_RADII = (0, 2, 9)  # bins; 0 = exact speculative decoding
# The HF prompt is made from the instruction text itself; the byte ids DemoDataset also builds are not read.
UNUSED_TEXT_LEN = 1
LOW_AGREEMENT = 0.5  # target-vs-demo token agreement below which --teacher target is suggested


# --- features -----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TeacherForced:
    """The frozen target's teacher-forced pass over N demo steps.

    features (N, 7, d), model dtype, CPU: f_0..f_6, the final hidden states at the prompt's end and
    after each of the first 6 tokens of ``history``. history (N, 7) int64: the tokens consumed (the
    7th is never fed). target (N, 7) int64: the target's argmax at f_0..f_6 (our bins). expert
    (N, 7) int64: the demo's actions as the model's action tokens.
    """

    features: torch.Tensor
    history: torch.Tensor
    target: torch.Tensor
    expert: torch.Tensor


def episode_instructions(directory: Path | str, data: DemoDataset) -> list[str]:
    """The instruction text of each loaded episode (``data.files``), as the episode file stores it."""
    instructions = []
    for name in data.files:
        path = Path(directory) / name
        with np.load(path, allow_pickle=False) as episode:
            instructions.append(str(episode["instruction"]))
    return instructions


def observation_at(data: DemoDataset, instructions: list[str], i: int) -> Observation:
    """The observation of demo step ``i``."""
    proprio = data.proprio[i].numpy()
    return Observation(image=data.images[i].numpy(), instruction=instructions[int(data.episode[i])],
                       joint_pos=proprio[:-1].astype(np.float64), gripper=float(proprio[-1]))


def teacher_forced(policy: HFTokenVLA, data: DemoDataset, instructions: list[str], teacher: str = "expert",
                   progress: bool = True) -> TeacherForced:
    """The target's features and tokens at every demo step, consuming the expert's tokens (one
    pass) or its own greedy ones (``teacher`` "target": seven passes); module docstring, step 1."""
    expert = torch.from_numpy(policy.tokenizer.encode(data.actions.numpy()))
    features, history, target = [], [], []
    for i in progress_bar(range(len(data)), desc=f"target features ({teacher} tokens)", unit="step",
                          disable=not progress, dynamic_ncols=True):
        obs = observation_at(data, instructions, i)
        if teacher == "expert":
            out = policy.prefill_batch([obs], expert[i : i + 1, : ACTION_DIM - 1])
            hidden, tokens, greedy = out.prefix.action_hidden[0], expert[i], out.logits[0].argmax(-1)
        else:
            hidden, greedy = greedy_rollout(policy, obs)
            tokens = greedy
        # clone outside inference mode: the tensors then feed the head's autograd graph as inputs
        features.append(hidden.to("cpu").clone())
        history.append(tokens.to("cpu").clone())
        target.append(greedy.to("cpu").clone())
    return TeacherForced(features=torch.stack(features), history=torch.stack(history), target=torch.stack(target),
                         expert=expert)


def greedy_rollout(policy: HFTokenVLA, obs: Observation) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's greedy action at ``obs``: its hidden states f_0..f_6 (7, d) and tokens (7,)
    (a prefill and 6 one-token passes; the 7th token is read, not fed)."""
    with torch.inference_mode():
        prefix = policy.prefill(obs)
        token = policy.action_logits(prefix.hidden_last).argmax(-1, keepdim=True)
        tokens = [token]
        for _ in range(ACTION_DIM - 1):
            out = policy.score(prefix, token)
            prefix, token = out.prefix, out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
        return prefix.action_hidden[0], torch.cat(tokens, dim=1)[0]


# --- the objective --------------------------------------------------------------------------------
def step_loss(policy: HFTokenVLA, pred: torch.Tensor, want_tokens: torch.Tensor, want_features: torch.Tensor,
              feature_weight: float) -> torch.Tensor:
    """Cross-entropy of the target's LM head on predicted hidden states ``pred`` (B, S, d) against
    the target's tokens (B, S), plus ``feature_weight`` times smooth-L1 onto its states (B, S, d)."""
    ce = F.cross_entropy(policy.action_logits(pred).reshape(-1, N_BINS), want_tokens.reshape(-1))
    return ce + feature_weight * F.smooth_l1_loss(pred, want_features)


def draft_loss(head: HFDraftHead, policy: HFTokenVLA, features: torch.Tensor, history: torch.Tensor,
               target: torch.Tensor, feature_weight: float) -> torch.Tensor:
    """The head's loss on a batch: features (B, 7, d) float32, consumed and target tokens (B, 7),
    all on the head's device (module docstring, step 2)."""
    n = ACTION_DIM
    emb = policy.action_embeddings[history[:, : n - 1]]  # the tokens consumed at dimensions 0..5
    index = torch.arange(1, n, device=features.device)
    pred = head(emb, features[:, : n - 1], index)  # (a) one step from every start
    loss = step_loss(policy, pred, target[:, 1:], features[:, 1:], feature_weight)
    current, unrolled = features[:, :1], []
    for i in range(1, n):  # (b) from the prompt's end on its own predictions
        current = head(emb[:, i - 1 : i], current, index[i - 1 : i])
        unrolled.append(current)
    return loss + step_loss(policy, torch.cat(unrolled, dim=1), target[:, 1:], features[:, 1:], feature_weight)


def batch_of(steps: TeacherForced, idx: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(features float32, history, target) of the steps ``idx``, on ``device``."""
    return (steps.features[idx].to(device, torch.float32), steps.history[idx].to(device),
            steps.target[idx].to(device))


# --- evaluation -----------------------------------------------------------------------------------
@torch.no_grad()
def one_step_agreement(head: HFDraftHead, policy: HFTokenVLA, steps: TeacherForced, idx: torch.Tensor,
                       batch_size: int, feature_weight: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Per dimension 1..6, the share of steps ``idx`` where the head's token (one step from the
    target's state before it) is the target's argmax, exactly and within 2 bins; and the training
    objective's mean loss on them (:func:`draft_loss`)."""
    exact, within2, loss, device = np.zeros(ACTION_DIM - 1), np.zeros(ACTION_DIM - 1), 0.0, policy.device
    index = torch.arange(1, ACTION_DIM, device=device)
    for batch in idx.split(batch_size):
        features, history, target = batch_of(steps, batch, device)
        pred = head(policy.action_embeddings[history[:, :-1]], features[:, :-1], index)
        tokens = policy.action_logits(pred).argmax(-1)
        exact += (tokens == target[:, 1:]).double().sum(dim=0).cpu().numpy()
        within2 += ((tokens - target[:, 1:]).abs() <= 2).double().sum(dim=0).cpu().numpy()
        loss += float(draft_loss(head, policy, features, history, target, feature_weight)) * len(batch)
    n = max(len(idx), 1)
    return exact / n, within2 / n, loss / n


def majority_agreement(steps: TeacherForced, train_idx: torch.Tensor, idx: torch.Tensor) -> np.ndarray:
    """Per dimension 1..6, the share of steps ``idx`` whose target token is the training steps'
    most common one there: what a head that ignores its inputs would reach."""
    common = torch.mode(steps.target[train_idx, 1:], dim=0).values
    return (steps.target[idx, 1:] == common).double().mean(dim=0).numpy()


@torch.no_grad()
def acceptance(policy: HFTokenVLA, data: DemoDataset, instructions: list[str], idx: torch.Tensor,
               progress: bool = True) -> dict[str, Any]:
    """One real speculative round from the start of each action of steps ``idx`` (the head
    attached to ``policy``): prefill, draft 7 tokens, one verify pass; the mean accepted length
    at each radius of ``ACCEPT_RADII`` and the per-position agreement with the target's tokens."""
    accepted = {r: 0.0 for r in ACCEPT_RADII}
    agree = np.zeros(ACTION_DIM)
    for i in progress_bar(idx.tolist(), desc="acceptance", unit="step", disable=not progress, dynamic_ncols=True):
        prefix = policy.prefill(observation_at(data, instructions, i))
        draft, _ = policy.draft_tokens(prefix, ACTION_DIM)
        verify = policy.score(prefix, draft[:, :-1]).logits[0].argmax(-1)
        close = (draft[0] - verify).abs().cpu()
        agree += (close == 0).double().numpy()
        for r in ACCEPT_RADII:
            accepted[r] += float((close <= r).long().cumprod(dim=0).sum())
    n = max(len(idx), 1)
    return {**{f"accept_len_r{r}": accepted[r] / n for r in ACCEPT_RADII},
            "draft_agreement_per_pos": (agree / n).tolist()}


def split_metrics(prefix: str, exact: np.ndarray, within2: np.ndarray, baseline: np.ndarray) -> dict[str, Any]:
    """The accuracy entries of one split, named ``prefix_...``."""
    return {f"{prefix}_draft_acc_pos1_6": float(exact.mean()), f"{prefix}_draft_acc_per_pos1_6": exact.tolist(),
            f"{prefix}_draft_acc_within2_pos1_6": float(within2.mean()),
            f"{prefix}_majority_acc_pos1_6": float(baseline.mean())}


# --- the run --------------------------------------------------------------------------------------
def head_directory(cfg: HFDraftTrainConfig, model: Path) -> Path:
    """Where the head goes (``--out``, created, else the model's directory), refused in one line
    unless it can be written, before any model loads (a model directory that does not exist is the
    loader's to report)."""
    target = Path(cfg.out) if cfg.out else model
    if not cfg.out and not model.is_dir():
        return target
    if cfg.out:
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"--out {target}: cannot be created ({error.strerror})") from None
    if not os.access(target, os.W_OK):
        hint = "" if cfg.out else "; give --out DIR to write the head elsewhere"
        raise ValueError(f"{target}: not writable, the draft head cannot be saved there{hint}")
    return target


def write_pointer(target: Path, model: Path) -> Path:
    """``vla_spec.json`` in the head's own directory: the model it was trained on and the head, as
    the node's ``checkpoint`` and ``draft_head`` parameters."""
    path = target / SPEC_FILE
    path.write_text(json.dumps({"checkpoint": str(model.resolve()), "draft_head": str(target.resolve())},
                               indent=2) + "\n")
    return path


def plot_losses(history: dict[str, list[float]], path: Path) -> None:
    """Per-step training losses and the held-out loss at each epoch's end, one panel."""
    def draw(ax: Any, key: str) -> None:
        held_out = None
        if history["val"]:
            per_epoch = max(1, len(history[key]) // len(history["val"]))
            held_out = (per_epoch * np.arange(1, len(history["val"]) + 1) - 1, history["val"])
        plot_loss_curve(ax, history[key], held_out)

    plot_loss_panels(path, (("draft head (token cross-entropy + feature smooth-L1)", "train"),), (7, 4), draw)


def train_hf_draft(cfg: HFDraftTrainConfig) -> dict[str, Any]:
    """Train the head, write it with its plot beside the model or in ``cfg.out``; returns the metrics it records."""
    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    directory = CheckpointRef.parse(cfg.checkpoint).directory
    target = head_directory(cfg, directory)
    # the demos first: a bad file fails before a large model has loaded
    data = load_demos(cfg.data, UNUSED_TEXT_LEN, cfg.max_episodes, not cfg.include_failures, cfg.progress)
    if len(data) < 2:
        raise DatasetError(f"{cfg.data}: {len(data)} demo step; the head needs at least 2")
    instructions = episode_instructions(cfg.data, data)
    # a family whose options take no draft refuses draft=False in one line: the head is a token VLA's
    policy = load_policy(cfg.checkpoint, unnorm_key=cfg.unnorm_key, device=cfg.device, dtype=cfg.dtype, draft=False)
    if not isinstance(policy, HFTokenVLA):
        raise ValueError(f"{directory}: not a token VLA with a draft-head slot (a Hugging Face or OpenVLA model)")
    train_idx, val_idx = data.split(cfg.val_fraction)
    print(f"{data.n_episodes} episodes, {len(data)} steps ({len(train_idx)} train / {len(val_idx)} held-out); "
          f"model {policy.n_parameters()['target']:,} parameters, hidden size {policy.config.d_model}")
    steps = teacher_forced(policy, data, instructions, cfg.teacher, cfg.progress)

    config = HFDraftConfig(hidden_size=policy.config.d_model, vocab_size=policy.config.vocab_size,
                           width=cfg.width or default_width(policy.config.d_model), blocks=cfg.blocks)
    device = policy.device
    head = HFDraftHead(config).to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(len(train_idx) / cfg.batch_size)
    total = max(1, cfg.epochs * per_epoch)
    warmup = min(cfg.warmup_steps, total // 5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_schedule(s, total, warmup))
    generator = torch.Generator().manual_seed(cfg.seed)
    history: dict[str, list[float]] = {"train": [], "val": []}

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        return draft_loss(head, policy, *batch_of(steps, train_idx[idx], device), cfg.feature_weight)

    with progress_bar(total=cfg.epochs * per_epoch, desc="draft head", unit="batch", disable=not cfg.progress,
                      dynamic_ncols=True) as bar:
        for _ in range(cfg.epochs):
            head.train()
            history["train"] += optimise_epochs(optimizer, schedule, batch_loss, len(train_idx), 1, cfg.batch_size,
                                                generator, bar, clip=list(head.parameters()))
            if len(val_idx):
                head.eval()
                history["val"].append(one_step_agreement(head, policy, steps, val_idx, cfg.batch_size,
                                                         cfg.feature_weight)[2])
    head.eval().requires_grad_(False)

    exact, within2, _ = one_step_agreement(head, policy, steps, train_idx, cfg.batch_size, cfg.feature_weight)
    metrics: dict[str, Any] = {
        "train_steps": len(train_idx), "val_steps": len(val_idx),
        "chance_acc": 1.0 / N_BINS,
        "train_target_expert_acc": float((steps.target[train_idx] == steps.expert[train_idx]).double().mean()),
        **split_metrics("train", exact, within2, majority_agreement(steps, train_idx, train_idx)),
    }
    if len(val_idx):
        exact, within2, val_loss = one_step_agreement(head, policy, steps, val_idx, cfg.batch_size, cfg.feature_weight)
        metrics |= split_metrics("val", exact, within2, majority_agreement(steps, train_idx, val_idx))
        metrics["val_loss"] = val_loss
        metrics["val_target_expert_acc"] = float((steps.target[val_idx] == steps.expert[val_idx]).double().mean())
        policy.attach_draft(head)
        metrics |= {f"val_{k}": v for k, v in acceptance(policy, data, instructions, val_idx, cfg.progress).items()}
    if history["train"]:
        metrics["final_train_loss"] = history["train"][-1]
    metrics["train_seconds"] = round(time.perf_counter() - start, 2)

    recipe = {
        **{k: v for k, v in asdict(cfg).items() if k != "progress"},
        "checkpoint": str(directory.resolve()), "data": str(Path(cfg.data).resolve()),
        "n_episodes": data.n_episodes,
        "labels": f"the target's argmax tokens, the target consuming the {cfg.teacher}'s tokens",
        "loss": "token cross-entropy + feature_weight * smooth-L1 on hidden states; one step from every start "
                "plus an unroll from the prompt's end",
        "optimizer": "AdamW", "schedule": "linear warm-up + cosine to 10%", "command": cfg.command(),
    }
    ids = policy.action_ids
    replaced = (target / DRAFT_WEIGHTS_FILE).exists()
    save_hf_draft(head, target, (int(ids[0]), int(ids[-1])), recipe, metrics)
    plot_losses(history, target / LOSS_PLOT)
    outside = target.resolve() != directory.resolve()
    pointer = write_pointer(target, directory) if outside else None
    report = {k: v for k, v in metrics.items() if not isinstance(v, (list, str))}
    print("metrics:\n" + "\n".join(f"  {k}: {v:.4f}" if isinstance(v, float) else f"  {k}: {v}"
                                   for k, v in report.items()))
    if cfg.teacher == "expert" and metrics["train_target_expert_acc"] < LOW_AGREEMENT:
        print(f"note: the target's tokens match the demos' on {metrics['train_target_expert_acc']:.0%} of the "
              "training tokens, so the head drafts after token histories it rarely saw; --teacher target "
              "trains on the target's own (7 passes a step)")
    print(f"draft head {'replaced' if replaced else 'written'}: {target / DRAFT_WEIGHTS_FILE} + "
          f"{DRAFT_META_FILE}, loss plot {target / LOSS_PLOT}")
    if pointer is not None:
        print(f"{pointer}: run it with checkpoint: {directory.resolve()} and draft_head: {target.resolve()}")
    return metrics
