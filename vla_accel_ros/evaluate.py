"""``vla-accel eval``: closed-loop episodes of the policy in the MuJoCo sim.

Each control step: the newest observation is prefilled, the decoder produces one action, and the
sim executes it through the same IK path the node uses. Episodes use held-out seeds (from
100000 up; demonstrations for training use seeds below that).

Outputs ``DIR/summary.json`` (``episodes``, ``success_rate``, ``ncf_rate``, ``ncf_share``,
``target_passes_per_action``, ``mean_accepted_len``, ``latency_ms`` {``prefill_p50``,
``decode_p50``, ``total_p50``, ``total_p99``, ``total_mean``}, ``params``, ``checkpoint_mb``, ``peak_rss_mb``, …;
heisd adds ``retrieval_mode_share``, ``verify_skip_share``, ``retrieval_accept_rate``,
``retrieval_query_ms_p50``), ``DIR/latency.png`` (per-step latency) and a one-line summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vla_accel_ros.decoding import DECODERS, FLOW_DECODERS, STORE_DECODERS, EpisodeHistory, make_decoder, run_policy_step
from vla_accel_ros.decoding.base import N_ACTION_TOKENS, PREFILL_VERIFIED
from vla_accel_ros.decoding.heisd import MODES as HEISD_MODES
from vla_accel_ros.decoding.wa_prefill import WA_PREFILL_PREFIX, split_prefill
from vla_accel_ros.kalman import JointKalmanFilter
from vla_accel_ros.models import Policy, load_checkpoint
from vla_accel_ros.resources import default_checkpoint
from vla_accel_ros.retrieval import resolve_store, store_mismatch
from vla_accel_ros.sampling import DEFAULT_TEMPERATURE, SamplingConfig
from vla_accel_ros.sim.demos import EVAL_SEED_START
from vla_accel_ros.sim.env import NEAR_CONTACT_DISTANCE, PickCubeEnv, SimConfig
from vla_accel_ros.vision_reuse import IncrementalVisionEncoder, VisionReuseConfig


@dataclass
class EpisodeRecord:
    """Everything measured in one closed-loop episode."""

    seed: int
    decoder: str
    success: bool = False
    steps: int = 0
    min_clearance: float = float("inf")
    prefill_ms: list[float] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
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


def run_episode(
    env: PickCubeEnv,
    policy: Policy,
    decoder: Any,
    history: EpisodeHistory,
    seed: int,
    scene_clearance: bool = True,
    vision: IncrementalVisionEncoder | None = None,
) -> EpisodeRecord:
    """One closed-loop episode. ``scene_clearance`` gives decoders the sim's gripper-to-target
    clearance (world-aware acceptance); without it they fall back to the policy's contact head."""
    record = EpisodeRecord(seed=seed, decoder=getattr(decoder, "name", type(decoder).__name__))
    obs = env.reset(seed)
    history.reset(episode=seed)  # the episode's sampling noise follows its seed
    if vision is not None:
        vision.reset()
    while not env.done:
        history.observe_joints(obs.joint_pos, obs.stamp)
        clearance = env.target_clearance()
        record.min_clearance = min(record.min_clearance, clearance)
        context = history.context(
            time_left_s=history.control_period_s, target_clearance=clearance if scene_clearance else None
        )
        result = run_policy_step(policy, obs, decoder, context, vision)
        history.record(result)
        obs, _ = env.step(result.action)
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
    """The metrics of DESIGN §6 over a list of episodes of one decoder."""
    n = len(records)
    failures = [r for r in records if not r.success]
    ncf = sum(r.near_contact_failure for r in records)
    cat = lambda attr: [v for r in records for v in getattr(r, attr)]  # noqa: E731
    passes, accepted, drafted = cat("target_passes"), cat("accepted"), cat("drafted")
    summary = {
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
            "decode_p50": percentile(cat("decode_ms"), 50),
            "decode_p99": percentile(cat("decode_ms"), 99),
            "head_p50": percentile(cat("head_ms"), 50) if cat("head_ms") else None,
            "total_p50": percentile(cat("total_ms"), 50),
            "total_p99": percentile(cat("total_ms"), 99),
            # Time per action: with verify-skip most steps cost almost nothing, which the median hides.
            "total_mean": float(np.mean(cat("total_ms"))),
        },
        "mean_episode_steps": float(np.mean([r.steps for r in records])),
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


