"""``vla-accel bench``: every decoder on the same seeded episodes, side by side, in one process.

Seeds are the outer loop and decoders the inner one, so machine noise hits every decoder alike;
speed-ups are ratios of latencies measured in this one run. Besides the named decoders, an
r sweep of ``sd`` (fixed r) and ``kerv`` (r_max = r, r_min = max(1, r // 3)) traces success
against speed-up.

Outputs in DIR: ``summary.json`` (decoder name -> ``success_rate``, ``ncf_rate``, ``ncf_share``,
``mean_accepted_len``, ``target_passes_per_action``, ``decode_ms_p50``, ``total_ms_p50``,
``total_ms_p99``, ``speedup_vs_ar``, ``decode_speedup_vs_ar``, …), ``sweep.json``, ``table.md``,
``pareto.png`` (success vs speed-up over the sweep) and ``threshold_trace.png`` (r and acceptance
per step of one episode). Incremental-vision rows (``DECODER+iv``, ``DECODER+ivkv``) also hold
``prefill_speedup_vs_full``: the same decoder's full-vision prefill p50 over theirs. The ``heisd`` row also holds ``retrieval_mode_share``,
``verify_skip_share``, ``retrieval_accept_rate`` and ``retrieval_query_ms_p50``; it needs a
retrieval store (``--store``, default CHECKPOINT/retrieval_store, from ``vla-accel build-store``).

``--contact-bounds R_MIN:R_MAX,...`` adds ``kerv`` and ``world_aware`` at each of those same r
bounds (rows ``DECODER@r=[R_MIN,R_MAX]``) and ``contact_bounds.png``: at bounds loose enough for
``kerv`` to fail near contact, what the contact signal saves.

With ``--wa-checkpoint`` (a checkpoint from ``vla-accel train-world``), ``wa_prefill+X`` rows run
decoder X with that checkpoint's world-aware prefill on the same seeds (same summary.json keys;
speed-ups vs AR are against the base AR), and ``wa_comparison.json`` / ``.md`` set each against X:
success, NCF share, accepted length and the speed-up over X alone.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vla_accel_ros.decoding import DECODERS, FLOW_DECODERS, STORE_DECODERS, EpisodeHistory, make_decoder
from vla_accel_ros.decoding.kerv import KervConfig
from vla_accel_ros.decoding.wa_prefill import WA_DEFAULT_BASES, WA_PREFILL_PREFIX, split_prefill
from vla_accel_ros.evaluate import (
    EpisodeRecord,
    add_sampling_arguments,
    add_vision_arguments,
    checkpoint_megabytes,
    decoder_options,
    peak_rss_mb,
    run_episode,
    sampling_config,
    summarize,
    vision_config,
)
from vla_accel_ros.kalman import JointKalmanFilter
from vla_accel_ros.models import Policy, load_checkpoint
from vla_accel_ros.resources import default_checkpoint
from vla_accel_ros.retrieval import default_store_dir
from vla_accel_ros.sampling import SamplingConfig
from vla_accel_ros.sim.demos import EVAL_SEED_START
from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
from vla_accel_ros.vision_reuse import IncrementalVisionEncoder

SWEEP_R = (3, 5, 9, 15, 20)
PARALLEL_DRAFT_DECODERS = ("kerv", "world_aware", "deadline")  # draft with the parallel head when the checkpoint has one
SEQUENTIAL_SUFFIX = "@sequential"
PREFILL_VERIFY_DECODERS = ("world_aware",)  # verify inside the prefill by default (prefill_verify)
AFTER_PREFILL_SUFFIX = "@after_prefill"
TEMPERATURE_PREFIX = "@T="
CONTACT_PAIR = ("kerv", "world_aware")  # the decoders --contact-bounds compares, at the same r bounds
# The speed-ups the accelerated decoders aim for (decode, end to end), drawn on pareto.png.
DECODE_SPEEDUP_TARGET = 2.5
E2E_SPEEDUP_TARGET = 1.5
HEISD_KEYS = ("retrieval_mode_share", "verify_skip_share", "retrieval_accept_rate", "retrieval_query_ms_p50")


@dataclass(frozen=True)
class BenchEntry:
    """One column of the bench: a decoder with its settings under a display name."""

    name: str
    decoder: str
    settings: tuple[tuple[str, Any], ...] = ()
    sweep_r: int | None = None
    incremental_vision: bool = False
    reuse_kv: bool = False
    wa_prefill: bool = False  # run by the --wa-checkpoint policy (world-aware prefill)
    temperature: float | None = None  # token sampling temperature; None = the run's --temperature
    bounds: tuple[int, int] | None = None  # (r_min, r_max) of a --contact-bounds entry


def bench_entries(decoders: list[str], sweep: bool, incremental_vision: bool = False,
                  reuse_kv: bool = False, sequential_draft: bool = False,
                  temperatures: tuple[float, ...] = (),
                  contact_bounds: tuple[tuple[int, int], ...] = (),
                  after_prefill: bool = False) -> list[BenchEntry]:
    entries = [BenchEntry(name, name) for name in decoders]
    # kerv and world_aware at the same (loose) r bounds: what contact awareness does to NCF
    entries += [BenchEntry(bounds_name(name, lo, hi), name, (("r_min", lo), ("r_max", hi)), bounds=(lo, hi))
                for lo, hi in contact_bounds for name in CONTACT_PAIR]
    # AR again at each temperature (ar@T=...): what sampling does to success, on the same episodes
    entries += [BenchEntry(f"ar{TEMPERATURE_PREFIX}{t:g}", "ar", temperature=t) for t in temperatures]
    if sequential_draft:  # the parallel-draft decoders again, drafting with the sequential head
        entries += [BenchEntry(f"{name}{SEQUENTIAL_SUFFIX}", name, (("parallel_draft", False),))
                    for name in decoders if name in PARALLEL_DRAFT_DECODERS]
    if after_prefill:  # the prefill-verifying decoders again, verifying after the prefill on every step
        entries += [BenchEntry(f"{name}{AFTER_PREFILL_SUFFIX}", name, (("prefill_verify", False),))
                    for name in decoders if name in PREFILL_VERIFY_DECODERS]
    if incremental_vision:  # the same decoders again, prefilling only the patches that changed
        entries += [BenchEntry(f"{name}+iv", name, incremental_vision=True) for name in decoders]
    if reuse_kv:  # and again, also reusing the keys/values of unchanged prefix tokens
        entries += [BenchEntry(f"{name}+ivkv", name, incremental_vision=True, reuse_kv=True) for name in decoders]
    if sweep:
        for r in SWEEP_R:
            entries.append(BenchEntry(f"sd@r={r}", "sd", (("r", r),), r))
            entries.append(BenchEntry(f"kerv@r={r}", "kerv", (("r_min", max(1, r // 3)), ("r_max", r)), r))
    # "wa_prefill+X" entries run decoder X with the world-aware policy
    return [replace(e, decoder=e.decoder[len(WA_PREFILL_PREFIX):], wa_prefill=True)
            if e.decoder.startswith(WA_PREFILL_PREFIX) else e for e in entries]


def wa_setup(args: argparse.Namespace, decoders: list[str], policy: Policy) -> Policy | None:
    """The ``--wa-checkpoint`` policy, None without one. Adds ``wa_prefill+X`` for the default
    bases when no decoders were named, and every X that a ``wa_prefill+X`` is compared with."""
    if args.wa_checkpoint is not None and args.decoders is None:
        decoders += [WA_PREFILL_PREFIX + d for d in WA_DEFAULT_BASES if d in DECODERS and d in decoders]
    try:
        split = [split_prefill(d) for d in decoders]
    except ValueError as err:
        raise SystemExit(str(err)) from err
    bases = [base for base, wa in split if wa]
    if not bases:
        if args.wa_checkpoint is not None:
            raise SystemExit(f"--wa-checkpoint needs a {WA_PREFILL_PREFIX}X decoder among --decoders")
        return None
    if args.wa_checkpoint is None:
        raise SystemExit(f"{WA_PREFILL_PREFIX}X decoders need --wa-checkpoint (a checkpoint from vla-accel train-world)")
    wa_policy = load_checkpoint(args.wa_checkpoint)
    if wa_policy.world is None:
        raise SystemExit(f"{args.wa_checkpoint} has no world component: run vla-accel train-world")
    if wa_policy.config.image_size != policy.config.image_size:
        raise SystemExit(f"{args.wa_checkpoint} and the base checkpoint use different image sizes")
    if wa_policy.flow is None and any(b in FLOW_DECODERS for b in bases):
        raise SystemExit(f"{args.wa_checkpoint} has no continuous action head for {', '.join(FLOW_DECODERS)}")
    for base in bases:  # each wa_prefill+X is reported against X from this same run (listed just before it)
        if base not in decoders:
            decoders.insert(decoders.index(WA_PREFILL_PREFIX + base), base)
    return wa_policy


def wa_comparison(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each ``wa_prefill+X`` row against X: success, NCF share and the speed-up of the world-aware
    prefill over X alone (X's end-to-end latency / its own), all from this one run."""
    out = {}
    for name, wa in rows.items():
        base = rows.get(name[len(WA_PREFILL_PREFIX):]) if name.startswith(WA_PREFILL_PREFIX) else None
        if base is None:
            continue
        out[name] = {
            "base": name[len(WA_PREFILL_PREFIX):],
            "success_rate": wa["success_rate"],
            "base_success_rate": base["success_rate"],
            "ncf_share": wa["ncf_share"],
            "base_ncf_share": base["ncf_share"],
            "ncf_share_relative_change": (wa["ncf_share"] / base["ncf_share"] - 1.0) if base["ncf_share"] else None,
            "mean_accepted_len": wa["mean_accepted_len"],
            "base_mean_accepted_len": base["mean_accepted_len"],
            "speedup_vs_base": base["total_ms_p50"] / wa["total_ms_p50"],
            "decode_speedup_vs_base": base["decode_ms_p50"] / wa["decode_ms_p50"],
        }
    return out


