"""Training of the target VLA and its draft and contact heads: demonstrations -> checkpoint (``vla-accel train``).

Three phases on the same in-memory dataset:
1. behaviour cloning of the target (teacher-forced cross-entropy over 256 bins for the 7 tokens);
2. with the target frozen, the draft head (matching the target's greedy tokens, plus EAGLE-style
   regression onto the target's features) and the contact head (BCE on near-contact labels);
3. held-out evaluation (last episodes): target-vs-expert token accuracy, draft-vs-target agreement
   and one-round speculative acceptance lengths, written into model.json and printed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.own.checkpoint import load_checkpoint, save_checkpoint
from vla_accel_ros.models.own.config import VLAConfig
from vla_accel_ros.models.own.policy import Policy
from vla_accel_ros.models.tokenizer import N_BINS, ActionTokenizer
from vla_accel_ros.training.common import (
    KEYPOINT_LOSS_SCALE,
    cosine_schedule,
    demo_robot,
    draft_step_loss,
    greedy_rollout,
    plot_loss_curve,
    plot_loss_panels,
    random_shift,
    seed_everything,
)
from vla_accel_ros.training.configs import TrainConfig
from vla_accel_ros.training.data import AUX_SCALE_M, DemoDataset, load_demos

ACCEPT_RADII = (0, 2, 9)


class Trainer:
    def __init__(self, cfg: TrainConfig, data: DemoDataset, init: Policy | None = None) -> None:
        self.cfg = cfg
        self.data = data
        self.device = torch.device(cfg.device)
        self.train_idx, self.val_idx = data.split(cfg.val_fraction)
        if init is not None:  # fine-tune: architecture, tokenizer and proprio statistics all come from it
            self.policy = init
            self.tokenizer = init.tokenizer
            if init.config.image_size != data.image_size or init.config.max_text_len != data.text.shape[1]:
                raise ValueError(f"--init {cfg.init}: its image size / text length differ from the data's")
        else:
            self.tokenizer = ActionTokenizer.from_actions(data.actions[self.train_idx].numpy())
            proprio = data.proprio[self.train_idx]
            std = proprio.std(dim=0).clamp_min(1e-3)  # the gripper can be constant over a small set
            config = VLAConfig(
                image_size=data.image_size, patch_size=cfg.patch_size, d_model=cfg.d_model, n_heads=cfg.n_heads,
                n_layers=cfg.n_layers, vision_layers=cfg.vision_layers, max_text_len=data.text.shape[1],
                local_channels=cfg.local_channels, keypoints=cfg.keypoints, text_layers=cfg.text_layers,
            )
            self.policy = Policy.create(config, self.tokenizer, proprio.mean(dim=0).numpy(), std.numpy(), cfg.seed)
        self.tokens = torch.from_numpy(self.tokenizer.encode(data.actions.numpy()))
        self.policy.to(self.device)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.history: dict[str, list[float]] = {"bc": [], "bc_val": [], "draft": [], "contact": []}

    def batch(self, idx: torch.Tensor, augment: bool) -> dict[str, torch.Tensor]:
        images = self.data.images[idx]
        keypoints = self.data.keypoint_targets[idx]
        if augment:
            images, moved = random_shift(images, self.cfg.augment_shift, self.generator)
            keypoints = keypoints + (moved * (2.0 / images.shape[1]))[:, None, :]  # labels move with the image
        batch = {
            "images": images,
            "text": self.data.text[idx],
            "proprio": self.data.proprio[idx],
            "tokens": self.tokens[idx],
            "contact": self.data.near_contact[idx].float(),
            "aux": self.data.aux[idx],
            "keypoints": keypoints,
        }
        return {k: v.to(self.device) for k, v in batch.items()}

    def batches(self, idx: torch.Tensor, batch_size: int, shuffle: bool) -> list[torch.Tensor]:
        order = idx[torch.randperm(len(idx), generator=self.generator)] if shuffle else idx
        return list(order.split(batch_size))

    # --- phase 1: behaviour cloning -----------------------------------------------------------
    def bc_loss(self, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        proprio = self.policy.normalise_proprio(b["proprio"])
        bias = self.policy.world_bias(b["images"])  # the world-aware prefill's bias, when the policy has one
        logits, aux, keypoints = self.policy.target.forward_with_aux(b["images"], b["text"], proprio, b["tokens"], bias)
        loss = F.cross_entropy(logits.reshape(-1, N_BINS), b["tokens"].reshape(-1))
        known = torch.isfinite(b["aux"])
        if self.cfg.aux_weight > 0 and known.any():
            loss = loss + self.cfg.aux_weight * F.smooth_l1_loss(aux[known], b["aux"][known])
        if keypoints is not None and self.cfg.keypoint_weight > 0:
            # keypoint 0 goes where the camera sees the named cube, keypoint 1 the TCP: grounding
            # the instruction in the image directly, not through the action loss alone
            want = b["keypoints"]
            known = torch.isfinite(want)
            if known.any():
                got = keypoints[:, : want.shape[1]]
                scale = KEYPOINT_LOSS_SCALE
                loss = loss + self.cfg.keypoint_weight * F.smooth_l1_loss(got[known] * scale, want[known] * scale)
        return loss, logits.argmax(-1)

    def train_target(self) -> None:
        cfg, target = self.cfg, self.policy.target
        if cfg.epochs == 0:
            return
        optimizer = torch.optim.AdamW(target.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        total = cfg.epochs * math.ceil(len(self.train_idx) / cfg.batch_size)
        warmup = min(cfg.warmup_steps, total // 5)
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_schedule(s, total, warmup))
        for epoch in range(cfg.epochs):
            target.train()
            bar = progress_bar(self.batches(self.train_idx, cfg.batch_size, True),
                               desc=f"target {epoch + 1}/{cfg.epochs}", disable=not cfg.progress, dynamic_ncols=True)
            for idx in bar:
                loss, _ = self.bc_loss(self.batch(idx, augment=True))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(target.parameters(), cfg.grad_clip)
                optimizer.step()
                sched.step()
                self.history["bc"].append(loss.item())
                bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{sched.get_last_lr()[0]:.1e}")
            if len(self.val_idx):
                val_loss, val_acc = self.eval_teacher_forced()
                self.history["bc_val"].append(val_loss)
                tqdm.write(f"epoch {epoch + 1}: val loss {val_loss:.3f}, teacher-forced token accuracy {val_acc:.3f}")
        target.eval()

    @torch.no_grad()
    def eval_teacher_forced(self) -> tuple[float, float]:
        self.policy.target.eval()
        total_loss, correct, n = 0.0, 0, 0
        for idx in self.batches(self.val_idx, self.cfg.eval_batch_size, False):
            b = self.batch(idx, augment=False)
            loss, pred = self.bc_loss(b)
            total_loss += loss.item() * len(idx)
            correct += int((pred == b["tokens"]).sum())
            n += len(idx)
        return total_loss / n, correct / (n * self.policy.n_action_tokens)

    # --- phase 2: draft head and contact head -------------------------------------------------
    def draft_loss(self, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        policy, target, draft = self.policy, self.policy.target, self.policy.draft
        n_act = policy.n_action_tokens
        rollout = greedy_rollout(policy, b["images"], b["text"], b["proprio"])
        greedy, features, memory = rollout.tokens, rollout.features, rollout.memory
        contact_loss = F.binary_cross_entropy_with_logits(policy.contact_head(rollout.prefix.pooled), b["contact"])
        n_prefix = rollout.prefix.prefix_len

        def step_loss(pred: torch.Tensor, want_tokens: torch.Tensor, want_features: torch.Tensor) -> torch.Tensor:
            return draft_step_loss(target.lm_head, pred, want_tokens, want_features, self.cfg.feature_weight)

        # (a) one step from every start: query j reads the target's feature after j tokens and the
        # KV of the prefix plus those j tokens, exactly what draft_tokens sees after truncation.
        j = torch.arange(n_act - 1, device=self.device)
        mask = rollout.memory_mask(j)
        pred = draft(target.action_emb(greedy[:, :-1]), features[:, :-1], j + 1, memory, mask)
        loss = step_loss(pred, greedy[:, 1:], features[:, 1:])
        # (b) a multi-step unroll on the draft's own features from a random start p.
        p = 0 if torch.rand((), generator=self.generator) < 0.5 else int(
            torch.randint(0, n_act - 1, (), generator=self.generator))
        mem = (memory[0][:, :, : n_prefix + p], memory[1][:, :, : n_prefix + p])
        feature, unroll = features[:, p : p + 1], []
        for i in range(p + 1, n_act):
            index = torch.tensor([i], device=self.device)
            feature = draft(target.action_emb(greedy[:, i - 1 : i]), feature, index, mem)
            unroll.append(step_loss(feature, greedy[:, i : i + 1], features[:, i : i + 1]))
        loss = loss + torch.stack(unroll).mean()
        return loss, contact_loss

    def train_heads(self) -> None:
        cfg, policy = self.cfg, self.policy
        if cfg.draft_epochs == 0:
            return
        policy.target.eval().requires_grad_(False)
        params = [*policy.draft.parameters(), *policy.contact_head.parameters()]
        optimizer = torch.optim.AdamW(params, lr=cfg.draft_lr, weight_decay=cfg.weight_decay)
        total = cfg.draft_epochs * math.ceil(len(self.train_idx) / cfg.batch_size)
        warmup = min(cfg.warmup_steps, total // 5)
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_schedule(s, total, warmup))
        policy.draft.train()
        policy.contact_head.train()
        for epoch in range(cfg.draft_epochs):
            bar = progress_bar(self.batches(self.train_idx, cfg.batch_size, True),
                               desc=f"draft {epoch + 1}/{cfg.draft_epochs}", disable=not cfg.progress,
                               dynamic_ncols=True)
            for idx in bar:
                draft_loss, contact_loss = self.draft_loss(self.batch(idx, augment=False))
                optimizer.zero_grad(set_to_none=True)
                (draft_loss + contact_loss).backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                optimizer.step()
                sched.step()
                self.history["draft"].append(draft_loss.item())
                self.history["contact"].append(contact_loss.item())
                bar.set_postfix(draft=f"{draft_loss.item():.3f}", contact=f"{contact_loss.item():.3f}")
        policy.draft.eval()
        policy.contact_head.eval()
        policy.target.requires_grad_(True)

    # --- phase 3: held-out evaluation ---------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """Metrics on the held-out episodes (closed-form, no sim): see the module docstring."""
        policy, idx_all = self.policy, self.val_idx
        if len(idx_all) == 0:
            return {"val_samples": 0}
        n_act = policy.n_action_tokens
        sums: dict[str, torch.Tensor] = {}

        def add(name: str, value: torch.Tensor) -> None:
            sums[name] = sums.get(name, 0) + value.double().sum(dim=0)

        contact_logits, contact_labels, aux_errors, keypoint_errors = [], [], [], []
        for idx in self.batches(idx_all, self.cfg.eval_batch_size, False):
            b = self.batch(idx, augment=False)
            prefix = policy.prefill_tensors(b["images"], b["text"], b["proprio"]).prefix
            with torch.inference_mode():  # the aux head reads the hidden state at BOS
                aux_error = (policy.target.aux_head(prefix.hidden_last) - b["aux"]).view(-1, 2, 3).norm(dim=-1)
                if policy.config.keypoints:
                    target = policy.target
                    local = target.encode_patches(target.patchify(b["images"]), b["text"])
                    got = target.keypoint_positions(local)[:, :2]
                    keypoint_errors.append((got - b["keypoints"]).norm(dim=-1) * (policy.config.image_size / 2.0))
            aux_errors.append(aux_error * AUX_SCALE_M * 100.0)  # cm: (cube - TCP, TCP)
            greedy = policy.greedy_decode(prefix)
            expert = b["tokens"]
            add("target_exact", (greedy == expert).float())
            add("target_within2", ((greedy - expert).abs() <= 2).float())
            add("target_abs_bins", (greedy - expert).abs().float())
            draft, _ = policy.draft_tokens(prefix, n_act, None)
            add("draft_exact", (draft == greedy).float())
            add("draft_within2", ((draft - greedy).abs() <= 2).float())
            # one speculative round from BOS: the target verifies the whole draft in one pass
            verify = policy.score(prefix, draft).logits[:, :n_act].argmax(-1)
            for r in ACCEPT_RADII:
                accepted = ((draft - verify).abs() <= r).long().cumprod(dim=1).sum(dim=1, keepdim=True)
                add(f"accept_len_r{r}", accepted.float())
            contact_logits.append(policy.contact_logits(prefix))
            contact_labels.append(b["contact"])
        n = len(idx_all)
        per_dim = {k: (v / n).tolist() for k, v in sums.items()}
        logits, labels = torch.cat(contact_logits), torch.cat(contact_labels)
        metrics: dict[str, Any] = {
            "val_episodes": int(self.data.episode[idx_all].unique().numel()),
            "val_samples": n,
            "target_token_acc": float(np.mean(per_dim["target_exact"])),
            "target_token_acc_within2": float(np.mean(per_dim["target_within2"])),
            "target_mean_abs_bin_error": float(np.mean(per_dim["target_abs_bins"])),
            "target_token_acc_per_dim": per_dim["target_exact"],
            # position 0 of a draft is the target's own greedy token, so agreement is also
            # reported over the positions the draft head actually predicts (1..6)
            "draft_agreement": float(np.mean(per_dim["draft_exact"])),
            "draft_agreement_pos1_6": float(np.mean(per_dim["draft_exact"][1:])),
            "draft_agreement_within2": float(np.mean(per_dim["draft_within2"])),
            "draft_agreement_within2_pos1_6": float(np.mean(per_dim["draft_within2"][1:])),
            "draft_agreement_per_pos": per_dim["draft_exact"],
            "contact_bce": float(F.binary_cross_entropy_with_logits(logits, labels)),
            "contact_acc": float(((logits > 0).float() == labels).float().mean()),
            "contact_positive_rate": float(labels.mean()),
        }
        aux_cm = torch.cat(aux_errors)
        if torch.isfinite(aux_cm).all():  # how well the prefix locates the named cube and the TCP
            metrics["cube_from_tcp_error_cm"] = float(aux_cm[:, 0].mean())
            metrics["tcp_error_cm"] = float(aux_cm[:, 1].mean())
        keypoint_px = torch.cat(keypoint_errors) if keypoint_errors else torch.zeros(0, 2)
        if len(keypoint_px) and torch.isfinite(keypoint_px).all():  # image pixels, grounding at a glance
            metrics["cube_keypoint_error_px"] = float(keypoint_px[:, 0].median())
            metrics["tcp_keypoint_error_px"] = float(keypoint_px[:, 1].median())
        for r in ACCEPT_RADII:
            metrics[f"accept_len_r{r}"] = per_dim[f"accept_len_r{r}"][0]
        if self.history["bc_val"]:
            metrics["target_val_loss"] = self.history["bc_val"][-1]
        return metrics


def plot_losses(history: dict[str, list[float]], path: Path) -> None:
    def draw(ax: Any, key: str) -> None:
        held_out = None
        if key == "bc" and history["bc_val"]:  # one held-out loss per epoch, at the epoch's last step
            steps_per_epoch = max(1, len(history["bc"]) // len(history["bc_val"]))
            held_out = (steps_per_epoch * np.arange(1, len(history["bc_val"]) + 1) - 1, history["bc_val"])
        plot_loss_curve(ax, history[key], held_out)

    panels = (("target (BC cross-entropy)", "bc"), ("draft head", "draft"), ("contact head (BCE)", "contact"))
    plot_loss_panels(path, panels, (15, 4), draw)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run all phases and write the checkpoint to ``cfg.out``; returns the held-out metrics."""
    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    init = load_checkpoint(cfg.init) if cfg.init else None
    max_text_len = init.config.max_text_len if init is not None else cfg.max_text_len
    data = load_demos(cfg.data, max_text_len, cfg.max_episodes, not cfg.include_failures, cfg.progress)
    trainer = Trainer(cfg, data, init)
    print(
        f"{data.n_episodes} episodes, {len(data)} steps ({len(trainer.train_idx)} train / {len(trainer.val_idx)} "
        f"held-out); parameters {trainer.policy.n_parameters()}"
    )
    trainer.train_target()
    trainer.train_heads()
    metrics = trainer.evaluate()
    metrics["train_seconds"] = round(time.perf_counter() - start, 2)
    out = Path(cfg.out)
    recipe = {
        **{k: v for k, v in asdict(cfg).items() if k not in ("progress", "out")},
        "data": str(Path(cfg.data).resolve()),
        "n_episodes": data.n_episodes,
        "n_train_samples": len(trainer.train_idx),
        "n_val_samples": len(trainer.val_idx),
        "optimizer": "AdamW",
        "schedule": "linear warm-up + cosine to 10%",
        "command": cfg.command(),
    }
    save_checkpoint(trainer.policy, out, recipe, metrics, dtype=cfg.save_dtype, robot=demo_robot(data.image_size))
    plot_losses(trainer.history, out / "loss_curves.png")
    (out / "loss_history.json").write_text(json.dumps(trainer.history))
    report = {k: v for k, v in metrics.items() if not isinstance(v, list)}
    print("held-out metrics:\n" + "\n".join(f"  {k}: {v:.4f}" if isinstance(v, float) else f"  {k}: {v}"
                                            for k, v in report.items()))
    print(f"checkpoint written to {out} (loss plot loss_curves.png)")
    return metrics