def checkpoint_megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).glob("*") if f.is_file()) / 1e6


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


def add_episode_arguments(parser: argparse.ArgumentParser, episodes: int = 50,
                          episodes_help: str = "number of episodes") -> None:
    """What every closed-loop command takes: episodes, first seed, output, checkpoint, step limit, threads."""
    parser.add_argument("--episodes", type=int, default=episodes, help=episodes_help)
    parser.add_argument("--seed", type=int, default=EVAL_SEED_START, help=f"first seed (held out: >= {EVAL_SEED_START})")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory (default: the shipped one)")
    parser.add_argument("--max-steps", type=int, default=120, help="episode step limit (20 Hz)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--decoder", default="ar", metavar="DECODER",
                        help=f"decoding method: {', '.join(DECODERS)}, or {WA_PREFILL_PREFIX}<one of them> "
                             "(that decoder on the world-aware prefill, see --wa-checkpoint)")
    add_episode_arguments(parser)
    parser.add_argument("--store", type=Path, default=None,
                        help="heisd: retrieval store directory (default: CHECKPOINT/retrieval_store; see vla-accel build-store)")
    parser.add_argument("--wa-checkpoint", type=Path, default=None,
                        help=f"checkpoint with a world component (vla-accel train-world) for --decoder "
                             f"{WA_PREFILL_PREFIX}X (default: --checkpoint, which must then have one)")
    add_vision_arguments(parser)
    add_sampling_arguments(parser)


def add_vision_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vision", choices=("full", "incremental", "incremental_kv"), default="full",
                        help="encode every patch of every frame; only the patches that changed; or that and reuse "
                             "the cached keys/values of unchanged tokens in the global layer and decoder (approximate)")
    add_vision_reuse_arguments(parser)


def add_vision_reuse_arguments(parser: argparse.ArgumentParser) -> None:
    """The incremental encoder's settings (``vision_config`` reads them)."""
    d = VisionReuseConfig()
    parser.add_argument("--vision-threshold", type=float, default=d.threshold,
                        help="incremental: mean |pixel change| (0..255) that makes a patch dynamic")
    parser.add_argument("--vision-refresh", type=int, default=d.refresh_steps,
                        help="incremental: re-encode every patch at least every N frames")
    parser.add_argument("--vision-max-drift", type=float, default=d.max_drift,
                        help="incremental: mean sub-threshold change of cached patches that forces a refresh")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                        help=f"action-token sampling temperature, 0 = greedy (default {DEFAULT_TEMPERATURE}: the shipped "
                             "policy's setting); the noise follows each episode's seed, and the draft heads share it")


def sampling_config(args: argparse.Namespace) -> SamplingConfig:
    try:
        return SamplingConfig(args.temperature)
    except ValueError as err:
        raise SystemExit(f"--temperature: {err}") from err


def vision_config(args: argparse.Namespace, reuse_kv: bool | None = None) -> VisionReuseConfig:
    """The reuse settings of the flags; ``reuse_kv`` None: as ``--vision`` says."""
    kv = args.vision == "incremental_kv" if reuse_kv is None else reuse_kv
    return VisionReuseConfig(args.vision_threshold, args.vision_refresh, args.vision_max_drift, reuse_kv=kv)


def decoder_options(name: str, store: Path | None, base_checkpoint: Path, policy: Policy, checkpoint: Path) -> dict[str, Any]:
    """What a decoder needs besides its defaults: heisd's retrieval store (``store``, else
    BASE_CHECKPOINT/retrieval_store), checked against the policy; exits with how to build one."""
    if name not in STORE_DECODERS:
        return {}
    try:
        loaded = resolve_store(store, base_checkpoint, expect_dim=policy.config.d_model)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"--decoder {name}: {err}") from err
    warning = store_mismatch(loaded, checkpoint)
    if warning:
        print(f"warning: {warning}")
    return {"store": loaded}