def wa_table(comparison: dict[str, dict[str, Any]]) -> str:
    lines = ["| world-aware prefill | SR (base -> wa) | NCF share (base -> wa) | accepted len (base -> wa) | "
             "decode speed-up vs base | e2e speed-up vs base |", "|" + "---|" * 6]
    for name, c in comparison.items():
        lines.append(
            f"| {name} vs {c['base']} | {c['base_success_rate']:.0%} -> {c['success_rate']:.0%} | "
            f"{c['base_ncf_share']:.0%} -> {c['ncf_share']:.0%} | {c['base_mean_accepted_len']:.2f} -> "
            f"{c['mean_accepted_len']:.2f} | {c['decode_speedup_vs_base']:.2f}x | {c['speedup_vs_base']:.2f}x |"
        )
    return "\n".join(lines)


def row(summary: dict[str, Any], ar: dict[str, Any] | None, plain_prefill_ms: float | None = None) -> dict[str, Any]:
    """One decoder's summary.json entry. For a decoder whose proposal the prefill verified on some
    steps, ``decode_ms_p50`` counts the extra rows of that prefill as decoding: total p50 minus
    ``plain_prefill_ms``, the prefill p50 of ``ar`` with the same vision in the same run (the
    decoder's own time after its prefill is ``decode_after_prefill_ms_p50``)."""
    lat = summary["latency_ms"]
    out = {
        "success_rate": summary["success_rate"],
        "ncf_rate": summary["ncf_rate"],
        "ncf_share": summary["ncf_share"],
        "mean_accepted_len": summary["mean_accepted_len"],
        "acceptance_rate": summary["acceptance_rate"],
        "target_passes_per_action": summary["target_passes_per_action"],
        "draft_passes_per_action": summary["draft_passes_per_action"],
        "vision_recomputed_fraction": summary["vision_recomputed_fraction"],
        "prefill_ms_p50": lat["prefill_p50"],
        "decode_ms_p50": lat["decode_p50"],
        "head_ms_p50": lat["head_p50"],  # continuous heads only (None otherwise): the sampler's own time
        "total_ms_p50": lat["total_p50"],
        "total_ms_p99": lat["total_p99"],
        "total_ms_mean": lat["total_mean"],
        "episodes": summary["episodes"],
    }
    for key in HEISD_KEYS:  # heisd's mode shares and store query time
        if key in summary:
            out[key] = summary[key]
    if "prefill_verified_share" in summary:
        out["prefill_verified_share"] = summary["prefill_verified_share"]
        out["prefill_verified_ms_p50"] = lat["prefill_verified_p50"]
        out["decode_after_prefill_ms_p50"] = lat["decode_p50"]
        if plain_prefill_ms is not None:
            out["decode_ms_p50"] = lat["total_p50"] - plain_prefill_ms
    if ar is not None:
        out["speedup_vs_ar"] = ar["latency_ms"]["total_p50"] / lat["total_p50"]
        out["decode_speedup_vs_ar"] = ar["latency_ms"]["decode_p50"] / out["decode_ms_p50"]
        out["speedup_vs_ar_mean"] = ar["latency_ms"]["total_mean"] / lat["total_mean"]  # time per action
    return out


