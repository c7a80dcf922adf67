"""``vla-accel bench``: every decoder on the same seeded episodes, side by side, with plots.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.settings import parse_r_bounds
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.specs import names, spec_of
from vla_accel_ros.decoding.wa_prefill import WA_DEFAULT_BASES, WA_PREFILL_PREFIX
from vla_accel_ros.evaluation.bench import (
    AFTER_PREFILL_SUFFIX,
    FILL_CHECK_SUFFIX,
    SEQUENTIAL_SUFFIX,
    SWEEP_R,
    TEMPERATURE_PREFIX,
    bench_entries,
    bench_rows,
    bench_schedule,
    bench_store_options,
    default_decoders,
    fill_check_decoders,
    flow_head_decoders,
    markdown_table,
    matched_success,
    matched_success_table,
    parallel_draft_decoders,
    plot_contact_bounds,
    plot_pareto,
    plot_temperature_sweep,
    plot_threshold_trace,
    plot_wa_relaxation,
    prefill_verifying_decoders,
    retrieval_note,
    store_decoders,
    wa_comparison,
    wa_setup,
    wa_table,
)
from vla_accel_ros.evaluation.comparisons import (
    BASELINE,
    CONTACT_COMPARISON,
    THRESHOLD_SWEPT,
    THRESHOLD_TRACED,
)
from vla_accel_ros.evaluation.episode import (
    EpisodeRecord,
    checkpoint_megabytes,
    peak_rss_mb,
    run_episode,
)
from vla_accel_ros.evaluation.robot_check import checkpoints_fit_robot, sim_robot
from vla_accel_ros.models.load import load_policy
from vla_accel_ros.models.sampling import SamplingConfig
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.sim.env import EVAL_SEED_START, PickCubeEnv, SimConfig
from vla_accel_ros.sim.gl import check_rendering

from .closed_loop_options import add_robot_arguments, add_sampling_arguments, sampling_config
from .vision_options import add_vision_arguments, vision_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=50, help="episodes per decoder (same seeds for all)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED_START, help="first seed (held out)")
    parser.add_argument("--repeats", type=parse_repeats, default=1, metavar="K",
                        help="run each seed K times per decoder, every decoder once per round; each speed-up in "
                             "summary.json is the median over the K rounds with its _min and _max")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory, or hf:DIR for a Hugging "
                        "Face VLA with OpenVLA's action tokens (default: shipped)")
    parser.add_argument("--unnorm-key", default="", help="hf:DIR only: the dataset of its dataset_statistics.json "
                        "(default: the file's only one)")
    parser.add_argument("--decoders", default=None,
                        help=f"comma-separated decoder names (default: all; {'/'.join(flow_head_decoders())} when "
                             "the checkpoint has a flow head)")
    parser.add_argument("--no-sweep", action="store_true", help=f"skip the r sweep of {' and '.join(THRESHOLD_SWEPT)}")
    parser.add_argument("--sweep-r", type=parse_sweep_r, default=SWEEP_R, metavar="R1,R2,...",
                        help=f"the r values of the sweep (default: {','.join(map(str, SWEEP_R))}); a listed "
                             f"{WA_PREFILL_PREFIX}X of a swept X is swept too")
    parser.add_argument("--sweep-decoders", type=parse_sweep_decoders, default=THRESHOLD_SWEPT, metavar="D1,D2",
                        help=f"which of {', '.join(THRESHOLD_SWEPT)} the r sweep runs (default: all)")
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--store", type=Path, default=None,
                        help=f"{', '.join(store_decoders())}: retrieval store directory (default: "
                             f"CHECKPOINT/retrieval_store; without one, {', '.join(store_decoders())} is left out of "
                             "the default decoders; see vla-accel build-store)")
    parser.add_argument("--wa-checkpoint", type=Path, default=None,
                        help=f"checkpoint with a world component (vla-accel train-world): runs the {WA_PREFILL_PREFIX}X "
                             f"decoders (default: {', '.join(WA_PREFILL_PREFIX + d for d in WA_DEFAULT_BASES)}) and "
                             "compares each with X (wa_comparison.json)")
    parser.add_argument("--incremental-vision", action="store_true",
                        help="also run every decoder with incremental vision (entries named DECODER+iv)")
    parser.add_argument("--reuse-kv", action="store_true",
                        help="also run every decoder with incremental vision that reuses the keys/values of "
                             "unchanged prefix tokens (entries named DECODER+ivkv)")
    parser.add_argument("--temperature-sweep", type=parse_temperatures, default=(), metavar="T1,T2,...",
                        help=f"also run {BASELINE} at each of these sampling temperatures (entries "
                             f"{BASELINE}{TEMPERATURE_PREFIX}T) and "
                             "plot success against temperature (temperature_sweep.png)")
    parser.add_argument("--sequential-draft", action="store_true",
                        help=f"also run {', '.join(parallel_draft_decoders())} with the sequential draft head "
                             f"(entries named DECODER{SEQUENTIAL_SUFFIX}), next to the parallel head they use by default")
    parser.add_argument("--contact-bounds", type=parse_contact_bounds, default=(), metavar="R_MIN:R_MAX,...",
                        help=f"also run {' and '.join(CONTACT_COMPARISON)} at each of these same r bounds (entries named "
                             "DECODER@r=[R_MIN,R_MAX]) and plot their near-contact failures (contact_bounds.png)")
    parser.add_argument("--after-prefill", action="store_true",
                        help=f"also run {', '.join(prefill_verifying_decoders())} verifying after the prefill on every step "
                             f"(entries named DECODER{AFTER_PREFILL_SUFFIX}), next to their default of verifying the "
                             "proposal inside the prefill in free space")
    parser.add_argument("--fill-check", action="store_true",
                        help=f"also run {', '.join(fill_check_decoders())} checking the Kalman filter's fill of a "
                             f"rejected suffix against the target's own picks from the same verify pass (entries "
                             f"named DECODER{FILL_CHECK_SUFFIX}, and DECODER{FILL_CHECK_SUFFIX}+ivkv with --reuse-kv)")
    parser.add_argument("--fill-check-bounds", type=parse_r_bounds, default=None, metavar="R_MIN:R_MAX",
                        help="--fill-check: the r bounds of the fill-checked entries (acceptance and the check "
                             "alike; default: each decoder's own)")
    add_vision_arguments(parser)
    add_sampling_arguments(parser)
    add_robot_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not check_rendering("bench"):  # no GL: one line saying what to set, before any work
        return 2
    torch.set_num_threads(args.threads)
    ckpt = args.checkpoint or default_checkpoint()
    policy = load_policy(ckpt, unnorm_key=args.unnorm_key)
    if args.decoders is None:  # every decoder the policy can serve (a Hugging Face VLA has no draft head)
        decoders = default_decoders(policy)
    else:
        decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    for name in decoders:
        if name in names() and (why := spec_of(name).refusal(policy.capabilities())):
            raise SystemExit(f"{ckpt}: {why}")
    wa_policy = wa_setup(decoders, policy, args.wa_checkpoint, decoders_named=args.decoders is not None)
    unknown = [d for d in decoders if d.removeprefix(WA_PREFILL_PREFIX) not in names()]
    if unknown:
        raise SystemExit(f"unknown decoders: {', '.join(unknown)} (choose from {', '.join(names())})")
    store_options = bench_store_options(decoders, ckpt, policy, args.store, decoders_named=args.decoders is not None)
    if BASELINE not in decoders:
        decoders.insert(0, BASELINE)  # every speed-up is relative to the baseline from this same run
    entries = bench_entries(decoders, sweep=not args.no_sweep, incremental_vision=args.incremental_vision,
                            reuse_kv=args.reuse_kv, sequential_draft=args.sequential_draft,
                            temperatures=args.temperature_sweep, contact_bounds=args.contact_bounds,
                            after_prefill=args.after_prefill, sweep_r=args.sweep_r,
                            sweep_decoders=args.sweep_decoders, fill_check=args.fill_check,
                            fill_check_bounds=args.fill_check_bounds)
    sampling = sampling_config(args)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # entry name -> one list of episode records per repeat
    records: dict[str, list[list[EpisodeRecord]]] = {e.name: [[] for _ in range(args.repeats)] for e in entries}
    policies = {e.name: wa_policy if e.wa_prefill else policy for e in entries}
    with PickCubeEnv(SimConfig(image_size=policy.config.image_size, max_steps=args.max_steps)) as env:
        checkpoints = [ckpt] if wa_policy is None else [ckpt, args.wa_checkpoint]
        if not checkpoints_fit_robot("bench", checkpoints, sim_robot(env), args.allow_unmatched_robot):
            return 2
        try:  # a setting this policy refuses (e.g. +iv on a Hugging Face VLA) ends the run with its reason
            runners = {
                e.name: build_runner(
                    RunnerConfig(decoder=e.decoder,
                                 temperature=sampling.temperature if e.temperature is None else e.temperature,
                                 vision=vision_config(args, e.reuse_kv) if e.incremental_vision else None,
                                 action_dt_s=env.control_dt, period_s=env.control_dt, max_steps=args.max_steps,
                                 torch_threads=args.threads),
                    env.kin, policy=policies[e.name],
                    decoder=make_decoder(e.decoder, **dict(e.settings),
                                         **(store_options if spec_of(e.decoder).retrieval_store else {})))
                for e in entries
            }
        except ValueError as err:
            raise SystemExit(f"{ckpt}: {err}") from err
        schedule = bench_schedule(entries, args.episodes, args.repeats)
        bar = tqdm(total=len(schedule), desc="bench", unit="ep")
        for i, k, entry in schedule:
            records[entry.name][k].append(run_episode(env, runners[entry.name], args.seed + i))
            bar.update(1)
            if entry is entries[-1]:
                bar.set_postfix({n: f"{np.mean([r.success for rs in records[n] for r in rs]):.0%}" for n in decoders[:4]})
        bar.close()

    main_rows, sweep_rows = bench_rows(records, entries)
    meta = {
        "seed": args.seed,
        "episodes": args.episodes,
        "repeats": args.repeats,
        "checkpoint": str(ckpt),
        "checkpoint_mb": checkpoint_megabytes(ckpt),
        "peak_rss_mb": peak_rss_mb(),
        "wall_s": time.perf_counter() - start,
        "threads": args.threads,
        "temperature": sampling.temperature,
        "fill_check_bounds": args.fill_check_bounds,  # None: each decoder's own
    }
    every_row = {**main_rows, **sweep_rows}
    comparison = wa_comparison(every_row)
    matched = matched_success(every_row)
    (args.out / "matched_success.json").write_text(json.dumps(matched, indent=2))
    if wa_policy is not None:
        meta.update(wa_checkpoint=str(args.wa_checkpoint), wa_checkpoint_mb=checkpoint_megabytes(args.wa_checkpoint))
        (args.out / "wa_comparison.json").write_text(json.dumps(comparison, indent=2))
        (args.out / "wa_comparison.md").write_text(wa_table(comparison) + "\n")
        plot_wa_relaxation(comparison, every_row, args.out / "wa_relaxation.png")
    (args.out / "summary.json").write_text(json.dumps(main_rows, indent=2))
    (args.out / "sweep.json").write_text(json.dumps(sweep_rows, indent=2))
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2))
    table = markdown_table(main_rows)
    verified = {name: r for name, r in main_rows.items() if "prefill_verified_share" in r}
    if verified:
        table += f"\n\nverified inside the prefill (decode ms = total - the prefill of {BASELINE} with the same vision): " + ", ".join(
            f"{name} {r['prefill_verified_share']:.0%} of actions (prefill {r['prefill_verified_ms_p50']:.2f} ms there, "
            f"{r['decode_after_prefill_ms_p50']:.2f} ms after it)" for name, r in verified.items())
    incremental = {name: r for name, r in main_rows.items() if "prefill_speedup_vs_full" in r}
    if incremental:
        table += "\n\nprefill speed-up over the same decoder with full vision (p50, mean): " + ", ".join(
            f"{name} {r['prefill_speedup_vs_full']:.2f}x, {r['prefill_speedup_vs_full_mean']:.2f}x"
            for name, r in incremental.items())
    if note := retrieval_note(main_rows):
        table += "\n\n" + note
    table += "\n\n" + matched_success_table(matched, main_rows[BASELINE]["success_rate"])
    sweep_table = markdown_table(sweep_rows) if sweep_rows else ""
    (args.out / "table.md").write_text(table + ("\n\nr sweep:\n\n" + sweep_table if sweep_table else "") + "\n")
    if sweep_rows:
        plot_pareto(sweep_rows, main_rows, args.out / "pareto.png")
    swept = {e.temperature: main_rows[e.name] for e in entries if e.temperature is not None}
    if swept:
        plot_temperature_sweep(swept, args.out / "temperature_sweep.png")
    if args.contact_bounds:
        plot_contact_bounds(main_rows, args.contact_bounds, args.out / "contact_bounds.png")
    traced = {n: records[n][0][0] for n in THRESHOLD_TRACED if n in records and records[n][0]}
    if traced:
        plot_threshold_trace(traced, args.out / "threshold_trace.png")
    print(table)
    if comparison:
        print("\nworld-aware prefill vs the same decoder alone:\n" + wa_table(comparison))
    if sweep_table:
        print("\nr sweep:\n" + sweep_table)
    print(f"bench: {args.episodes} episodes x {args.repeats} repeats x {len(entries)} decoder settings in "
          f"{meta['wall_s']:.0f} s -> {args.out}")
    return 0


def parse_contact_bounds(text: str) -> tuple[tuple[int, int], ...]:
    """"20:60,40:100" -> ((20, 60), (40, 100)), each a valid (r_min, r_max) of every decoder in
    ``CONTACT_COMPARISON``."""
    try:
        pairs = tuple(tuple(int(v) for v in item.split(":")) for item in text.split(",") if item.strip())
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"{pair} is not R_MIN:R_MAX")
            for name in CONTACT_COMPARISON:
                make_decoder(name, r_min=pair[0], r_max=pair[1])
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"comma-separated R_MIN:R_MAX pairs with 0 <= R_MIN <= R_MAX: {err}") from err
    return pairs  # type: ignore[return-value]


def parse_sweep_r(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated integers >= 1, got {text!r}")
    return values


def parse_sweep_decoders(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [n for n in names if n not in THRESHOLD_SWEPT]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"comma-separated names among {', '.join(THRESHOLD_SWEPT)}, got {text!r}")
    return names


def parse_repeats(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"an integer >= 1, got {text!r}")
    return value


def parse_temperatures(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(t) for t in text.split(",") if t.strip())
        for t in values:
            SamplingConfig(t)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"a comma-separated list of temperatures in [0, 2]: {err}") from err
    return values