def run(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        raise SystemExit("--episodes must be >= 1")
    if args.seed < EVAL_SEED_START:
        print(f"warning: seed {args.seed} < {EVAL_SEED_START} may overlap the training demonstrations")
    torch.set_num_threads(args.threads)
    try:
        base_decoder, wa_prefill = split_prefill(args.decoder)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    if args.wa_checkpoint is not None and not wa_prefill:
        raise SystemExit(f"--wa-checkpoint is for --decoder {WA_PREFILL_PREFIX}X, not {args.decoder}")
    ckpt = (args.wa_checkpoint if wa_prefill else None) or args.checkpoint or default_checkpoint()
    policy = load_checkpoint(ckpt)
    if wa_prefill and policy.world is None:
        raise SystemExit(f"{ckpt} has no world component for --decoder {args.decoder}: run vla-accel train-world")
    if base_decoder in FLOW_DECODERS and policy.flow is None:
        raise SystemExit(f"{ckpt} has no continuous action head for --decoder {args.decoder}: run vla-accel train-flow")
    sampling = sampling_config(args)
    decoder = make_decoder(base_decoder, **decoder_options(base_decoder, args.store, args.checkpoint or default_checkpoint(), policy, ckpt))
    vision = IncrementalVisionEncoder(policy, vision_config(args)) if args.vision != "full" else None
    args.out.mkdir(parents=True, exist_ok=True)
    sim_config = SimConfig(image_size=policy.config.image_size, max_steps=args.max_steps)
    records = []
    start = time.perf_counter()
    with PickCubeEnv(sim_config) as env:
        history = EpisodeHistory(JointKalmanFilter(env.kin, env.control_dt), max_steps=args.max_steps,
                                 control_period_s=env.control_dt, sampling=sampling)
        bar = tqdm(range(args.episodes), desc=f"eval {args.decoder}", unit="ep")
        for i in bar:
            records.append(run_episode(env, policy, decoder, history, args.seed + i, vision=vision))
            bar.set_postfix(success=f"{np.mean([r.success for r in records]):.0%}")
    summary = summarize(records)
    summary.update(
        decoder=args.decoder,
        vision=args.vision,
        temperature=sampling.temperature,
        seed=args.seed,
        checkpoint=str(ckpt),
        params=sum(policy.n_parameters().values()),
        params_by_part=policy.n_parameters(),
        checkpoint_mb=checkpoint_megabytes(ckpt),
        peak_rss_mb=peak_rss_mb(),
        wall_s=time.perf_counter() - start,
        per_episode=[{"seed": r.seed, "success": r.success, "steps": r.steps, "min_clearance": r.min_clearance} for r in records],
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_latency(records, args.out / "latency.png", f"{args.decoder}: per-step latency")
    lat = summary["latency_ms"]
    print(
        f"eval {args.decoder} (temperature {sampling.temperature:g}): success {summary['success_rate']:.1%} "
        f"over {summary['episodes']} episodes, "
        f"NCF {summary['ncf_rate']:.1%}, {summary['target_passes_per_action']:.2f} target passes/action, "
        f"prefill {lat['prefill_p50']:.2f} ms, decode {lat['decode_p50']:.2f} ms, total p50 {lat['total_p50']:.2f} "
        f"/ p99 {lat['total_p99']:.2f} ms -> {args.out}"
    )
    if "verify_skip_share" in summary:
        query = summary["retrieval_query_ms_p50"]
        print(f"  retrieval mode on {summary['retrieval_mode_share']:.0%} of model steps, retrieved actions accepted "
              f"{summary['retrieval_accept_rate']:.0%}, verify-skipped steps {summary['verify_skip_share']:.0%}, "
              f"query p50 {'n/a' if query is None else f'{query:.3f} ms'}")
    return 0
