"""``vla-accel fleet-bench --server ray --netns``: the Ray application on a cluster of two hosts,
rehearsed on one machine. Three network namespaces on one bridge (:data:`HOSTS`, a
:class:`~vla_accel_ros.ros.netns.NamespaceNetwork` the command makes) stand for three hosts:

- ``head``: ``ray start --head --node-ip-address HEAD --port 6379 --ray-client-server-port 10001
  --num-cpus C``, and the application deployed from there as a user deploys it on a cluster:
  ``vla-accel serve-openpi --engine ray --address ray://HEAD:10001 --host 0.0.0.0 --port 8000
  --replicas R``;
- ``worker``: ``ray start --address HEAD:6379 --node-ip-address WORKER --num-cpus C``;
- ``robots``: fleet-bench's replaying openpi clients
  (:func:`~vla_accel_ros.evaluation.fleet_servers.websocket_robots`) in a child process. Serve runs
  an HTTP proxy on every node that holds a replica, and a proxy routes a connection to a replica on
  its own node first, so robot i connects to the proxy of the i-th node holding a replica (in turn),
  as a load balancer in front of the nodes would spread them.

Each node offers C = ceil(most replicas / 2) x threads CPUs, so the replicas of a run spread over
both nodes. After each deployment the replicas' nodes are read from Serve's controller (each
replica's node address), and a run reports how many replicas each host held.

Ray's processes are stopped by their process ids: every process in the namespaces gets SIGTERM,
then SIGKILL, and the namespaces are deleted, also after an error. ``ray stop`` is not used: it
stops every Ray process of the machine by name (namespaces share one process table), other users'
clusters included. The cluster has an authentication token of its own (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN``, given to its nodes and drivers), whatever ``~/.ray/auth_token`` holds: Ray's
head turns token authentication on when that file exists, and a worker or driver without the
token is refused. The cluster's temporary directory (``--temp-dir``) is its own, so a
``ray.init()`` elsewhere on this machine does not find it. Needs root and ``ip`` (iproute2).

Run as ``python -m vla_accel_ros.evaluation.ray_cluster replicas|robots ...`` only by the cluster
itself (its children inside the namespaces).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from vla_accel_ros.core.errors import RunFailed

if TYPE_CHECKING:
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.evaluation.fleet_servers import RobotTrace, ServerBenchOptions

HOSTS = ("head", "worker", "robots")
RAY_HOSTS = ("head", "worker")
GCS_PORT = 6379
CLIENT_PORT = 10001
SERVE_PORT = 8000
OBJECT_STORE_BYTES = 100 * 2**20  # per node; Ray's least is 75 MiB, and the requests are a few kB
START_TIMEOUT_S = 120.0
DEPLOY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0


def cpus_per_node(replicas: Sequence[int], threads: int) -> int:
    """The CPUs each of the two nodes offers: the most replicas of a run, split over both."""
    return math.ceil(max(replicas) / len(RAY_HOSTS)) * threads


def ray_executable() -> str:
    """The ``ray`` command of this interpreter's environment."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise RunFailed("--netns needs Ray's ray command next to this Python or on PATH")
    return found


