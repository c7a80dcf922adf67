"""What incremental vision's approximation costs, frame by frame (``vla-accel vision-fidelity``).

The policy drives the sim through the node's runner (:class:`~vla_accel_ros.runtime.runner.PolicyRunner`)
with the full prefill and greedy AR tokens (:func:`driver_config`). At every frame the same image
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

from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_accel_ros.decoding.specs import BASELINE
from vla_accel_ros.models import Policy
from vla_accel_ros.models.api import IncrementalPrefill
from vla_accel_ros.runtime.builder import RunnerConfig
from vla_accel_ros.runtime.runner import PolicyRunner
from vla_accel_ros.sim.env import PickCubeEnv

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
            by_age[int(age)] = {"frames": int(at.sum()),
                                "action_agreement": float(np.all(dist[at] == 0, axis=1).mean()),
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


def driver_config(env: PickCubeEnv, max_steps: int, threads: int = 1) -> RunnerConfig:
    """The runner that drives the episodes: greedy AR on the full prefill, so that the comparison is
    about the prefill alone."""
    return RunnerConfig(decoder=BASELINE, temperature=0.0, vision=None, action_dt_s=env.control_dt,
                        period_s=env.control_dt, max_steps=max_steps, torch_threads=threads)


def run_episode(env: PickCubeEnv, driver: PolicyRunner, encoders: dict[str, IncrementalPrefill],
                records: dict[str, FidelityRecord], seed: int) -> bool:
    """One episode driven by ``driver`` (:func:`driver_config`); every frame also goes through each
    encoder, and each encoder's greedy action is set against the full prefill's."""
    policy = driver.policy
    obs = env.reset(seed)
    driver.start_episode(seed)
    since = {mode: 0 for mode in encoders}
    for encoder in encoders.values():
        encoder.reset()
    while not env.done:
        driven = driver(obs)
        full_tokens = np.asarray(driven.tokens)  # greedy AR on the full prefill: the reference action
        with torch.inference_mode():
            full = policy.prefill(obs)  # the reference hidden state (the runner keeps no prefix)
            for mode, encoder in encoders.items():
                prefix = encoder.prefill_batch([obs]).prefix
                assert encoder.last is not None
                since[mode] = 0 if encoder.last.refreshed else since[mode] + 1
                records[mode].add(greedy_tokens(policy, prefix), full_tokens, prefix.hidden_last, full.hidden_last,
                                  since[mode], encoder.last.fraction)
        obs, _ = env.step(driven.action)
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
