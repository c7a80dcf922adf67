"""``vla-accel sim-speed``: sim steps per second with and without rendering.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="timed runs per setting (median reported)")
    parser.add_argument("--steps", type=int, default=400, help="control steps per run")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None, help="optional JSON output file")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.evaluation.sim_speed import steps_per_second  # MuJoCo: only when it runs
    from vla_accel_ros.sim.gl import check_rendering

    if not check_rendering("sim-speed"):  # no GL: one line saying what to set, before any work
        return 2
    result = {}
    for render in (False, True):
        rates = [steps_per_second(render, args.steps, args.image_size, seed=run_i) for run_i in range(args.runs)]
        result["with_render" if render else "without_render"] = {
            "steps_per_s_median": statistics.median(rates),
            "runs": rates,
        }
    print(
        f"sim throughput (median of {args.runs}): {result['without_render']['steps_per_s_median']:.0f} steps/s "
        f"without rendering, {result['with_render']['steps_per_s_median']:.0f} steps/s with "
        f"{args.image_size}x{args.image_size} rendering"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0
