"""``vla-accel fleet-bench``: the fleet benchmark. N simulated robots are served by one inference
process that batches their observations into shared forward passes, against N separate inference
processes, one per robot: actions per second and per-robot latency at each fleet size.
"""

from __future__ import annotations

import argparse

from vla_accel_ros.evaluation.fleet_bench import FleetBenchOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = FleetBenchOptions()
    parser.add_argument("--robots", default=",".join(map(str, d.robots)), help="fleet sizes, comma-separated")
    parser.add_argument("--out", default=d.out, help="output directory (summary.json, fleet.png)")
    parser.add_argument("--checkpoint", default=d.checkpoint, help="policy checkpoint (default: the shipped one)")
    parser.add_argument("--decoder", default=d.decoder, help="every robot's decoder")
    parser.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature, 0 = greedy")
    parser.add_argument("--steps", type=int, default=d.steps, help="observations per robot")
    parser.add_argument("--seed", type=int, default=d.seed, help="first robot's episode seed (then +1 each)")
    parser.add_argument("--threads", type=int, default=d.threads,
                        help="torch threads of each separate process (and of the fleet's, by default)")
    parser.add_argument("--server-threads", type=int, default=d.server_threads,
                        help="torch threads of the fleet's process at every fleet size, 1 included (0 = --threads)")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.evaluation.fleet_bench import fleet_bench  # MuJoCo and torch: only when it runs
    from vla_accel_ros.sim.gl import check_rendering

    if not check_rendering("fleet-bench"):
        return 2
    try:
        robots = tuple(int(n) for n in args.robots.split(",") if n.strip())
    except ValueError:
        raise ValueError(f"--robots must be comma-separated counts, got {args.robots!r}") from None
    opts = FleetBenchOptions(robots=robots, out=args.out, checkpoint=args.checkpoint, decoder=args.decoder,
                             temperature=args.temperature, steps=args.steps, seed=args.seed, threads=args.threads,
                             server_threads=args.server_threads)
    summary = fleet_bench(opts)
    print(f"fleet process: {opts.fleet_threads} torch thread(s); separate processes: {opts.threads} each")
    print("| robots | actions/s (batched) | separate | ratio | latency p50 / p99 ms (batched) | p99 / p99 at 1 "
          "| separate p50 / p99 | batched pass ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in summary["runs"]:
        vs_one = "-" if r["latency_p99_vs_one"] is None else f"{r['latency_p99_vs_one']:.2f}x"
        print(f"| {r['robots']} | {r['actions_per_s']:.0f} | {r['separate_actions_per_s']:.0f} | "
              f"{r['speedup_vs_separate']:.2f}x | {r['latency_ms_p50']:.1f} / {r['latency_ms_p99']:.1f} | {vs_one} | "
              f"{r['separate_latency_ms_p50']:.1f} / {r['separate_latency_ms_p99']:.1f} | "
              f"{r['stage_ms']['batched_pass']:.1f} |")
    print(f"fleet-bench -> {opts.out} (summary.json, fleet.png)")
    return 0
