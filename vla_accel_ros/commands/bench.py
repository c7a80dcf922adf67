"""``vla-accel bench``: every decoder on the same seeded episodes, side by side, with plots.

Its table gives per decoder the success rate (SR), the NCF rate (near-contact failures: failed
episodes whose gripper came within 2 cm of the cube), the target passes per action, the latencies
and the speed-ups over ``ar`` measured in the same run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from vla_accel_ros.commands.closed_loop_options import (
    add_camera_arguments,
    add_robot_arguments,
    add_sampling_arguments,
    sampling_config,
)
from vla_accel_ros.commands.vision_options import add_vision_arguments, vision_config
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.seeds import EVAL_SEED_START
from vla_accel_ros.core.settings import parse_r_bounds
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.wa_prefill import WA_DEFAULT_BASES, WA_PREFILL_PREFIX
from vla_accel_ros.evaluation.comparisons import (
    AFTER_PREFILL_SUFFIX,
    BASELINE,
    CONTACT_COMPARISON,
    FILL_CHECK_SUFFIX,
    SEQUENTIAL_SUFFIX,
    SWEEP_R,
    TEMPERATURE_PREFIX,
    THRESHOLD_SWEPT,
    fill_check_decoders,
    flow_head_decoders,
    parallel_draft_decoders,
    prefill_verifying_decoders,
    store_decoders,
)
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.sampling import SamplingConfig

if TYPE_CHECKING:
    from vla_accel_ros.evaluation.bench_run import BenchOptions


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
    parser.add_argument("--device", default="", help="where the policy runs for every decoder: cpu, cuda or cuda:N "
                        "(default: the CPU); a device this torch cannot use is refused before loading")
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
                        help="checkpoint with a world component (vla-accel train-world): runs the "
                             f"{WA_PREFILL_PREFIX}X "
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
                             f"(entries named DECODER{SEQUENTIAL_SUFFIX}), next to the parallel head they use by "
                             "default")
    parser.add_argument("--contact-bounds", type=parse_contact_bounds, default=(), metavar="R_MIN:R_MAX,...",
                        help=f"also run {' and '.join(CONTACT_COMPARISON)} at each of these same r bounds (entries "
                             "named "
                             "DECODER@r=[R_MIN,R_MAX]) and plot their near-contact failures (contact_bounds.png)")
    parser.add_argument("--after-prefill", action="store_true",
                        help=f"also run {', '.join(prefill_verifying_decoders())} verifying after the prefill on "
                             "every step "
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
    add_camera_arguments(parser)
    add_sampling_arguments(parser)
    add_robot_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.evaluation.bench_run import run_bench  # torch and MuJoCo: only when it runs
    from vla_accel_ros.models.load import check_device
    from vla_accel_ros.sim.gl import check_rendering

    if args.device:  # before the sim or a model loads
        check_device(args.checkpoint or default_checkpoint(), args.device)
    if not check_rendering("bench"):  # no GL: one line saying what to set, before any work
        return 2
    options = bench_options(args)
    result = run_bench(options)
    if result is None:  # a checkpoint made for another arm: the reason is on stderr
        return 2
    print(result.report)
    print(f"bench: {options.episodes} episodes x {options.repeats} repeats x {result.settings} decoder settings in "
          f"{result.wall_s:.0f} s -> {options.out} (summary.json, table.md{''.join(', ' + p for p in result.plots)})")
    return 0


def bench_options(args: argparse.Namespace) -> BenchOptions:
    """The run the flags ask for; ValueError naming a bad ``--temperature`` or incremental-vision
    setting."""
    checkpoint = args.checkpoint or default_checkpoint()
    from vla_accel_ros.evaluation.bench_run import BenchOptions
    from vla_accel_ros.models.load import resolve_checkpoint
    from vla_accel_ros.runtime.builder import run_defaults

    model_temperature = run_defaults(resolve_checkpoint(checkpoint, unnorm_key=args.unnorm_key)).temperature

    try:  # the vision flags count only for the incremental entries
        vision = vision_config(args) if args.incremental_vision or args.reuse_kv else VisionReuseConfig()
    except ValueError as err:
        raise ValueError(f"{checkpoint}: {err}") from err
    decoders = None if args.decoders is None else tuple(d.strip() for d in args.decoders.split(",") if d.strip())
    return BenchOptions(
        out=args.out, checkpoint=checkpoint, unnorm_key=args.unnorm_key, device=args.device, decoders=decoders,
        episodes=args.episodes,
        seed=args.seed, repeats=args.repeats, max_steps=args.max_steps, threads=args.threads,
        sampling=sampling_config(args, model_temperature), sweep=not args.no_sweep, sweep_r=args.sweep_r,
        sweep_decoders=args.sweep_decoders, store=args.store, wa_checkpoint=args.wa_checkpoint,
        incremental_vision=args.incremental_vision, reuse_kv=args.reuse_kv, vision=vision,
        temperatures=args.temperature_sweep, sequential_draft=args.sequential_draft,
        contact_bounds=args.contact_bounds, after_prefill=args.after_prefill, fill_check=args.fill_check,
        fill_check_bounds=args.fill_check_bounds, allow_unmatched_robot=args.allow_unmatched_robot,
        cameras=args.cameras, stand_in_images=args.stand_in_images)


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
