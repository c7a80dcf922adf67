"""One bench run (``vla-accel bench``): the policy and its decoders, every entry's runner, the seeded
episodes in one sim, and the report (:func:`run_bench`).

Without named decoders the bench runs every registered one the policy can serve, the store decoders
only when the checkpoint has a retrieval store (:func:`bench_store_options`), and with a world-aware
checkpoint the ``wa_prefill+X`` decoders of the default bases (:func:`wa_setup`); the baseline always
runs, since every speed-up is measured against it in the same run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from vla_accel_ros.core.cameras import sim_cameras, stand_in_slots
from vla_accel_ros.core.progress import progress_bar, success_text
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.seeds import EVAL_SEED_START
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.retrieval import default_store_dir
from vla_accel_ros.decoding.specs import names, spec_of
from vla_accel_ros.decoding.wa_prefill import WA_DEFAULT_BASES, WA_PREFILL_PREFIX, split_prefill
from vla_accel_ros.evaluation.bench import (
    BenchEntry,
    bench_entries,
    bench_rows,
    bench_schedule,
    default_decoders,
    run_baseline,
)
from vla_accel_ros.evaluation.bench_report import write_bench_report
from vla_accel_ros.evaluation.comparisons import (
    SWEEP_R,
    THRESHOLD_SWEPT,
    THRESHOLD_TRACED,
    flow_head_decoders,
    store_decoders,
)
from vla_accel_ros.evaluation.decoder_options import decoder_options
from vla_accel_ros.evaluation.episode import EpisodeRecord, checkpoint_megabytes, peak_rss_mb, run_episode
from vla_accel_ros.evaluation.robot_check import checkpoints_fit_robot, sim_robot
from vla_accel_ros.models import Policy, load_checkpoint
from vla_accel_ros.models.api import PolicyLike
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.load import load_policy
from vla_accel_ros.models.sampling import DEFAULT_TEMPERATURE, SamplingConfig
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.runner import PolicyRunner
from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

# entry name -> one list of episode records per repeat
Records = dict[str, list[list[EpisodeRecord]]]


@dataclass(frozen=True)
class BenchOptions:
    """What one bench run measures and where it writes it: the ``vla-accel bench`` flags of the same
    names, except ``sweep`` (not ``--no-sweep``), ``temperatures`` (``--temperature-sweep``),
    ``sampling`` (``--temperature``) and ``vision`` (the ``--vision-*`` settings)."""

    out: Path
    checkpoint: Path = field(default_factory=default_checkpoint)  # a directory, or hf:DIR
    unnorm_key: str = ""
    device: str = ""  # where the policy runs (cuda, cuda:N); empty: the CPU
    decoders: tuple[str, ...] | None = None  # None: every decoder the policy can serve
    episodes: int = 50
    seed: int = EVAL_SEED_START
    repeats: int = 1  # each seed runs this many times per decoder
    max_steps: int = 120
    threads: int = 1
    sampling: SamplingConfig = SamplingConfig(DEFAULT_TEMPERATURE)
    sweep: bool = True
    sweep_r: tuple[int, ...] = SWEEP_R
    sweep_decoders: tuple[str, ...] = THRESHOLD_SWEPT
    store: Path | None = None  # None: CHECKPOINT/retrieval_store
    wa_checkpoint: Path | None = None
    incremental_vision: bool = False
    reuse_kv: bool = False
    vision: VisionReuseConfig = VisionReuseConfig()  # the incremental encoder of the +iv and +ivkv entries
    temperatures: tuple[float, ...] = ()
    sequential_draft: bool = False
    contact_bounds: tuple[tuple[int, int], ...] = ()
    after_prefill: bool = False
    fill_check: bool = False
    fill_check_bounds: tuple[int, int] | None = None  # None: each decoder's own
    allow_unmatched_robot: bool = False
    cameras: int | None = None  # the sim's cameras; None: as many as the policy reads
    stand_in_images: bool = False  # a copy of the scene camera's image in each slot the cameras leave empty


@dataclass(frozen=True)
class BenchResult:
    """What a finished bench run prints: its tables, and how much it ran in how long."""

    report: str  # table.md's table, the world-aware comparison and the r sweep
    settings: int  # decoder settings (entries) run on every seed
    wall_s: float
    plots: tuple[str, ...] = ()  # the plots drawn into the output directory


def run_bench(options: BenchOptions) -> BenchResult | None:
    """Run the bench of ``options`` and write its files into ``options.out``
    (:func:`~vla_accel_ros.evaluation.bench_report.write_bench_report`). None when a checkpoint was
    not made for the sim arm (the reason is on stderr); a decoder or setting the policy cannot run
    ends the run with the reason (ValueError)."""
    torch.set_num_threads(options.threads)
    ckpt = options.checkpoint
    policy = load_policy(ckpt, unnorm_key=options.unnorm_key, device=options.device or None)
    decoders, wa_policy, store_options = chosen_decoders(options, policy)
    entries = bench_entries(decoders, sweep=options.sweep, incremental_vision=options.incremental_vision,
                            reuse_kv=options.reuse_kv, sequential_draft=options.sequential_draft,
                            temperatures=options.temperatures, contact_bounds=options.contact_bounds,
                            after_prefill=options.after_prefill, sweep_r=options.sweep_r,
                            sweep_decoders=options.sweep_decoders, fill_check=options.fill_check,
                            fill_check_bounds=options.fill_check_bounds)
    options.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    policies = {e.name: wa_policy if e.wa_prefill else policy for e in entries}
    cameras = sim_cameras(options.cameras, policy.capabilities().image_slots)
    stand_ins = stand_in_slots(cameras, policy.capabilities().image_slots, options.stand_in_images)
    with PickCubeEnv(SimConfig(image_size=policy.config.image_size, max_steps=options.max_steps,
                               wrist_image=cameras > 1)) as env:
        checkpoints = [ckpt] if wa_policy is None else [ckpt, options.wa_checkpoint]
        if not checkpoints_fit_robot("bench", checkpoints, sim_robot(env), options.allow_unmatched_robot):
            return None
        try:  # a setting this policy refuses (e.g. +iv on a Hugging Face VLA) ends the run with its reason
            runners = {e.name: entry_runner(options, e, env, policies[e.name], store_options) for e in entries}
        except ValueError as err:
            raise ValueError(f"{ckpt}: {err}") from err
        records = run_schedule(options, entries, env, runners, shown=decoders[:4])

    main_rows, sweep_rows = bench_rows(records, entries)
    meta = {
        "seed": options.seed,
        "episodes": options.episodes,
        "repeats": options.repeats,
        "checkpoint": str(ckpt),
        "checkpoint_mb": checkpoint_megabytes(ckpt),
        "peak_rss_mb": peak_rss_mb(),
        "wall_s": time.perf_counter() - start,
        "threads": options.threads,
        "temperature": options.sampling.temperature,
        "fill_check_bounds": options.fill_check_bounds,  # None: each decoder's own
        "cameras": cameras,
        "stand_in_images": stand_ins,
    }
    if wa_policy is not None:
        meta.update(wa_checkpoint=str(options.wa_checkpoint),
                    wa_checkpoint_mb=checkpoint_megabytes(options.wa_checkpoint))
    report, plots = write_bench_report(
        options.out, main_rows, sweep_rows, meta,
        temperature_rows={e.temperature: main_rows[e.name] for e in entries if e.temperature is not None},
        traced={n: records[n][0][0] for n in THRESHOLD_TRACED if n in records and records[n][0]},
        contact_bounds=options.contact_bounds, world_aware=wa_policy is not None)
    return BenchResult(report, len(entries), meta["wall_s"], tuple(plots))


def chosen_decoders(options: BenchOptions, policy: PolicyLike) -> tuple[list[str], Policy | None, dict[str, Any]]:
    """The decoders the run compares (the baseline first unless named elsewhere), the world-aware
    policy (None without ``options.wa_checkpoint``) and the store options of the store decoders."""
    named = options.decoders is not None
    decoders = list(options.decoders) if options.decoders is not None else default_decoders(policy)
    for name in decoders:
        if name in names() and (why := spec_of(name).refusal(policy.capabilities())):
            raise ValueError(f"{options.checkpoint}: {why}")
    wa_policy = wa_setup(decoders, policy, options.wa_checkpoint, decoders_named=named)
    unknown = [d for d in decoders if d.removeprefix(WA_PREFILL_PREFIX) not in names()]
    if unknown:
        raise ValueError(f"unknown decoders: {', '.join(unknown)} (choose from {', '.join(names())})")
    store_options = bench_store_options(decoders, options.checkpoint, policy, options.store, decoders_named=named)
    baseline = run_baseline(policy)
    if baseline not in decoders:
        decoders.insert(0, baseline)  # every speed-up is relative to the baseline from this same run
    return decoders, wa_policy, store_options


def entry_runner(options: BenchOptions, entry: BenchEntry, env: PickCubeEnv, policy: PolicyLike,
                 store_options: dict[str, Any]) -> PolicyRunner:
    """The runner of one entry: its decoder and settings, temperature and vision, at the sim's rate."""
    config = RunnerConfig(decoder=entry.decoder,
                          temperature=options.sampling.temperature if entry.temperature is None else entry.temperature,
                          vision=replace(options.vision, reuse_kv=entry.reuse_kv) if entry.incremental_vision else None,
                          action_dt_s=env.control_dt, period_s=env.control_dt, max_steps=options.max_steps,
                          torch_threads=options.threads, device=options.device,
                          stand_in_images=options.stand_in_images)
    decoder = make_decoder(entry.decoder, **dict(entry.settings),
                           **(store_options if spec_of(entry.decoder).retrieval_store else {}))
    return build_runner(config, env.kin, policy=policy, decoder=decoder)


