"""``vla-accel fleet-bench --server dds,openpi,ray``: N robots against one server, each kind in turn,
in one run.

Every robot is a lightweight client replaying its recorded observations
(:func:`~vla_accel_ros.evaluation.fleet_bench.record_streams`) at the control rate: at each tick
it sends the tick's observation unless its previous request is still unanswered; an answer that
comes after the next tick began is followed at once by a request with the newest observation (as
the node's inference worker decodes the newest observation as soon as it is free), and the ticks in
between are skipped. A DDS robot publishes at every tick, as a control node does. Server kinds:

- ``dds``: one ``vla_inference_node`` serving all N robots (its batched rounds), the robots
  publishing over DDS (:mod:`vla_accel_ros.ros.fleet_clients`);
- ``openpi``: one ``vla-accel serve-openpi`` process, one request at a time (unbatched);
- ``ray``: ``serve-openpi --engine ray`` (:mod:`vla_accel_ros.runtime.ray_serve`) with ``replicas``
  replicas, each batching its robots' requests into one round; with ``netns``, on a Ray cluster of a
  head and a worker in two network namespaces, the robots in a third
  (:mod:`vla_accel_ros.evaluation.ray_cluster`).

Per run (kind, robots, replicas): ``actions_per_s`` (answers of all robots / the measured window),
``rtt_ms_p50`` / ``rtt_ms_p99`` (request sent to reply read), ``ticks_without_fresh_action`` (ticks
in whose control period no answer arrived, all robots) and their ``fresh_tick_fraction``; for Ray,
``mean_batch_size`` (the robots in a request's round, as its ``server_timing`` says); for the
websocket kinds ``failed_requests`` (lost or refused: the robot reconnects, as the node does). A
robot's clock starts after its warm-up answers (connection and warm-up are not measured). With
``kill_replica_at_tick``, one Ray replica is killed at that tick of each Ray run (Ray Serve starts
another) and the run adds ``replica_killed_at_tick`` and ``recovery_s`` (from the kill to the last
robot's first answer to a request sent after it). A run on the namespace cluster adds
``replica_hosts`` (replicas per host, as Serve's controller places them).
"""

import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.specs import WorldAware

SERVER_KINDS = ("dds", "openpi", "ray")
SERVER_START_TIMEOUT_S = 180.0


@dataclass
class RobotTrace:
    """One robot's measured window: when each request went out and its answer came back (monotonic s)."""

    sent: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)  # the server's rounds, where it says (Ray)


def trace_summary(traces: Sequence[RobotTrace], start: float, ticks: int, period_s: float) -> dict[str, Any]:
    """The run's figures (module docstring) over the window of ``ticks`` control periods from ``start``."""
    rtts = [(a - s) * 1e3 for t in traces for s, a in zip(t.sent, t.answered, strict=False)]
    edges = start + period_s * np.arange(ticks + 1)
    missed = 0
    for trace in traces:
        per_tick = np.histogram(np.asarray(trace.answered, dtype=float), bins=edges)[0]
        missed += int(np.sum(per_tick == 0))
    answers = sum(int(np.sum((np.asarray(t.answered) > start) & (np.asarray(t.answered) <= edges[-1])))
                  for t in traces)
    total_ticks = ticks * len(traces)
    batch_sizes = [b for t in traces for b in t.batch_sizes]
    batching = {"mean_batch_size": float(np.mean(batch_sizes))} if batch_sizes else {}
    return {**batching, "actions_per_s": answers / (ticks * period_s),
            "rtt_ms_p50": float(np.percentile(rtts, 50)) if rtts else math.inf,
            "rtt_ms_p99": float(np.percentile(rtts, 99)) if rtts else math.inf,
            "ticks_without_fresh_action": missed, "fresh_tick_fraction": 1 - missed / total_ticks}


def openpi_request(obs: Observation, max_opening: float) -> dict[str, Any]:
    """``obs`` as an openpi request under LIBERO's keys (the gripper as a fraction open)."""
    fraction = float(obs.gripper) / max_opening if max_opening > 0 else 1.0
    return {"observation/image": np.ascontiguousarray(obs.image, dtype=np.uint8),
            "observation/state": np.concatenate([obs.joint_pos, [fraction]]).astype(np.float32),
            "prompt": obs.instruction}


