"""``vla-accel vision-fidelity``: what incremental vision's approximation costs, frame by frame.

The policy drives the sim with the full prefill and greedy tokens. At every frame the same image
also goes through both incremental encoders: ``iv`` re-encodes only the dynamic patches, and
``ivkv`` also reuses the keys and values of unchanged prefix tokens. Each is then compared with
the full prefill of that frame:
- action agreement: the greedy 7-token action from its prefix equals the full prefix's one;
- token distance: mean and max |token - full token| over the 7 tokens;
- the hidden state at BOS, relative to the full one: ||h - h_full|| / ||h_full||.
Errors are also grouped by frames since the encoder's last full refresh, because the cached
tokens drift between refreshes.

Outputs in DIR: ``summary.json`` (per mode: ``action_agreement``, ``token_agreement``,
``token_within_2``, ``mean_token_distance``, ``max_token_distance``, ``hidden_rel_error_p50``,
``hidden_rel_error_p99``, ``recomputed_fraction``, and ``by_frames_since_refresh``) and
``fidelity.png``. Greedy tokens keep the comparison about the prefill alone.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vla_accel_ros.evaluate import add_episode_arguments, add_vision_reuse_arguments, vision_config
from vla_accel_ros.models import Policy, load_checkpoint
from vla_accel_ros.resources import default_checkpoint
from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
from vla_accel_ros.vision_reuse import IncrementalVisionEncoder

MODES = {"iv": False, "ivkv": True}  # mode -> reuse_kv


class FidelityRecord:
    """Per-frame comparisons of one incremental mode with the full prefill."""

    def __init__(self) -> None:
        self.token_distance: list[np.ndarray] = []  # (7,) |tokens - full tokens| per frame
        self.hidden_rel_error: list[float] = []
        self.since_refresh: list[int] = []  # frames since the encoder's last full refresh (0 = refreshed now)
        self.recomputed: list[float] = []

    def add(self, tokens: np.ndarray, full_tokens: np.ndarray, hidden: torch.Tensor, full_hidden: torch.Tensor,
            since_refresh: int, recomputed: float) -> None:
        self.token_distance.append(np.abs(tokens.astype(np.int64) - full_tokens.astype(np.int64)))
        self.hidden_rel_error.append(float(torch.linalg.vector_norm(hidden - full_hidden)
                                           / torch.linalg.vector_norm(full_hidden).clamp_min(1e-12)))
        self.since_refresh.append(since_refresh)
        self.recomputed.append(recomputed)

    def summary(self) -> dict[str, Any]:
        dist = np.array(self.token_distance)
        err = np.array(self.hidden_rel_error)
        since = np.array(self.since_refresh)
        by_age = {}
        for age in np.unique(since):
            at = since == age
            by_age[int(age)] = {"frames": int(at.sum()), "action_agreement": float(np.all(dist[at] == 0, axis=1).mean()),
                                "hidden_rel_error_mean": float(err[at].mean())}
        return {
            "frames": len(err),
            "action_agreement": float(np.all(dist == 0, axis=1).mean()),
            "token_agreement": float((dist == 0).mean()),
            "token_within_2": float((dist <= 2).mean()),
            "mean_token_distance": float(dist.mean()),
            "max_token_distance": int(dist.max()),
            "hidden_rel_error_p50": float(np.percentile(err, 50)),
            "hidden_rel_error_p99": float(np.percentile(err, 99)),
            "recomputed_fraction": float(np.mean(self.recomputed)),
            "by_frames_since_refresh": by_age,
        }


def greedy_tokens(policy: Policy, prefix: Any) -> np.ndarray:
    return policy.greedy_decode(prefix)[0].cpu().numpy()


def run_episode(env: PickCubeEnv, policy: Policy, encoders: dict[str, IncrementalVisionEncoder],
                records: dict[str, FidelityRecord], seed: int) -> bool:
    """One episode driven by the full prefill; every frame also goes through each encoder."""
    obs = env.reset(seed)
    since = {mode: 0 for mode in encoders}
    for encoder in encoders.values():
        encoder.reset()
    while not env.done:
        with torch.inference_mode():
            full = policy.prefill(obs)
            full_tokens = greedy_tokens(policy, full)
            for mode, encoder in encoders.items():
                prefix = encoder.prefill(obs)
                assert encoder.last is not None
                since[mode] = 0 if encoder.last.refreshed else since[mode] + 1
                records[mode].add(greedy_tokens(policy, prefix), full_tokens, prefix.hidden_last, full.hidden_last,
                                  since[mode], encoder.last.fraction)
        obs, _ = env.step(policy.tokens_to_action(full_tokens))
    return bool(env.success())


def plot_fidelity(summaries: dict[str, dict[str, Any]], out: Path) -> None:
    """Action agreement and hidden-state error against frames since the last refresh."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("action_agreement", "greedy action equal to the full prefill's"),
              ("hidden_rel_error_mean", "||h_BOS - full|| / ||full||"))
    fig, axes = plt.subplots(1, len(panels), figsize=(10, 4))
    for ax, (key, ylabel) in zip(axes, panels):
        for mode, summary in summaries.items():
            by_age = summary["by_frames_since_refresh"]
            ages = sorted(by_age, key=int)
            ax.plot([int(a) for a in ages], [by_age[a][key] for a in ages], "o-", ms=3, label=mode)
        ax.set(xlabel="frames since the last full refresh", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylim(-0.03, 1.03)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_episode_arguments(parser, episodes=10, episodes_help="episodes, driven by the full prefill")
    add_vision_reuse_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        raise SystemExit(f"--episodes must be >= 1, got {args.episodes}")
    torch.set_num_threads(args.threads)
    ckpt = args.checkpoint or default_checkpoint()
    policy = load_checkpoint(ckpt)
    if getattr(policy, "world", None) is not None:
        raise SystemExit(f"{ckpt} has a world-aware prefill, which incremental vision with reused keys/values does not support")
    encoders = {mode: IncrementalVisionEncoder(policy, vision_config(args, reuse_kv)) for mode, reuse_kv in MODES.items()}
    records = {mode: FidelityRecord() for mode in MODES}
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    successes = []
    with PickCubeEnv(SimConfig(image_size=policy.config.image_size, max_steps=args.max_steps)) as env:
        for i in tqdm(range(args.episodes), desc="vision-fidelity", unit="ep"):
            successes.append(run_episode(env, policy, encoders, records, args.seed + i))
    summaries = {mode: record.summary() for mode, record in records.items()}
    config = encoders["ivkv"].config
    meta = {"seed": args.seed, "episodes": args.episodes, "checkpoint": str(ckpt), "threshold": config.threshold,
            "refresh_steps": config.refresh_steps, "max_drift": config.max_drift,
            "driver_success_rate": float(np.mean(successes)), "wall_s": time.perf_counter() - start}
    (args.out / "summary.json").write_text(json.dumps({**summaries, "meta": meta}, indent=2))
    plot_fidelity(summaries, args.out / "fidelity.png")
    for mode, s in summaries.items():
        print(f"{mode}: greedy action equal to full {s['action_agreement']:.1%}, tokens equal {s['token_agreement']:.1%} "
              f"(within 2: {s['token_within_2']:.1%}, max distance {s['max_token_distance']}), hidden error p50 "
              f"{s['hidden_rel_error_p50']:.2e} / p99 {s['hidden_rel_error_p99']:.2e}, "
              f"{s['recomputed_fraction']:.0%} of patches re-encoded")
    print(f"vision-fidelity: {sum(len(r.hidden_rel_error) for r in records.values()) // len(records)} frames of "
          f"{args.episodes} episodes in {meta['wall_s']:.0f} s -> {args.out}")
    return 0
