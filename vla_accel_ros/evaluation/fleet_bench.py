"""``vla-accel fleet-bench``: N robots on one inference process (batched rounds) against N separate
inference processes, in the same run.

Each robot gets its own stream of observations, recorded once from the scripted expert in the sim
(its own seed), so both set-ups decode exactly the same inputs, open loop. For each N:

- fleet: one process, a :class:`~vla_accel_ros.runtime.fleet.FleetRunner` over N runners; every
  round decodes one observation of each robot; a robot's latency is its round's time. Its torch
  threads are ``server_threads`` (0: ``threads``), at every N, N = 1 included;
- separate: N processes started together, each one runner over its robot's stream (what N
  single-robot inference nodes on one host would be), ``threads`` torch threads each; latency per step.

Aggregate actions per second = N x steps / wall time. ``summary.json``:
``{"runs": [{"robots", "actions_per_s", "latency_ms_p50", "latency_ms_p99",
"separate_actions_per_s", "separate_latency_ms_p50", "separate_latency_ms_p99", "speedup_vs_separate",
"latency_p99_vs_one", "stage_ms", "server_threads", "separate_threads"}, ...]}``: ``latency_p99_vs_one``
is the fleet's p99 over its p99 at N = 1 (when 1 is among the sizes), ``stage_ms`` the mean ms of
each stage of a round (:data:`~vla_accel_ros.runtime.fleet.STAGES`).
Run as ``python -m vla_accel_ros.evaluation.fleet_bench WORKER.json`` only by the benchmark itself
(a separate process's worker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.seeds import EVAL_SEED_START
from vla_accel_ros.decoding.specs import WorldAware

STREAMS_FILE = "streams.npz"


@dataclass(frozen=True)
class FleetBenchOptions:
    robots: tuple[int, ...] = (1, 2, 4, 8)
    out: str = "outputs/fleet_bench"
    checkpoint: str = ""
    decoder: str = WorldAware.name
    temperature: float = 0.0
    steps: int = 40  # observations per robot
    seed: int = EVAL_SEED_START
    threads: int = 1  # torch threads of each separate process (and of the fleet, unless server_threads)
    server_threads: int = 0  # torch threads of the fleet's process; 0 = threads

    def __post_init__(self) -> None:
        if not self.robots or any(n < 1 for n in self.robots):
            raise ValueError(f"--robots must be positive counts, got {self.robots}")
        if self.steps < 2:
            raise ValueError(f"--steps must be >= 2, got {self.steps}")
        if self.threads < 1 or self.server_threads < 0:
            raise ValueError(f"--threads must be >= 1 and --server-threads >= 0, got {self.threads}, "
                             f"{self.server_threads}")

    @property
    def fleet_threads(self) -> int:
        return self.server_threads or self.threads


def record_streams(n: int, steps: int, seed: int, image_size: int) -> list[list[Observation]]:
    """``steps`` observations of the scripted expert's episode for each of ``n`` seeds."""
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
    from vla_accel_ros.sim.expert import ScriptedExpert

    streams = []
    with PickCubeEnv(SimConfig(image_size=image_size, max_steps=steps + 1)) as env:
        for r in range(n):
            obs = env.reset(seed + r)
            expert = ScriptedExpert(env)
            stream = [obs]
            while len(stream) < steps:
                obs, _ = env.step(expert.act(obs))
                stream.append(obs)
            streams.append(stream)
    return streams


def save_streams(streams: list[list[Observation]], path: Path) -> None:
    arrays: dict[str, Any] = {}
    for r, stream in enumerate(streams):
        arrays[f"images_{r}"] = np.stack([o.image for o in stream])
        arrays[f"joints_{r}"] = np.stack([o.joint_pos for o in stream])
        arrays[f"gripper_{r}"] = np.array([o.gripper for o in stream])
        arrays[f"stamp_{r}"] = np.array([o.stamp for o in stream])
        arrays[f"instruction_{r}"] = np.array(stream[0].instruction)
    np.savez(path, **arrays)


def load_stream(path: Path, robot: int) -> list[Observation]:
    with np.load(path) as data:  # no pickle: plain arrays and a unicode string
        images, joints = data[f"images_{robot}"], data[f"joints_{robot}"]
        gripper, stamp = data[f"gripper_{robot}"], data[f"stamp_{robot}"]
        instruction = str(data[f"instruction_{robot}"])
    return [Observation(images[t], instruction, joints[t], float(gripper[t]), float(stamp[t]))
            for t in range(len(images))]


def _runners(opts: FleetBenchOptions, n: int, policy: Any, threads: int) -> list[Any]:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner

    kin = ArmKinematics(default_urdf())
    config = RunnerConfig(checkpoint=opts.checkpoint, decoder=opts.decoder, temperature=opts.temperature,
                          vision=None, torch_threads=threads)
    return [build_runner(config, kin, policy=policy) for _ in range(n)]


