"""Closed-loop episodes of the policy in the MuJoCo sim, and their metrics (what ``vla-accel eval`` runs).

Each control step: the node's own runner (:class:`~vla_accel_ros.runtime.runner.PolicyRunner`)
prefills the newest observation and decodes one action, and the sim executes it through the same IK
path the node uses. Episodes use held-out seeds (from 100000 up; demonstrations for training use
seeds below that).

Outputs ``DIR/summary.json`` (``episodes``, ``success_rate``, ``ncf_rate``, ``ncf_share``,
``target_passes_per_action``, ``mean_accepted_len``, ``latency_ms`` {``prefill_p50``,
``prefill_mean``, ``decode_p50``, ``total_p50``, ``total_p99``, ``total_mean``, ``wall_p50``, ``wall_p99``: the runner
call as a whole}, ``policy_tick_share`` (steps whose action came from the policy: every step here
waits for the runner, unlike the node, whose actions expire after ``action_timeout_s``),
``episodes_without_policy_steps`` (their seeds), ``params``, ``checkpoint_mb``, ``peak_rss_mb``, …;
heisd adds ``retrieval_mode_share``, ``verify_skip_share``, ``retrieval_accept_rate``,
``retrieval_query_ms_p50``), ``DIR/latency.png`` (per-step latency) and a one-line summary on stdout.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.decoding.heisd import MODES as HEISD_MODES
from vla_accel_ros.decoding.protocol import N_ACTION_TOKENS, PREFILL_VERIFIED
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.runtime.runner import PolicyRunner
from vla_accel_ros.sim.env import NEAR_CONTACT_DISTANCE, PickCubeEnv


@dataclass
class EpisodeRecord:
    """Everything measured in one closed-loop episode."""

    seed: int
    decoder: str
    success: bool = False
    steps: int = 0
    policy_steps: int = 0  # steps whose action came from the policy (the runner)
    min_clearance: float = float("inf")
    prefill_ms: list[float] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)  # the runner call as its caller sees it (history included)
    target_passes: list[int] = field(default_factory=list)
    draft_passes: list[int] = field(default_factory=list)
    vision_fraction: list[float] = field(default_factory=list)
    head_ms: list[float] = field(default_factory=list)  # continuous action heads: the sampler alone
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    thresholds: list[float] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)  # DecodeResult.mode per step ("" for single-path decoders)
    retrieval_query_ms: list[float] = field(default_factory=list)  # heisd: retrieval store query times

    @property
    def near_contact_failure(self) -> bool:
        return not self.success and self.min_clearance < NEAR_CONTACT_DISTANCE


def run_episode(env: PickCubeEnv, runner: PolicyRunner, seed: int, scene_clearance: bool = True) -> EpisodeRecord:
    """One closed-loop episode of ``runner`` on the sim's episode ``seed`` (which also keys the
    sampling noise). ``scene_clearance`` gives decoders the sim's gripper-to-target clearance
    (world-aware acceptance); without it they fall back to the policy's contact head."""
    record = EpisodeRecord(seed=seed, decoder=runner.decoder_name)
    obs = env.reset(seed)
    runner.start_episode(seed)
    while not env.done:
        clearance = env.target_clearance()
        record.min_clearance = min(record.min_clearance, clearance)
        started = time.perf_counter()
        result = runner(obs, target_clearance=clearance if scene_clearance else None)
        record.wall_ms.append((time.perf_counter() - started) * 1e3)
        obs, _ = env.step(result.action)
        record.policy_steps += 1
        record.prefill_ms.append(result.timings["prefill"])
        record.decode_ms.append(result.timings["decode"])
        record.total_ms.append(result.timings["total"])
        record.target_passes.append(result.target_passes)
        record.draft_passes.append(result.draft_passes)
        record.vision_fraction.append(result.vision_fraction)
        if "head" in result.timings:
            record.head_ms.append(result.timings["head"])
        record.accepted.append(result.accepted_len)
        record.drafted.append(result.drafted)
        record.thresholds.append(float("nan") if result.threshold is None else float(result.threshold))
        record.modes.append(result.mode)
        if "retrieval_query" in result.timings:
            record.retrieval_query_ms.append(result.timings["retrieval_query"])
    record.min_clearance = float(min(record.min_clearance, env.target_clearance()))
    record.success = bool(env.success())
    record.steps = env.steps
    return record


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(records: list[EpisodeRecord]) -> dict[str, Any]:
    """One decoder's metrics over its episodes: success and near-contact failure rates, passes and accepted
    draft tokens per action, latency percentiles and means, and the shares of heisd's modes and of the
    steps the prefill verified."""
    n = len(records)
    failures = [r for r in records if not r.success]
    ncf = sum(r.near_contact_failure for r in records)

    def cat(attr: str) -> list[Any]:
        return [v for r in records for v in getattr(r, attr)]

    passes, accepted, drafted = cat("target_passes"), cat("accepted"), cat("drafted")
    summary: dict[str, Any] = {
        "episodes": n,
        "success_rate": sum(r.success for r in records) / n,
        "ncf_rate": ncf / n,
        "ncf_share": ncf / len(failures) if failures else 0.0,
        "actions": len(passes),
        "target_passes_per_action": float(np.mean(passes)),
        "draft_passes_per_action": float(np.mean(cat("draft_passes"))),
        "vision_recomputed_fraction": float(np.mean(cat("vision_fraction"))),
        "mean_accepted_len": float(np.mean(accepted)),
        "acceptance_rate": float(np.sum(accepted) / np.sum(drafted)) if np.sum(drafted) else 0.0,
        "latency_ms": {
            "prefill_p50": percentile(cat("prefill_ms"), 50),
            # an incremental prefill with periodic full passes: the median is the cheap frame's
            "prefill_mean": float(np.mean(cat("prefill_ms"))),
            "decode_p50": percentile(cat("decode_ms"), 50),
            "decode_p99": percentile(cat("decode_ms"), 99),
            "head_p50": percentile(cat("head_ms"), 50) if cat("head_ms") else None,
            "total_p50": percentile(cat("total_ms"), 50),
            "total_p99": percentile(cat("total_ms"), 99),
            "wall_p50": percentile(cat("wall_ms"), 50),
            "wall_p99": percentile(cat("wall_ms"), 99),
            # Time per action: with verify-skip most steps cost almost nothing, which the median hides.
            "total_mean": float(np.mean(cat("total_ms"))),
        },
        "mean_episode_steps": float(np.mean([r.steps for r in records])),
        "policy_tick_share": sum(r.policy_steps for r in records) / max(1, sum(r.steps for r in records)),
        "episodes_without_policy_steps": [r.seed for r in records if r.policy_steps == 0],
    }
    modes = cat("modes")
    if any(m in HEISD_MODES for m in modes):  # heisd's paths: how often each ran
        summary.update(mode_summary(modes, accepted, cat("retrieval_query_ms")))
    verified = [m == PREFILL_VERIFIED for m in modes]
    if any(verified):  # decoders whose proposal the prefill verified on some steps (world_aware)
        prefill = cat("prefill_ms")
        summary["prefill_verified_share"] = float(np.mean(verified))
        summary["latency_ms"]["prefill_verified_p50"] = percentile([t for t, v in zip(prefill, verified) if v], 50)
    return summary