def plain_prefill_ms(summaries: dict[str, dict[str, Any]], entry: BenchEntry) -> float | None:
    """The prefill p50 of ``ar`` with ``entry``'s vision (full, +iv or +ivkv) in this run."""
    reference = "ar" + ("+ivkv" if entry.reuse_kv else "+iv" if entry.incremental_vision else "")
    return summaries[reference]["latency_ms"]["prefill_p50"] if reference in summaries else None


def markdown_table(rows: dict[str, dict[str, Any]]) -> str:
    header = "| decoder | SR | NCF rate | NCF share | accepted len | target passes/action | draft steps/action | prefill ms p50 | decode ms p50 | total ms p50 | total ms p99 | decode speed-up | e2e speed-up | e2e speed-up (mean) |"
    lines = [header, "|" + "---|" * 14]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['success_rate']:.0%} | {r['ncf_rate']:.0%} | {r['ncf_share']:.0%} | {r['mean_accepted_len']:.2f} | "
            f"{r['target_passes_per_action']:.2f} | {r['draft_passes_per_action']:.2f} | {r['prefill_ms_p50']:.2f} | {r['decode_ms_p50']:.2f} | {r['total_ms_p50']:.2f} | "
            f"{r['total_ms_p99']:.2f} | {r.get('decode_speedup_vs_ar', float('nan')):.2f}x | {r.get('speedup_vs_ar', float('nan')):.2f}x | {r.get('speedup_vs_ar_mean', float('nan')):.2f}x |"
        )
    return "\n".join(lines)