def run_schedule(options: BenchOptions, entries: list[BenchEntry], env: PickCubeEnv,
                 runners: dict[str, PolicyRunner], shown: list[str]) -> Records:
    """Every entry's episodes in :func:`~vla_accel_ros.evaluation.bench.bench_schedule`'s order, with a
    progress bar that shows the success so far of the ``shown`` decoders."""
    records: Records = {e.name: [[] for _ in range(options.repeats)] for e in entries}
    schedule = bench_schedule(entries, options.episodes, options.repeats)
    bar = progress_bar(total=len(schedule), desc="bench", unit="ep")
    for i, k, entry in schedule:
        records[entry.name][k].append(run_episode(env, runners[entry.name], options.seed + i))
        bar.update(1)
        if entry is entries[-1]:
            done = {n: [r.success for rs in records[n] for r in rs] for n in shown}
            bar.set_postfix_str("success " + ", ".join(f"{n} {success_text(sum(s), len(s))}" for n, s in done.items()))
    bar.close()
    return records


def wa_setup(decoders: list[str], policy: Policy, wa_checkpoint: Path | None,
             decoders_named: bool = False) -> Policy | None:
    """The policy of ``wa_checkpoint`` (``--wa-checkpoint``), None without one. Adds ``wa_prefill+X``
    for the default bases to ``decoders`` unless they were named, and every X that a ``wa_prefill+X``
    is compared with."""
    if wa_checkpoint is not None and not decoders_named:
        decoders += [WA_PREFILL_PREFIX + d for d in WA_DEFAULT_BASES if d in names() and d in decoders]
    split = [split_prefill(d) for d in decoders]
    bases = [base for base, wa in split if wa]
    if not bases:
        if wa_checkpoint is not None:
            raise ValueError(f"--wa-checkpoint needs a {WA_PREFILL_PREFIX}X decoder among --decoders")
        return None
    if wa_checkpoint is None:
        raise ValueError(f"{WA_PREFILL_PREFIX}X decoders need --wa-checkpoint "
                         "(a checkpoint from vla-accel train-world)")
    wa_policy = load_checkpoint(wa_checkpoint)
    if wa_policy.world is None:
        raise ValueError(f"{wa_checkpoint} has no world component: run vla-accel train-world")
    if wa_policy.config.image_size != policy.config.image_size:
        raise ValueError(f"{wa_checkpoint} and the base checkpoint use different image sizes")
    flow_decoders = flow_head_decoders()
    if wa_policy.flow is None and any(b in flow_decoders for b in bases):
        raise ValueError(f"{wa_checkpoint} has no continuous action head for {', '.join(flow_decoders)}")
    for base in bases:  # each wa_prefill+X is reported against X from this same run (listed just before it)
        if base not in decoders:
            decoders.insert(decoders.index(WA_PREFILL_PREFIX + base), base)
    return wa_policy


def bench_store_options(decoders: list[str], ckpt: Path, policy: Policy, store: Path | None = None,
                        decoders_named: bool = False) -> dict[str, Any]:
    """The retrieval store of the decoders that need one (:func:`store_decoders`): ``store``, else
    CKPT/retrieval_store, loaded once and shared by every entry that runs one of them. When
    ``decoders`` were not named and there is no store, they are dropped from ``decoders`` with a
    note; named, a missing store ends the run saying how to build one."""
    needing_store = store_decoders()
    needs = [d for d in decoders if d.removeprefix(WA_PREFILL_PREFIX) in needing_store]
    if not needs:
        return {}
    if not decoders_named and store is None and not default_store_dir(ckpt).exists():
        print(f"note: no retrieval store at {default_store_dir(ckpt)}, {', '.join(needing_store)} left out "
              "(run vla-accel build-store)")
        for d in needs:
            decoders.remove(d)
        return {}
    return decoder_options(needs[0].removeprefix(WA_PREFILL_PREFIX), store, ckpt, policy, ckpt)