def mode_summary(modes: list[str], accepted: list[int], query_ms: list[float]) -> dict[str, Any]:
    """heisd: ``retrieval_mode_share`` (model steps the boundary metric sent to retrieval),
    ``verify_skip_share`` (actions executed without prefill or verification),
    ``retrieval_accept_rate`` (retrieved actions accepted whole) and ``retrieval_query_ms_p50``."""
    model_steps = sum(m in ("drafter", "retrieval") for m in modes)
    retrieval = [a for m, a in zip(modes, accepted) if m == "retrieval"]
    return {
        "retrieval_mode_share": len(retrieval) / model_steps if model_steps else 0.0,
        "verify_skip_share": sum(m == "skip" for m in modes) / len(modes) if modes else 0.0,
        "retrieval_accept_rate": sum(a == N_ACTION_TOKENS for a in retrieval) / len(retrieval) if retrieval else 0.0,
        "retrieval_query_ms_p50": percentile(query_ms, 50) if query_ms else None,
    }


def checkpoint_megabytes(path: Path | str) -> float:
    """What the checkpoint directory holds, in MB: every file under it, its retrieval store included."""
    return sum(f.stat().st_size for f in CheckpointRef.parse(path).directory.rglob("*") if f.is_file()) / 1e6


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def plot_latency(records: list[EpisodeRecord], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    offset = 0
    for r in records:
        steps = np.arange(offset, offset + len(r.total_ms))
        ax.plot(steps, r.total_ms, color="tab:blue", lw=0.8)
        ax.plot(steps, r.prefill_ms, color="tab:orange", lw=0.8)
        offset += len(r.total_ms)
    ax.set_xlabel("control step (episodes back to back)")
    ax.set_ylabel("ms")
    ax.legend(["total (prefill + decode)", "prefill"], loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