def plot_pareto(sweep: dict[str, dict[str, Any]], main: dict[str, dict[str, Any]], out: Path) -> None:
    """Success against decode and end-to-end speed-up: the r sweeps of sd and kerv as lines, the
    named rows as points, the speed-up targets as dashed lines (so the plot shows how far off they
    are) and the band within 2 points of AR's success as "matched success"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    panels = (("decode_speedup_vs_ar", "decode speed-up vs AR (same run)", DECODE_SPEEDUP_TARGET),
              ("speedup_vs_ar", "end-to-end speed-up vs AR (same run)", E2E_SPEEDUP_TARGET))
    for ax, (key, label, target) in zip(axes, panels):
        for family, color in (("sd", "tab:orange"), ("kerv", "tab:blue")):
            pts = sorted((v["sweep_r"], v.get(key, 1.0), v["success_rate"])
                         for k, v in sweep.items() if k.startswith(family + "@"))
            if pts:
                ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", color=color, label=f"{family} (r sweep)")
                for r, x, y in pts:
                    ax.annotate(f"r={r}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        for name, v in main.items():
            if "@" not in name:  # variants (@sequential, @r=[...], @T=...) have their own plots and tables
                ax.scatter([v.get(key, 1.0)], [v["success_rate"]], marker="s", s=30, label=name, zorder=3)
        ax.axvline(target, color="tab:red", linestyle="--", linewidth=1)
        ax.annotate(f"target {target:g}x", (target, 0.02), xycoords=("data", "axes fraction"),
                    textcoords="offset points", xytext=(4, 0), fontsize=8, color="tab:red")
        if "ar" in main:
            ax.axhspan(main["ar"]["success_rate"] - 0.02, main["ar"]["success_rate"] + 0.02, color="tab:green",
                       alpha=0.12, label="matched success (AR ± 2 points)")
        ax.set_xlim(left=min(0.9, ax.get_xlim()[0]), right=max(target * 1.1, ax.get_xlim()[1]))
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    lowest = min([v["success_rate"] for v in (*sweep.values(), *main.values())], default=1.0)
    axes[0].set_ylim(max(0.0, min(0.5, lowest - 0.1)), 1.03)  # whole-scale: a flat 100% stays readable
    axes[0].set_ylabel("success rate")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_temperature_sweep(rows: dict[float, dict[str, Any]], out: Path) -> None:
    """Success and NCF rate of ar against the token sampling temperature (0 = greedy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = sorted(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style in (("success_rate", "success", "o-"), ("ncf_rate", "near-contact failure", "s--")):
        ax.plot(temperatures, [rows[t][key] for t in temperatures], style, label=label)
    ax.set_xlabel("sampling temperature (0 = greedy)")
    ax.set_ylabel("rate over the episodes")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("ar: success against temperature")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_threshold_trace(records: dict[str, EpisodeRecord], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_a) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    for name, rec in records.items():
        ax_r.plot(rec.thresholds, label=name)
        ax_a.plot(rec.accepted, label=name)
    ax_r.set_ylabel("threshold r (bins)")
    ax_a.set_ylabel("accepted draft tokens")
    ax_a.set_xlabel(f"control step (seed {next(iter(records.values())).seed})")
    ax_r.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def bounds_name(decoder: str, r_min: int, r_max: int) -> str:
    return f"{decoder}@r=[{r_min},{r_max}]"


def plot_contact_bounds(rows: dict[str, dict[str, Any]], bounds: tuple[tuple[int, int], ...], out: Path) -> None:
    """Near-contact failure and success of kerv and world_aware at each of the same r bounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    x = np.arange(len(bounds))
    for ax, key, title in ((axes[0], "ncf_rate", "near-contact failure rate"), (axes[1], "success_rate", "success rate")):
        for k, name in enumerate(CONTACT_PAIR):
            values = [rows[bounds_name(name, lo, hi)][key] for lo, hi in bounds]
            ax.bar(x + (k - 0.5) * 0.38, values, width=0.38, label=name)
        ax.set_xticks(x, [f"[{lo}, {hi}]" for lo, hi in bounds])
        ax.set_xlabel("r bounds [r_min, r_max]")
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _bounds(text: str) -> tuple[tuple[int, int], ...]:
    """"20:60,40:100" -> ((20, 60), (40, 100)), each a valid kerv (r_min, r_max)."""
    try:
        pairs = tuple(tuple(int(v) for v in item.split(":")) for item in text.split(",") if item.strip())
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"{pair} is not R_MIN:R_MAX")
            KervConfig(r_min=pair[0], r_max=pair[1])
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"comma-separated R_MIN:R_MAX pairs with 0 <= R_MIN <= R_MAX: {err}") from err
    return pairs  # type: ignore[return-value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=50, help="episodes per decoder (same seeds for all)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED_START, help="first seed (held out)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory (default: shipped)")
    parser.add_argument("--decoders", default=None,
                        help="comma-separated decoder names (default: all; flow10/flow2 when the checkpoint has a flow head)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the r sweep of sd and kerv")
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--store", type=Path, default=None,
                        help="heisd: retrieval store directory (default: CHECKPOINT/retrieval_store; without one, "
                             "heisd is left out of the default decoders; see vla-accel build-store)")
    parser.add_argument("--wa-checkpoint", type=Path, default=None,
                        help=f"checkpoint with a world component (vla-accel train-world): runs the {WA_PREFILL_PREFIX}X "
                             f"decoders (default: {', '.join(WA_PREFILL_PREFIX + d for d in WA_DEFAULT_BASES)}) and "
                             "compares each with X (wa_comparison.json)")
    parser.add_argument("--incremental-vision", action="store_true",
                        help="also run every decoder with incremental vision (entries named DECODER+iv)")
    parser.add_argument("--reuse-kv", action="store_true",
                        help="also run every decoder with incremental vision that reuses the keys/values of "
                             "unchanged prefix tokens (entries named DECODER+ivkv)")
    parser.add_argument("--temperature-sweep", type=_temperatures, default=(), metavar="T1,T2,...",
                        help=f"also run ar at each of these sampling temperatures (entries ar{TEMPERATURE_PREFIX}T) and "
                             "plot success against temperature (temperature_sweep.png)")
    parser.add_argument("--sequential-draft", action="store_true",
                        help=f"also run {', '.join(PARALLEL_DRAFT_DECODERS)} with the sequential draft head "
                             f"(entries named DECODER{SEQUENTIAL_SUFFIX}), next to the parallel head they use by default")
    parser.add_argument("--contact-bounds", type=_bounds, default=(), metavar="R_MIN:R_MAX,...",
                        help=f"also run {' and '.join(CONTACT_PAIR)} at each of these same r bounds (entries named "
                             "DECODER@r=[R_MIN,R_MAX]) and plot their near-contact failures (contact_bounds.png)")
    parser.add_argument("--after-prefill", action="store_true",
                        help=f"also run {', '.join(PREFILL_VERIFY_DECODERS)} verifying after the prefill on every step "
                             f"(entries named DECODER{AFTER_PREFILL_SUFFIX}), next to their default of verifying the "
                             "proposal inside the prefill in free space")
    add_vision_arguments(parser)
    add_sampling_arguments(parser)


def _temperatures(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(t) for t in text.split(",") if t.strip())
        for t in values:
            SamplingConfig(t)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"a comma-separated list of temperatures in [0, 2]: {err}") from err
    return values


def bench_store_options(args: argparse.Namespace, decoders: list[str], ckpt: Path, policy: Policy) -> dict[str, Any]:
    """heisd's retrieval store, loaded once and shared by every entry that runs heisd. Without
    ``--decoders`` and without a store, heisd is dropped from ``decoders`` with a note; named
    explicitly, a missing store ends the run saying how to build one."""
    needs = [d for d in decoders if d.removeprefix(WA_PREFILL_PREFIX) in STORE_DECODERS]
    if not needs:
        return {}
    if args.decoders is None and args.store is None and not default_store_dir(ckpt).exists():
        print(f"note: no retrieval store at {default_store_dir(ckpt)}, heisd left out (run vla-accel build-store)")
        for d in needs:
            decoders.remove(d)
        return {}
    return decoder_options("heisd", args.store, ckpt, policy, ckpt)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    ckpt = args.checkpoint or default_checkpoint()
    policy = load_checkpoint(ckpt)
    if args.decoders is None:
        decoders = [d for d in DECODERS if policy.flow is not None or d not in FLOW_DECODERS]
    else:
        decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    if policy.flow is None and any(d in FLOW_DECODERS for d in decoders):
        raise SystemExit(f"{ckpt} has no continuous action head for {', '.join(FLOW_DECODERS)}: run vla-accel train-flow")
    wa_policy = wa_setup(args, decoders, policy)
    unknown = [d for d in decoders if d.removeprefix(WA_PREFILL_PREFIX) not in DECODERS]
    if unknown:
        raise SystemExit(f"unknown decoders: {', '.join(unknown)} (choose from {', '.join(DECODERS)})")
    store_options = bench_store_options(args, decoders, ckpt, policy)
    if "ar" not in decoders:
        decoders.insert(0, "ar")  # every speed-up is relative to AR from this same run
    entries = bench_entries(decoders, sweep=not args.no_sweep, incremental_vision=args.incremental_vision,
                            reuse_kv=args.reuse_kv, sequential_draft=args.sequential_draft,
                            temperatures=args.temperature_sweep, contact_bounds=args.contact_bounds,
                            after_prefill=args.after_prefill)
    sampling = sampling_config(args)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    records: dict[str, list[EpisodeRecord]] = {e.name: [] for e in entries}
    policies = {e.name: wa_policy if e.wa_prefill else policy for e in entries}
    with PickCubeEnv(SimConfig(image_size=policy.config.image_size, max_steps=args.max_steps)) as env:
        runners = {
            e.name: (
                make_decoder(e.decoder, **dict(e.settings), **(store_options if e.decoder in STORE_DECODERS else {})),
                EpisodeHistory(JointKalmanFilter(env.kin, env.control_dt), max_steps=args.max_steps,
                               control_period_s=env.control_dt,
                               sampling=sampling if e.temperature is None else SamplingConfig(e.temperature)),
                IncrementalVisionEncoder(policies[e.name], vision_config(args, e.reuse_kv)) if e.incremental_vision else None,
            )
            for e in entries
        }
        bar = tqdm(total=args.episodes * len(entries), desc="bench", unit="ep")
        for i in range(args.episodes):
            for entry in entries:
                decoder, history, vision = runners[entry.name]
                records[entry.name].append(run_episode(env, policies[entry.name], decoder, history, args.seed + i, vision=vision))
                bar.update(1)
            bar.set_postfix({n: f"{np.mean([r.success for r in records[n]]):.0%}" for n in decoders[:4]})
        bar.close()

    summaries = {name: summarize(recs) for name, recs in records.items()}
    ar = summaries["ar"]
    main_rows = {e.name: row(summaries[e.name], ar, plain_prefill_ms(summaries, e)) for e in entries if e.sweep_r is None}
    for e in entries:  # incremental rows: their prefill against the same decoder's full-vision prefill
        if e.incremental_vision and e.decoder in main_rows:
            main_rows[e.name]["prefill_speedup_vs_full"] = (
                main_rows[e.decoder]["prefill_ms_p50"] / main_rows[e.name]["prefill_ms_p50"])
    sweep_rows = {e.name: dict(row(summaries[e.name], ar), sweep_r=e.sweep_r, decoder=e.decoder) for e in entries if e.sweep_r is not None}
    meta = {
        "seed": args.seed,
        "episodes": args.episodes,
        "checkpoint": str(ckpt),
        "checkpoint_mb": checkpoint_megabytes(ckpt),
        "peak_rss_mb": peak_rss_mb(),
        "wall_s": time.perf_counter() - start,
        "threads": args.threads,
        "temperature": sampling.temperature,
    }
    comparison = wa_comparison(main_rows)
    if wa_policy is not None:
        meta.update(wa_checkpoint=str(args.wa_checkpoint), wa_checkpoint_mb=checkpoint_megabytes(args.wa_checkpoint))
        (args.out / "wa_comparison.json").write_text(json.dumps(comparison, indent=2))
        (args.out / "wa_comparison.md").write_text(wa_table(comparison) + "\n")
    (args.out / "summary.json").write_text(json.dumps(main_rows, indent=2))
    (args.out / "sweep.json").write_text(json.dumps(sweep_rows, indent=2))
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2))
    table = markdown_table(main_rows)
    verified = {name: r for name, r in main_rows.items() if "prefill_verified_share" in r}
    if verified:
        table += "\n\nverified inside the prefill (decode ms = total - the prefill of ar with the same vision): " + ", ".join(
            f"{name} {r['prefill_verified_share']:.0%} of actions (prefill {r['prefill_verified_ms_p50']:.2f} ms there, "
            f"{r['decode_after_prefill_ms_p50']:.2f} ms after it)" for name, r in verified.items())
    incremental = {name: r["prefill_speedup_vs_full"] for name, r in main_rows.items() if "prefill_speedup_vs_full" in r}
    if incremental:
        table += "\n\nprefill speed-up over the same decoder with full vision: " + ", ".join(
            f"{name} {ratio:.2f}x" for name, ratio in incremental.items())
    sweep_table = markdown_table(sweep_rows) if sweep_rows else ""
    (args.out / "table.md").write_text(table + ("\n\nr sweep:\n\n" + sweep_table if sweep_table else "") + "\n")
    if sweep_rows:
        plot_pareto(sweep_rows, main_rows, args.out / "pareto.png")
    swept = {e.temperature: main_rows[e.name] for e in entries if e.temperature is not None}
    if swept:
        plot_temperature_sweep(swept, args.out / "temperature_sweep.png")
    if args.contact_bounds:
        plot_contact_bounds(main_rows, args.contact_bounds, args.out / "contact_bounds.png")
    traced = {n: records[n][0] for n in ("kerv", "world_aware", "sd", "kerv_released") if n in records}
    if traced:
        plot_threshold_trace(traced, args.out / "threshold_trace.png")
    print(table)
    if comparison:
        print("\nworld-aware prefill vs the same decoder alone:\n" + wa_table(comparison))
    if sweep_table:
        print("\nr sweep:\n" + sweep_table)
    print(f"bench: {args.episodes} episodes x {len(entries)} decoder settings in {meta['wall_s']:.0f} s -> {args.out}")
    return 0
