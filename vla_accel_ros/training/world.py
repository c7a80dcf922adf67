"""Training of the world-aware prefill (WA-SpecDec) on a trained checkpoint (``vla-accel train-world``).

Three phases on one in-memory copy of the demonstrations (see :mod:`vla_accel_ros.models.own.world`):

a. the frame autoencoder, by L2 reconstruction of the demo frames; then it is frozen;
b. the world-bias module, by dense next-frame prediction on the frozen latents of consecutive
   frames of the same episode (the latents are computed once, so this phase costs seconds); with
   ``--scene-weight``, a scene probe must also read from the bias alone whether the step is near
   contact and where the named cube and the TCP are (:class:`SceneProbe`, not saved);
c. the base checkpoint's target, then its draft and contact heads, fine-tuned with the bias added
   to the patch tokens (the same training functions as ``vla-accel train --init``), so the target
   and the draft both work from the world-aware prefill.

OUT becomes a complete checkpoint (``model.*`` + ``world.*``); the base directory is never
written. A continuous action head of the base (``flow_head.*``) is not carried over: it was trained
on the base's prefix features, which the bias changes (run ``vla-accel train-flow`` on OUT).

Metrics in ``world.json``: held-out reconstruction error (``ae_val_mse``, ``ae_val_psnr_db``);
next-frame latent error of the bias module (``next_val_mse``) against copying the current latent
(``next_val_mse_persistence``) and against the same head with the bias zeroed
(``next_val_mse_bias_zeroed``); the bias's size relative to the patch tokens (``bias_rms_ratio``);
and the held-out target/draft metrics of ``vla-accel train`` before (``base``) and after
(``finetuned``) the fine-tune.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.own.checkpoint import load_checkpoint, save_checkpoint
from vla_accel_ros.models.own.policy import Policy
from vla_accel_ros.models.own.world import FrameAutoencoder, WorldBias, WorldPrefill
from vla_accel_ros.training.common import (
    component_recipe,
    cosine_schedule,
    demo_robot,
    optimise_epochs,
    plot_loss_curve,
    plot_loss_panels,
    seed_everything,
)
from vla_accel_ros.training.configs import WorldTrainConfig
from vla_accel_ros.training.data import AUX_SCALE_M, load_demos
from vla_accel_ros.training.target import TrainConfig, Trainer, plot_losses

CHECKPOINT_LIMIT_MB = 15.0


def _optimise(params: list[torch.nn.Parameter], batch_loss: Callable[[torch.Tensor], torch.Tensor], n: int,
              epochs: int, lr: float, batch_size: int, generator: torch.Generator, desc: str,
              progress: bool) -> list[float]:
    """AdamW, linear warm-up + cosine, ``epochs`` shuffled passes over ``n`` samples;
    ``batch_loss(indices)`` gives a batch's loss. Returns the per-step losses."""
    if epochs == 0 or n == 0:
        return []
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    total = epochs * math.ceil(n / batch_size)
    warmup = min(50, total // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_schedule(s, total, warmup))
    with progress_bar(total=total, desc=desc, disable=not progress, dynamic_ncols=True) as bar:
        return optimise_epochs(optimizer, schedule, batch_loss, n, epochs, batch_size, generator, bar, clip=params)


# --- phase (a): the frame autoencoder ---------------------------------------------------------
def train_autoencoder(ae: FrameAutoencoder, images: torch.Tensor, train_idx: torch.Tensor, epochs: int, lr: float,
                      batch_size: int, generator: torch.Generator, latent_l2: float = 1e-3,
                      progress: bool = True) -> list[float]:
    """L2 reconstruction on the uint8 frames ``images[train_idx]`` (N, H, W, 3); leaves the
    autoencoder frozen in eval mode."""
    ae.train().requires_grad_(True)
    history = _optimise(list(ae.parameters()), lambda i: ae.loss(images[train_idx[i]], latent_l2), len(train_idx),
                        epochs, lr, batch_size, generator, "autoencoder", progress)
    ae.eval().requires_grad_(False)
    return history


@torch.no_grad()
def reconstruction_metrics(ae: FrameAutoencoder, images: torch.Tensor, batch_size: int = 256) -> dict[str, float]:
    """Mean squared error (pixels on the [-1, 1] scale) and PSNR of reconstructing ``images``."""
    if len(images) == 0:
        return {}
    total = sum(float(ae.reconstruction_loss(images[i : i + batch_size])) * len(images[i : i + batch_size])
                for i in range(0, len(images), batch_size))
    mse = total / len(images)
    return {"ae_val_mse": mse, "ae_val_psnr_db": 10.0 * math.log10(4.0 / max(mse, 1e-12))}


@torch.no_grad()
def encode_frames(ae: FrameAutoencoder, images: torch.Tensor, batch_size: int = 256,
                  progress: bool = True) -> torch.Tensor:
    """Latent maps (N, C, g, g) of all frames, with the frozen encoder."""
    chunks = range(0, len(images), batch_size)
    return torch.cat([ae.encode(images[i : i + batch_size])
                      for i in progress_bar(chunks, desc="latents", unit="batch", disable=not progress)])


def next_frame_pairs(episode: torch.Tensor, keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (t, t + 1) of consecutive steps of the same episode; with ``keep`` (step indices),
    only pairs whose both steps are kept."""
    t = torch.nonzero(episode[1:] == episode[:-1]).squeeze(1)
    if keep is not None:
        kept = torch.zeros(len(episode), dtype=torch.bool)
        kept[keep] = True
        t = t[kept[t] & kept[t + 1]]
    return t, t + 1


# --- phase (b): the world bias ----------------------------------------------------------------
class SceneProbe(nn.Module):
    """Training aid of phase (b), never saved: from the bias alone (attention-pooled over the
    patches), whether the step is near contact and where the named cube and the TCP are (the
    demos' auxiliary targets: cube minus TCP, and TCP). Its loss makes the bias carry what predicts
    contact and clearance, on top of the next frame."""

    def __init__(self, d_model: int, aux_dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(d_model, 1)
        self.out = nn.Linear(d_model, 1 + aux_dim)

    def forward(self, bias: torch.Tensor) -> torch.Tensor:
        """Bias (B, P, d) -> (B, 1 + aux_dim): the near-contact logit, then the positions."""
        weights = torch.softmax(self.score(bias), dim=1)
        return self.out((weights * bias).sum(1))

    def loss(self, bias: torch.Tensor, contact: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """BCE on the near-contact label plus smooth L1 on the known positions."""
        pred = self(bias)
        loss = F.binary_cross_entropy_with_logits(pred[:, 0], contact.float())
        known = torch.isfinite(aux)
        if known.any():
            loss = loss + F.smooth_l1_loss(pred[:, 1:][known], aux[known])
        return loss


@dataclass
class SceneTargets:
    """What the scene probe reads: per-frame near-contact labels and auxiliary positions, its
    weight in the bias loss, and the probe itself."""

    probe: SceneProbe
    contact: torch.Tensor
    aux: torch.Tensor
    weight: float


def train_bias(bias: WorldBias, latents: torch.Tensor, pairs: tuple[torch.Tensor, torch.Tensor], epochs: int,
               lr: float, batch_size: int, bias_l2: float, generator: torch.Generator,
               progress: bool = True, scene: SceneTargets | None = None) -> list[float]:
    """Dense next-frame prediction: bias + per-cell head from z_t predict z_{t+1}; with ``scene``,
    plus its weight times the scene probe's loss on the same bias."""
    now, nxt = pairs
    params = list(bias.parameters()) + (list(scene.probe.parameters()) if scene else [])

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        frames = now[idx]
        loss, w = bias.next_frame_loss(latents[frames], latents[nxt[idx]], bias_l2)
        if scene is not None:
            loss = loss + scene.weight * scene.probe.loss(w, scene.contact[frames], scene.aux[frames])
        return loss

    bias.train().requires_grad_(True)
    history = _optimise(params, batch_loss, len(now), epochs, lr, batch_size, generator, "world bias", progress)
    bias.eval().requires_grad_(False)
    return history


@torch.no_grad()
def scene_metrics(bias: WorldBias, latents: torch.Tensor, frames: torch.Tensor,
                  scene: SceneTargets) -> dict[str, float]:
    """Held-out read-out of the scene probe from the bias: near-contact accuracy, and the mean
    absolute error of the cube-from-TCP position in centimetres."""
    if len(frames) == 0:
        return {}
    pred = scene.probe(bias(latents[frames]))
    contact = scene.contact[frames].float()
    out = {"scene_val_contact_acc": float(((pred[:, 0] > 0).float() == contact).float().mean()),
           "scene_val_contact_base_rate": float(torch.maximum(contact.mean(), 1 - contact.mean()))}
    aux = scene.aux[frames][:, :3]
    known = torch.isfinite(aux)
    if known.any():
        out["scene_val_cube_from_tcp_mae_cm"] = (float((pred[:, 1:4][known] - aux[known]).abs().mean())
                                                 * AUX_SCALE_M * 100)
    return out


@torch.no_grad()
def next_frame_metrics(bias: WorldBias, latents: torch.Tensor,
                       pairs: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """Held-out next-frame latent errors: the module, copying z_t, and the head with the bias zeroed
    (how much of the prediction comes through the bias), plus the bias's root mean square."""
    now, nxt = pairs
    if len(now) == 0:
        return {}
    z, z_next = latents[now], latents[nxt]
    w = bias(z)
    mse = lambda a, b: float((a - b).pow(2).mean())  # noqa: E731
    return {
        "next_val_pairs": int(len(now)),
        "next_val_mse": mse(bias.next_latent(w, z), z_next),
        "next_val_mse_persistence": mse(z, z_next),
        "next_val_mse_bias_zeroed": mse(bias.next_latent(torch.zeros_like(w), z), z_next),
        "bias_rms": float(w.pow(2).mean().sqrt()),
    }


@torch.no_grad()
def token_rms(policy: Policy, images: torch.Tensor, text: torch.Tensor) -> float:
    """Root mean square of the target's (unbiased) patch tokens, the scale the bias is added to."""
    local = policy.target.encode_patches(policy.target.patchify(images), text)[..., : policy.config.d_model]
    return float(local.pow(2).mean().sqrt())


# --- plots ------------------------------------------------------------------------------------
def plot_world_losses(history: dict[str, list[float]], path: Path) -> None:
    panels = (("autoencoder (L2 reconstruction)", "autoencoder"), ("world bias (next-frame latent)", "bias"),
              ("target fine-tune (BC)", "bc"), ("draft head", "draft"))
    plot_loss_panels(path, panels, (18, 4), lambda ax, key: plot_loss_curve(ax, history.get(key, [])))


# --- the command ------------------------------------------------------------------------------
def train_world(cfg: WorldTrainConfig) -> dict[str, Any]:
    """All three phases; writes the checkpoint with its world component to ``cfg.out``."""
    start = time.perf_counter()
    if Path(cfg.out).resolve() == Path(cfg.checkpoint).resolve():
        raise ValueError("--out must differ from --checkpoint: the base checkpoint is never overwritten")
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    policy = load_checkpoint(cfg.checkpoint)
    if policy.world is not None:
        print(f"{cfg.checkpoint} already has a world component: it is replaced by a new one")
        policy.world = None
    data = load_demos(cfg.data, policy.config.max_text_len, cfg.max_episodes, progress=cfg.progress)
    if data.image_size != policy.config.image_size:
        raise ValueError(f"demo images are {data.image_size}px, the checkpoint expects {policy.config.image_size}px")
    train_idx, val_idx = data.split(cfg.val_fraction)
    print(f"{data.n_episodes} episodes, {len(data)} frames ({len(train_idx)} train / {len(val_idx)} held-out)")
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    world = WorldPrefill.for_target(policy.config, cfg.latent_channels, cfg.width, cfg.hidden,
                                    head_hidden=cfg.head_hidden)
    history: dict[str, list[float]] = {}

    # (a) autoencoder, then frozen
    history["autoencoder"] = train_autoencoder(world.autoencoder, data.images, train_idx, cfg.ae_epochs, cfg.lr,
                                               cfg.batch_size, generator, cfg.latent_l2, cfg.progress)
    metrics: dict[str, Any] = reconstruction_metrics(world.autoencoder, data.images[val_idx])
    # (b) world bias on the frozen latents of consecutive frames
    latents = encode_frames(world.autoencoder, data.images, progress=cfg.progress)
    scene = None
    if cfg.scene_weight > 0:
        scene = SceneTargets(SceneProbe(policy.config.d_model, data.aux.shape[1]), data.near_contact, data.aux,
                             cfg.scene_weight)
    history["bias"] = train_bias(world.bias, latents, next_frame_pairs(data.episode, train_idx), cfg.bias_epochs,
                                 cfg.lr, max(cfg.batch_size, 256), cfg.bias_l2, generator, cfg.progress,
                                 scene)  # tiny inputs: big batches
    held_out_pairs = next_frame_pairs(data.episode, val_idx)
    metrics.update(next_frame_metrics(world.bias, latents, held_out_pairs))
    if scene is not None:
        metrics.update(scene_metrics(world.bias, latents, held_out_pairs[0], scene))
    sample = (val_idx if len(val_idx) else train_idx)[:256]
    rms = token_rms(policy, data.images[sample], data.text[sample])
    metrics["patch_token_rms"] = rms
    if "bias_rms" in metrics:
        metrics["bias_rms_ratio"] = metrics["bias_rms"] / max(rms, 1e-12)
    del latents

    # (c) the target, then the draft and contact heads, on the biased embeddings
    tcfg = TrainConfig(data=cfg.data, out=cfg.out, epochs=cfg.finetune_epochs, draft_epochs=cfg.draft_epochs,
                       batch_size=cfg.batch_size, lr=cfg.finetune_lr, draft_lr=cfg.finetune_lr, augment_shift=0,
                       seed=cfg.seed, max_episodes=cfg.max_episodes, val_fraction=cfg.val_fraction,
                       init=cfg.checkpoint, threads=cfg.threads, progress=cfg.progress)
    trainer = Trainer(tcfg, data, init=policy)
    metrics["base"] = trainer.evaluate()  # the base checkpoint, no world bias, on the same held-out steps
    policy.world = world
    trainer.train_target()
    trainer.train_heads()
    finetuned = trainer.evaluate()
    history.update(trainer.history)
    metrics["finetuned"] = finetuned
    metrics["train_seconds"] = round(time.perf_counter() - start, 2)

    out = Path(cfg.out)
    recipe = {
        **component_recipe(cfg, data, len(train_idx), len(val_idx), unit="frames"),
        "autoencoder": "plain convolutional autoencoder, L2 reconstruction + latent_l2, frozen after phase (a)",
        "bias_objective": "next-frame latent MSE (per-cell head on [bias, latent]) + bias_l2 * mean(bias^2)"
                          + (" + scene_weight * scene probe (near-contact BCE + cube/TCP smooth L1 "
                             "from the pooled bias)"
                             if cfg.scene_weight > 0 else ""),
        "optimizer": "AdamW, linear warm-up + cosine to 10%",
        "command": cfg.command(),
    }
    world.info = {"recipe": recipe, "metrics": metrics}
    model_recipe = {**policy.info.get("recipe", {}), "world_finetune": recipe, "command": cfg.command()}
    save_checkpoint(policy, out, model_recipe, finetuned, robot=demo_robot(data.image_size))
    plot_world_losses(history, out / "world_loss.png")
    plot_losses(trainer.history, out / "loss_curves.png")
    (out / "loss_history.json").write_text(json.dumps(history))
    size_mb = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6
    if size_mb > CHECKPOINT_LIMIT_MB:
        print(f"warning: {out} holds {size_mb:.1f} MB, over the {CHECKPOINT_LIMIT_MB:.0f} MB checkpoint budget")
    report = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    report.update({f"{k} (base -> finetuned)": f"{metrics['base'].get(k, float('nan')):.4f} -> {finetuned[k]:.4f}"
                   for k in ("target_token_acc", "draft_agreement_pos1_6", "accept_len_r9") if k in finetuned})
    print("world-aware prefill metrics:\n" + "\n".join(
        f"  {k}: {v:.4f}" if isinstance(v, float) else f"  {k}: {v}" for k, v in report.items()))
    print(f"checkpoint with world component written to {out} ({size_mb:.1f} MB; loss plots world_loss.png, "
          "loss_curves.png)")
    return metrics