class RayCluster:
    """A Ray head and worker in two namespaces, the robots in a third (module docstring)."""

    def __init__(self, cpus: int, lan: Any) -> None:
        """``cpus``: each node's; ``lan``: the namespaces of :data:`HOSTS` (a ``NamespaceNetwork``,
        not yet entered: the cluster enters and removes it)."""
        self.cpus = cpus
        self.lan = lan
        self.head_ip = self.lan.addresses["head"]
        self.host_of = {ip: host for host, ip in self.lan.addresses.items()}
        self.temp = Path()
        self.env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))

    @property
    def client_address(self) -> str:
        return f"ray://{self.head_ip}:{CLIENT_PORT}"

    def __enter__(self) -> RayCluster:
        self.temp = Path(tempfile.mkdtemp(prefix="vla_ray_"))
        try:
            self.lan.__enter__()
            self._ray_start("head", ["--head", "--port", str(GCS_PORT), "--ray-client-server-port", str(CLIENT_PORT),
                                     "--include-dashboard", "false"])
            self._ray_start("worker", ["--address", f"{self.head_ip}:{GCS_PORT}"])
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._remove()

    def _remove(self) -> None:
        self.lan.remove()
        shutil.rmtree(self.temp, ignore_errors=True)

    def _ray_start(self, host: str, args: list[str]) -> None:
        """``ray start`` on ``host``: it returns once the node runs (its processes stay in the namespace)."""
        argv = [ray_executable(), "start", "--node-ip-address", self.lan.addresses[host], "--num-cpus", str(self.cpus),
                "--num-gpus", "0", "--object-store-memory", str(OBJECT_STORE_BYTES), "--temp-dir", str(self.temp),
                "--disable-usage-stats", *args]
        try:
            done = subprocess.run(self.lan.command(host, argv), capture_output=True, text=True,
                                  timeout=START_TIMEOUT_S, check=False, env=self.env)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"ray start on the {host} namespace did not finish in {START_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            raise RunFailed(f"ray start on the {host} namespace failed: {(done.stderr or done.stdout)[-800:]}")

    def _in_namespace(self, host: str, *args: str) -> list[str]:
        return self.lan.command(host, [sys.executable, "-m", "vla_accel_ros.evaluation.ray_cluster", *args])

    @contextmanager
    def application(self, opts: ServerBenchOptions, replicas: int) -> Iterator[list[str]]:
        """``serve-openpi --engine ray --address ray://HEAD:10001`` run on the head with ``replicas``
        replicas; yields the hosts of its replicas (one entry per replica) once all run."""
        log_path = self.temp / f"serve_openpi_x{replicas}.log"
        argv = [sys.executable, "-m", "vla_accel_ros.cli", "serve-openpi", "--engine", "ray",
                "--address", self.client_address, "--host", "0.0.0.0", "--port", str(SERVE_PORT),
                "--replicas", str(replicas), "--max-batch", str(opts.max_batch), "--batch-wait-ms",
                str(opts.batch_wait_ms), "--threads", str(opts.threads), "--decoder", opts.decoder]
        argv += ["--checkpoint", opts.checkpoint] if opts.checkpoint else []
        with open(log_path, "w") as log:
            server = subprocess.Popen(self.lan.command("head", argv), stdout=log, stderr=subprocess.STDOUT,
                                      env=self.env)
        try:
            yield self._replica_hosts(replicas, server, log_path)
        finally:
            server.send_signal(signal.SIGINT)  # serve-openpi shuts Serve down (application, replicas, proxies)
            try:
                server.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    def _replica_hosts(self, replicas: int, server: subprocess.Popen, log_path: Path) -> list[str]:
        """The replicas' hosts, asked of Serve from the head once ``replicas`` run (RunFailed when
        serve-openpi exits or the deadline passes first)."""
        asking = subprocess.Popen(self._in_namespace("head", "replicas", self.client_address, str(replicas),
                                                     str(DEPLOY_TIMEOUT_S)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        while asking.poll() is None and server.poll() is None:
            time.sleep(0.5)
        if asking.poll() is None:
            asking.kill()
            asking.wait()
        out, err = asking.communicate()
        if asking.returncode != 0 or server.poll() is not None:
            why = log_path.read_text()[-800:] if server.poll() is not None else err[-800:]
            raise RunFailed(f"the Ray application did not start {replicas} replica(s) on the cluster: {why}")
        return [self.host_of.get(ip, ip) for ip in json.loads(out)]

    def robots(self, streams: Sequence[Sequence[Observation]], max_opening: float, replica_hosts: Sequence[str],
               period_s: float, ticks: int) -> tuple[list[RobotTrace], float, int]:
        """The robots replaying ``streams`` from the robots namespace through the proxies of the
        replicas' hosts (robot i: the i-th host, in turn); their traces, the window's start, the
        failed requests (as :func:`~vla_accel_ros.evaluation.fleet_servers.websocket_robots`)."""
        from vla_accel_ros.evaluation.fleet_bench import save_streams
        from vla_accel_ros.evaluation.fleet_servers import RobotTrace

        streams_path, result_path = self.temp / "streams.npz", self.temp / "robots_result.json"
        save_streams([list(s) for s in streams], streams_path)
        hosts = sorted(set(replica_hosts), key=HOSTS.index)
        spec = {"streams": str(streams_path), "robots": len(streams), "max_opening": max_opening,
                "uris": [f"ws://{self.lan.addresses[h]}:{SERVE_PORT}" for h in hosts], "period_s": period_s,
                "ticks": ticks, "result": str(result_path)}
        spec_path = self.temp / "robots.json"
        spec_path.write_text(json.dumps(spec))
        result_path.unlink(missing_ok=True)
        timeout_s = DEPLOY_TIMEOUT_S + ticks * period_s * 4
        try:
            done = subprocess.run(self._in_namespace("robots", "robots", str(spec_path)), capture_output=True,
                                  text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"the robots in the robots namespace did not finish in {timeout_s:.0f} s") from None
        if done.returncode != 0 or not result_path.is_file():
            raise RunFailed(f"the robots in the robots namespace failed: {done.stderr[-800:]}")
        result = json.loads(result_path.read_text())
        traces = [RobotTrace(t["sent"], t["answered"], t["batch_sizes"]) for t in result["traces"]]
        return traces, float(result["start"]), int(result["failed"])


def replica_node_ips(address: str, replicas: int, timeout_s: float) -> list[str]:
    """The node address of each replica of the application, once ``replicas`` of them run."""
    import ray
    from ray.serve.context import _get_global_client  # Serve's controller: each replica's node
    from ray.serve.exceptions import RayServeException

    from vla_accel_ros.runtime.ray_serve import APP_NAME

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.init(address=address, log_to_driver=False)
            break
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    while True:
        try:
            client = _get_global_client()
            app = client.get_serve_details().get("applications", {}).get(APP_NAME) if client is not None else None
        except RayServeException:  # serve-openpi has not started Serve yet
            app = None
        if app is not None:
            running = [r for d in app["deployments"].values() for r in d["replicas"]
                       if str(r["state"]).endswith("RUNNING")]
            if str(app["status"]).endswith("RUNNING") and len(running) == replicas:
                return [str(r["node_ip"]) for r in running]
        if time.monotonic() > deadline:
            raise RunFailed(f"{len(running) if app else 0} of {replicas} replica(s) ran after {timeout_s:.0f} s")
        time.sleep(0.5)


def wait_until_healthy(uri: str, timeout_s: float) -> None:
    """Until the application answers ``/healthz`` through the proxy at ``uri`` (ws://HOST:PORT)."""
    from vla_accel_ros.runtime.openpi_server import HEALTH_PATH

    url = uri.replace("ws://", "http://", 1) + HEALTH_PATH
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RunFailed(f"no answer from {url} in {timeout_s:.0f} s")
        time.sleep(0.5)


def run_robots(spec: dict[str, Any]) -> None:
    """The robots child: ``spec``'s streams replayed against its proxies; the traces to its result file."""
    from vla_accel_ros.evaluation.fleet_bench import load_stream
    from vla_accel_ros.evaluation.fleet_servers import stream_requests, websocket_robots

    streams = [load_stream(Path(spec["streams"]), r) for r in range(spec["robots"])]
    for uri in spec["uris"]:
        wait_until_healthy(uri, DEPLOY_TIMEOUT_S)
    traces, start, failed = websocket_robots(spec["uris"], stream_requests(streams, spec["max_opening"]),
                                             spec["period_s"], spec["ticks"])
    Path(spec["result"]).write_text(json.dumps({
        "traces": [{"sent": t.sent, "answered": t.answered, "batch_sizes": t.batch_sizes} for t in traces],
        "start": start, "failed": failed}))


def main(argv: list[str]) -> int:
    if argv[:1] == ["replicas"] and len(argv) == 4:
        print(json.dumps(replica_node_ips(argv[1], int(argv[2]), float(argv[3]))), flush=True)
        return 0
    if argv[:1] == ["robots"] and len(argv) == 2:
        run_robots(json.loads(Path(argv[1]).read_text()))
        return 0
    print("usage: python -m vla_accel_ros.evaluation.ray_cluster replicas ADDRESS N TIMEOUT_S | robots SPEC.json",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
