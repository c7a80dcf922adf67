"""``vla-accel fleet-bench``: the fleet benchmark. N simulated robots are served by one inference
process that batches their observations into shared forward passes, against N separate inference
processes, one per robot: actions per second and per-robot latency at each fleet size.

With ``--server dds,openpi,ray`` it measures servers instead (:mod:`vla_accel_ros.evaluation.fleet_servers`):
N robots replaying recorded observations at the control rate against one ``vla_inference_node``
(DDS), one ``serve-openpi`` process, and the Ray Serve application (``--replicas``), all in one run:
actions/s, round-trip p50/p99, ticks without a fresh action; one table, one plot, summary.json.
``--server ray --netns`` runs Ray on a head and a worker in two network namespaces, the robots in a
third (:mod:`vla_accel_ros.evaluation.ray_cluster`), and names each run's replicas per host.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vla_accel_ros.evaluation.fleet_bench import FleetBenchOptions
from vla_accel_ros.evaluation.fleet_servers import SERVER_KINDS, ServerBenchOptions

if TYPE_CHECKING:
    from vla_accel_ros.core.observation import Observation


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
    servers = ServerBenchOptions()
    parser.add_argument("--server", default="", help="server kinds to compare, comma-separated, among "
                                                     f"{','.join(SERVER_KINDS)} (default: the in-process comparison)")
    parser.add_argument("--replicas", default="1", help="--server ray: replica counts, comma-separated")
    parser.add_argument("--ticks", type=int, default=servers.ticks, help="--server: control periods measured per run")
    parser.add_argument("--rate", type=float, default=1 / servers.period_s, help="--server: control rate (Hz)")
    parser.add_argument("--max-batch", type=int, default=servers.max_batch, help="--server ray: most robots a round")
    parser.add_argument("--batch-wait-ms", type=float, default=servers.batch_wait_ms,
                        help="--server ray: how long a round waits for more robots")
    parser.add_argument("--kill-replica-at-tick", type=int, default=0,
                        help="--server ray: kill one replica at this tick of each run (Ray starts another); "
                             "the summary counts the failed requests and the recovery time (0: none)")
    parser.add_argument("--netns", action="store_true",
                        help="--server ray: a Ray cluster of a head and a worker in two network namespaces, the "
                             "robots in a third, all on one bridge (needs root and iproute2)")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.evaluation.fleet_bench import fleet_bench  # MuJoCo and torch: only when it runs
    from vla_accel_ros.sim.gl import check_rendering

    if not check_rendering("fleet-bench"):
        return 2
    robots = _counts(args.robots, "--robots")
    if args.server:
        return _run_servers(args, robots)
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


def _counts(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated counts, got {text!r}") from None


def _run_servers(args: argparse.Namespace, robots: tuple[int, ...]) -> int:
    import contextlib
    import json
    import os
    from dataclasses import asdict
    from pathlib import Path

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_checkpoint, default_urdf
    from vla_accel_ros.evaluation.fleet_bench import record_streams
    from vla_accel_ros.evaluation.fleet_servers import plot_servers, run_label, server_bench
    from vla_accel_ros.models.load import load_policy
    from vla_accel_ros.ros.fleet_clients import dds_run
    from vla_accel_ros.runtime.ray_options import FLEET_INSTALL

    if not args.rate > 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    opts = ServerBenchOptions(servers=tuple(s.strip() for s in args.server.split(",") if s.strip()), robots=robots,
                              replicas=_counts(args.replicas, "--replicas"), out=args.out,
                              checkpoint=args.checkpoint, decoder=args.decoder, steps=args.steps, seed=args.seed,
                              threads=args.threads, ticks=args.ticks, period_s=1 / args.rate,
                              max_batch=args.max_batch, batch_wait_ms=args.batch_wait_ms,
                              kill_replica_at_tick=args.kill_replica_at_tick, netns=args.netns)
    if opts.netns and os.geteuid() != 0:
        raise ValueError("--netns needs root (it makes network namespaces)")
    if "ray" in opts.servers:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError(f"--server ray needs Ray Serve, which is not installed ({FLEET_INSTALL})") from None
    kin = ArmKinematics(default_urdf())
    image_size = int(load_policy(opts.checkpoint or default_checkpoint()).config.image_size)
    streams = record_streams(max(robots), opts.steps, opts.seed, image_size)

    def dds(robot_streams: Sequence[Sequence[Observation]], o: ServerBenchOptions
            ) -> tuple[list[tuple[list[float], list[float]]], float]:
        return dds_run(robot_streams, checkpoint=o.checkpoint, decoder=o.decoder, threads=o.threads,
                       period_s=o.period_s, ticks=o.ticks)

    with contextlib.ExitStack() as stack:
        cluster = None
        if opts.netns:  # a Ray head and worker in two network namespaces, the robots in a third
            from vla_accel_ros.evaluation.ray_cluster import HOSTS, RayCluster, cpus_per_node
            from vla_accel_ros.ros.netns import NamespaceNetwork, NetworkNamespaceError

            try:
                lan = NamespaceNetwork(f"vla_ray{os.getpid()}", HOSTS)
                cluster = stack.enter_context(RayCluster(cpus_per_node(opts.replicas, opts.threads), lan))
            except NetworkNamespaceError as error:
                raise ValueError(f"--netns: {error}") from None
        runs = server_bench(opts, streams, float(kin.gripper_limits.upper.max()), dds, cluster)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {**asdict(opts), "servers": list(opts.servers), "robots": list(robots), "replicas": list(opts.replicas)}
    (out / "summary.json").write_text(json.dumps({"runs": runs, "options": options}, indent=2) + "\n")
    plot_servers(runs, out / "fleet_servers.png")
    print(f"{opts.decoder}, {args.rate:g} Hz control, {opts.ticks} ticks per run, {opts.threads} torch thread(s) "
          f"per server process / replica")
    print("| server | robots | actions/s | round trip p50 / p99 ms | ticks without a fresh action | robots per round |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        fault = (f"; {r['failed_requests']} failed requests, recovered in {r['recovery_s']:.2f} s"
                 if "recovery_s" in r else "")
        missed = f"{r['ticks_without_fresh_action']} ({1 - r['fresh_tick_fraction']:.0%})"
        batch = f"{r['mean_batch_size']:.1f}" if "mean_batch_size" in r else "-"
        print(f"| {run_label(r)} | {r['robots']} | {r['actions_per_s']:.1f} | {r['rtt_ms_p50']:.1f} / "
              f"{r['rtt_ms_p99']:.1f} | {missed}{fault} | {batch} |")
    for r in runs:
        if "replica_hosts" in r:
            placed = ", ".join(f"{host} {count}" for host, count in r["replica_hosts"].items())
            print(f"{run_label(r)}, {r['robots']} robot(s) in the robots namespace: replicas on {placed}")
    print(f"fleet-bench -> {opts.out} (summary.json, fleet_servers.png)")
    return 0