def fleet_run(opts: FleetBenchOptions, policy: Any, streams: list[list[Observation]]) -> dict[str, Any]:
    """One process (``fleet_threads`` torch threads), one batched round per step of every robot."""
    import torch

    from vla_accel_ros.runtime.fleet import STAGES, FleetRunner

    fleet = FleetRunner(_runners(opts, len(streams), policy, opts.fleet_threads))  # sets the threads
    try:
        fleet.step([(r, s[0]) for r, s in enumerate(streams)])  # warm-up round (not timed)
        rounds, stages = [], []
        started = time.perf_counter()
        for t in range(1, opts.steps):
            t0 = time.perf_counter()
            fleet.step([(r, s[t]) for r, s in enumerate(streams)])
            rounds.append((time.perf_counter() - t0) * 1e3)
            stages.append(fleet.last_stages)
        wall = time.perf_counter() - started
    finally:
        torch.set_num_threads(opts.threads)
    actions = len(streams) * (opts.steps - 1)
    return {"actions_per_s": actions / wall, "latency_ms_p50": float(np.percentile(rounds, 50)),
            "latency_ms_p99": float(np.percentile(rounds, 99)),
            "stage_ms": {k: float(np.mean([s[k] for s in stages])) for k in STAGES}}


def separate_run(opts: FleetBenchOptions, n: int, streams_path: Path, out: Path) -> dict[str, float]:
    """N processes at once, each one runner over its robot's stream."""
    jobs = []
    for r in range(n):
        spec = out / f"worker_{n}_{r}.json"
        spec.write_text(json.dumps({"options": asdict(opts), "robot": r, "streams": str(streams_path),
                                    "result": str(out / f"worker_{n}_{r}_result.json")}))
        jobs.append(subprocess.Popen([sys.executable, "-m", "vla_accel_ros.evaluation.fleet_bench", str(spec)]))
    codes = [job.wait() for job in jobs]
    if any(codes):
        raise RuntimeError(f"a separate inference process failed (exit codes {codes})")
    results = [json.loads((out / f"worker_{n}_{r}_result.json").read_text()) for r in range(n)]
    wall = max(x["end"] for x in results) - min(x["start"] for x in results)
    latencies = np.concatenate([x["latency_ms"] for x in results])
    return {"separate_actions_per_s": sum(len(x["latency_ms"]) for x in results) / wall,
            "separate_latency_ms_p50": float(np.percentile(latencies, 50)),
            "separate_latency_ms_p99": float(np.percentile(latencies, 99))}


def _separate_worker(spec_path: str) -> int:
    import torch

    from vla_accel_ros.core.resources import default_checkpoint
    from vla_accel_ros.models.load import load_policy

    spec = json.loads(Path(spec_path).read_text())
    opts = FleetBenchOptions(**{**spec["options"], "robots": tuple(spec["options"]["robots"])})
    torch.set_num_threads(opts.threads)
    policy = load_policy(opts.checkpoint or default_checkpoint())
    (runner,) = _runners(opts, 1, policy, opts.threads)
    stream = load_stream(Path(spec["streams"]), spec["robot"])
    runner(stream[0])  # warm-up (not timed)
    latencies = []
    start = time.time()  # wall clock: comparable across the processes
    for obs in stream[1:]:
        t0 = time.perf_counter()
        runner(obs)
        latencies.append((time.perf_counter() - t0) * 1e3)
    Path(spec["result"]).write_text(json.dumps({"start": start, "end": time.time(), "latency_ms": latencies}))
    return 0


def fleet_bench(opts: FleetBenchOptions, progress: bool = True) -> dict[str, Any]:
    import torch

    from vla_accel_ros.core.progress import progress_bar
    from vla_accel_ros.core.resources import default_checkpoint
    from vla_accel_ros.models.load import load_policy

    torch.set_num_threads(opts.threads)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    policy = load_policy(opts.checkpoint or default_checkpoint())
    streams = record_streams(max(opts.robots), opts.steps, opts.seed, int(policy.config.image_size))
    streams_path = out / STREAMS_FILE
    save_streams(streams, streams_path)
    runs = []
    for n in progress_bar(opts.robots, desc="fleet sizes", disable=not progress):
        run = {"robots": n, **fleet_run(opts, policy, streams[:n]), **separate_run(opts, n, streams_path, out)}
        run["speedup_vs_separate"] = run["actions_per_s"] / run["separate_actions_per_s"]
        run.update(server_threads=opts.fleet_threads, separate_threads=opts.threads)
        runs.append(run)
    one = next((r for r in runs if r["robots"] == 1), None)
    for run in runs:
        run["latency_p99_vs_one"] = run["latency_ms_p99"] / one["latency_ms_p99"] if one else None
    summary = {"runs": runs, "options": {**asdict(opts), "robots": list(opts.robots)}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_fleet(runs, out / "fleet.png")
    return summary


def plot_fleet(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["robots"] for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(n, [r["actions_per_s"] for r in runs], "o-", label="one process, batched rounds")
    ax1.plot(n, [r["separate_actions_per_s"] for r in runs], "s--", label="one process per robot")
    ax1.set(xlabel="robots", ylabel="actions / s (all robots)", title="throughput")
    ax1.legend(fontsize=8)
    ax2.plot(n, [r["latency_ms_p99"] for r in runs], "o-", label="batched p99")
    ax2.plot(n, [r["separate_latency_ms_p99"] for r in runs], "s--", label="separate p99")
    ax2.set(xlabel="robots", ylabel="ms", title="per-robot latency")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(_separate_worker(sys.argv[1]))