class OpenPIClient:
    """openpi's client protocol (as openpi-client's ``WebsocketClientPolicy`` speaks it), closable."""

    def __init__(self, uri: str) -> None:
        from openpi_client import msgpack_numpy
        from websockets.sync.client import connect

        self._msgpack = msgpack_numpy
        self._packer = msgpack_numpy.Packer()
        self._ws = connect(uri, compression=None, max_size=None, open_timeout=30)
        self.metadata = msgpack_numpy.unpackb(self._ws.recv(timeout=30))

    def infer(self, request: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        self._ws.send(self._packer.pack(request))
        reply = self._ws.recv(timeout=timeout_s)
        if isinstance(reply, str):
            raise RuntimeError(f"the server refused a request: {reply}")
        return dict(self._msgpack.unpackb(reply))

    def close(self) -> None:
        self._ws.close()


@dataclass
class Fault:
    """A fault injected into a run: ``inject()`` at ``at_tick`` of the measured window."""

    at_tick: int
    inject: Callable[[], None]
    at: float = math.nan  # when it was injected (monotonic s)


def websocket_robots(uri: str | Sequence[str], requests: Sequence[Sequence[dict[str, Any]]], period_s: float,
                     ticks: int, fault: Fault | None = None) -> tuple[list[RobotTrace], float, int]:
    """One openpi client per robot, in threads, replaying ``requests`` (one list per robot) at the
    control rate for ``ticks`` periods after three warm-up answers each; with several ``uri``, robot
    i connects to the i-th in turn. A request that fails (the connection lost, the server's refusal)
    is counted and the robot reconnects, as the node does, at most every 0.1 s. Returns their
    traces, the window's start and the failed requests."""
    uris = [uri] if isinstance(uri, str) else list(uri)
    robot_uris = [uris[i % len(uris)] for i in range(len(requests))]
    clients: list[OpenPIClient | None] = [OpenPIClient(u) for u in robot_uris]
    failed = [0] * len(requests)
    try:
        for client, stream in zip(clients, requests, strict=True):
            for request in stream[:3]:  # warm-up: the server's first decodes for this robot
                assert client is not None
                client.infer(request)
        traces = [RobotTrace() for _ in requests]
        start = time.monotonic() + 0.2

        def replay(index: int) -> None:
            trace, stream = traces[index], requests[index]
            tick = 0
            while tick < ticks:
                time.sleep(max(0.0, start + tick * period_s - time.monotonic()))
                sent = time.monotonic()
                try:
                    client = clients[index] or OpenPIClient(robot_uris[index])
                    clients[index] = client
                    reply = client.infer(stream[tick % len(stream)], timeout_s=5.0)
                    timing = reply.get("server_timing", {})
                    if "batch_size" in timing:
                        trace.batch_sizes.append(int(timing["batch_size"]))
                    trace.sent.append(sent)
                    trace.answered.append(time.monotonic())
                except Exception:  # lost, refused or not reachable: reconnect at a later tick
                    failed[index] += 1
                    lost, clients[index] = clients[index], None
                    if lost is not None:
                        lost.close()
                    time.sleep(0.1)
                # the next tick's observation, or, when the answer came after it began, the newest one at once
                tick = max(tick + 1, math.floor((time.monotonic() - start) / period_s))

        threads = [threading.Thread(target=replay, args=(i,), daemon=True) for i in range(len(requests))]
        timer = None
        if fault is not None:
            def inject() -> None:
                fault.at = time.monotonic()
                fault.inject()

            timer = threading.Timer(max(0.0, start + fault.at_tick * period_s - time.monotonic()), inject)
            timer.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if timer is not None:
            timer.join()
    finally:
        for client in clients:
            if client is not None:
                client.close()
    return traces, start, sum(failed)


def recovery_s(traces: Sequence[RobotTrace], fault: Fault) -> float:
    """From the fault to the last robot's first answer to a request sent after it (inf: none came)."""
    firsts = [next((a for s, a in zip(t.sent, t.answered, strict=True) if s > fault.at), math.inf) for t in traces]
    return max(firsts) - fault.at


def wait_for_port(port: int, timeout_s: float, alive: Callable[[], bool]) -> bool:
    """Whether 127.0.0.1:``port`` accepts a connection within ``timeout_s`` while ``alive()``."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


@contextmanager
def openpi_process(checkpoint: str, decoder: str, threads: int, port: int) -> Iterator[str]:
    """``vla-accel serve-openpi`` (the websockets engine) in a child process; yields its address."""
    argv = [sys.executable, "-m", "vla_accel_ros.cli", "serve-openpi", "--port", str(port), "--decoder", decoder,
            "--threads", str(threads)] + (["--checkpoint", checkpoint] if checkpoint else [])
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if not wait_for_port(port, SERVER_START_TIMEOUT_S, alive=lambda: process.poll() is None):
            why = (process.stderr.read() if process.stderr and process.poll() is not None else "") or "no answer"
            raise RuntimeError(f"serve-openpi did not listen on port {port}: {why[-500:]}")
        yield f"ws://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def ray_application(opts: Any, replicas: int) -> Iterator[str]:
    """The Ray Serve application (a local Ray, started once per process) with ``replicas`` replicas."""
    from vla_accel_ros.models.openpi.config import LIBERO
    from vla_accel_ros.runtime import ray_serve
    from vla_accel_ros.runtime.builder import RunnerConfig
    from vla_accel_ros.runtime.ray_options import RayServeOptions

    config = RunnerConfig(checkpoint=opts.checkpoint, decoder=opts.decoder, torch_threads=opts.threads)
    options = RayServeOptions(replicas=replicas, max_batch=opts.max_batch, batch_wait_ms=opts.batch_wait_ms,
                              cpus_per_replica=float(opts.threads))
    port = ray_serve.start(config, LIBERO, {"server": "fleet-bench"}, options, host="127.0.0.1", port=0)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        ray_serve.stop()


def kill_a_replica() -> None:
    """Kill one replica of the Ray application (Ray Serve's controller starts another)."""
    import ray

    from vla_accel_ros.runtime import ray_serve

    ray.kill(ray_serve.replica_actors()[0], no_restart=False)


@dataclass(frozen=True)
class ServerBenchOptions:
    """``fleet-bench --server``: which servers, how many robots, for how long (module docstring)."""

    servers: tuple[str, ...] = SERVER_KINDS
    robots: tuple[int, ...] = (1, 2, 4, 8)
    replicas: tuple[int, ...] = (1,)
    out: str = "outputs/fleet_bench"
    checkpoint: str = ""
    decoder: str = WorldAware.name
    steps: int = 40  # recorded observations per robot (replayed in a loop)
    seed: int = 0
    threads: int = 1  # torch threads of each server process / replica
    ticks: int = 100  # control periods measured per run
    period_s: float = 0.05
    max_batch: int = 16
    batch_wait_ms: float = 5.0
    kill_replica_at_tick: int = 0  # ray: one replica killed at this tick of each run (0: none)
    netns: bool = False  # ray: on a head and a worker in network namespaces, the robots in a third

    def __post_init__(self) -> None:
        unknown = [s for s in self.servers if s not in SERVER_KINDS]
        if not self.servers or unknown:
            raise ValueError(f"--server must list kinds among {', '.join(SERVER_KINDS)}, got {list(self.servers)}")
        if not self.robots or any(n < 1 for n in self.robots) or not self.replicas or any(
                r < 1 for r in self.replicas):
            raise ValueError(f"--robots and --replicas must be positive counts, got {self.robots}, {self.replicas}")
        if self.ticks < 2 or self.steps < 1 or self.threads < 1 or not self.period_s > 0:
            raise ValueError("--ticks must be >= 2, --steps and --threads >= 1")
        if self.netns and "ray" not in self.servers:
            raise ValueError("--netns needs --server ray (it runs the Ray cluster's head, worker and robots in "
                             "network namespaces)")
        if self.netns and self.kill_replica_at_tick:
            raise ValueError("--kill-replica-at-tick does not run with --netns (the robots and the cluster are in "
                             "namespaces of their own)")


# runs the DDS kind: (the robots' streams, the options) -> (each robot's (sent, answered) times, the window's start)
DdsRun = Callable[[Sequence[Sequence[Observation]], ServerBenchOptions],
                  tuple[list[tuple[list[float], list[float]]], float]]


def server_bench(opts: ServerBenchOptions, streams: Sequence[Sequence[Observation]], max_opening: float,
                 dds: DdsRun | None, cluster: Any = None, progress: bool = True) -> list[dict[str, Any]]:
    """Every (server kind, replica count, robots) run, in that order; ``dds`` runs the DDS kind
    (:func:`vla_accel_ros.ros.fleet_clients.dds_run`, passed in by the command: evaluation imports no ROS).
    With ``opts.netns`` the Ray runs are on ``cluster``, a running
    :class:`~vla_accel_ros.evaluation.ray_cluster.RayCluster` (two hosts in network namespaces, made
    by the command), and each adds ``replica_hosts`` (replicas per host)."""
    from vla_accel_ros.core.progress import progress_bar

    if opts.netns and cluster is None:
        raise ValueError("--netns needs the namespace cluster")
    requests = stream_requests(streams, max_opening)
    plan = [(kind, replicas, n) for kind in opts.servers for replicas in (opts.replicas if kind == "ray" else (1,))
            for n in opts.robots]
    runs = []
    for kind, replicas, n in progress_bar(plan, desc="server runs", disable=not progress):
        if kind == "ray" and opts.netns:
            with cluster.application(opts, replicas) as hosts:
                traces, start, failed = cluster.robots(streams[:n], max_opening, hosts, opts.period_s, opts.ticks)
            runs.append({"server": kind, "robots": n, "replicas": replicas,
                         **trace_summary(traces, start, opts.ticks, opts.period_s), "failed_requests": failed,
                         "replica_hosts": {h: hosts.count(h) for h in sorted(set(hosts))}})
        else:
            runs.append(_local_run(opts, kind, replicas, n, streams, requests, dds))
    return runs


def _local_run(opts: ServerBenchOptions, kind: str, replicas: int, n: int, streams: Sequence[Sequence[Observation]],
               requests: Sequence[Sequence[dict[str, Any]]], dds: DdsRun | None) -> dict[str, Any]:
    """One run with the server on this host (the Ray application on a local Ray)."""
    fault: Fault | None = None
    if kind == "dds":
        if dds is None:
            raise ValueError("--server dds needs ROS 2 (rclpy)")
        times, start = dds(streams[:n], opts)
        traces = [RobotTrace(sent, answered) for sent, answered in times]
    else:
        serving = (ray_application(opts, replicas) if kind == "ray" else
                   openpi_process(opts.checkpoint, opts.decoder, opts.threads, free_port()))
        if kind == "ray" and opts.kill_replica_at_tick:
            fault = Fault(opts.kill_replica_at_tick, kill_a_replica)
        failed = 0
        with serving as uri:
            traces, start, failed = websocket_robots(uri, requests[:n], opts.period_s, opts.ticks, fault)
    run = {"server": kind, "robots": n, "replicas": replicas,
           **trace_summary(traces, start, opts.ticks, opts.period_s)}
    if kind != "dds":
        run["failed_requests"] = failed
    if fault is not None:
        run.update(replica_killed_at_tick=fault.at_tick, recovery_s=recovery_s(traces, fault))
    return run


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stream_requests(streams: Sequence[Sequence[Observation]], max_opening: float) -> list[list[dict[str, Any]]]:
    return [[openpi_request(obs, max_opening) for obs in stream] for stream in streams]


def plot_servers(runs: list[dict[str, Any]], path: Path) -> None:
    """actions/s and p99 round trip against the robots, one line per server kind (and replica count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    labels = sorted({run_label(r) for r in runs})
    for label in labels:
        mine = sorted((r for r in runs if run_label(r) == label), key=lambda r: r["robots"])
        n = [r["robots"] for r in mine]
        ax1.plot(n, [r["actions_per_s"] for r in mine], "o-", label=label)
        ax2.plot(n, [r["rtt_ms_p99"] for r in mine], "o-", label=label)
    ax1.set(xlabel="robots", ylabel="actions / s (all robots)", title="throughput")
    ax2.set(xlabel="robots", ylabel="ms", title="round trip p99", yscale="log")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_label(run: dict[str, Any]) -> str:
    if run["server"] != "ray":
        return str(run["server"])
    return f"ray x{run['replicas']}" + (", 2-host cluster" if "replica_hosts" in run else "")
