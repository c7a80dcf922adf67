"""fleet-bench --server ray --netns: a Ray head and worker in two network namespaces, the robots in a
third, on one bridge; the replicas placed on both nodes, the robots answered through the proxies, and
everything stopped and removed afterwards, also after an error. Needs root, iproute2 and Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vla_accel_ros.ros.netns import NamespaceNetwork

needs_namespaces = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                      reason="network namespaces need root and iproute2")


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout


def processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:  # it exited meanwhile
            pass
    return found


def test_netns_is_refused_without_ray_or_with_a_killed_replica():
    from vla_accel_ros.evaluation.fleet_servers import ServerBenchOptions

    with pytest.raises(ValueError, match="--netns needs --server ray"):
        ServerBenchOptions(servers=("openpi", "dds"), netns=True)
    with pytest.raises(ValueError, match="--kill-replica-at-tick does not run with --netns"):
        ServerBenchOptions(servers=("ray",), netns=True, kill_replica_at_tick=20)


@needs_namespaces
def test_hosts_reach_each_other_and_an_error_stops_their_processes_and_removes_them():
    with pytest.raises(RuntimeError, match="on purpose"):
        with NamespaceNetwork("vla_lan_test", ("a", "b")) as lan:
            assert {"vla_lan_test_a", "vla_lan_test_b", "vla_lan_test_lan"} <= set(namespaces().split())
            connect = f"import socket; socket.create_connection(('{lan.addresses['b']}', 9), timeout=2)"
            reached = subprocess.run(lan.command("a", [sys.executable, "-c", connect]), capture_output=True, text=True)
            # nothing listens on port 9: a refused connection (not a timeout) means b's host answered
            assert "ConnectionRefusedError" in reached.stderr, reached.stderr
            sleeper = subprocess.Popen(lan.command("b", ["sleep", "600"]))
            raise RuntimeError("on purpose")
    assert sleeper.wait(timeout=15) != 0  # stopped by its id
    assert "vla_lan_test" not in namespaces()


@needs_namespaces
def test_replicas_on_the_head_and_the_worker_answer_robots_in_a_third_namespace(tmp_path, tiny_checkpoint):
    pytest.importorskip("ray")
    from vla_accel_ros.evaluation.fleet_bench import record_streams
    from vla_accel_ros.evaluation.fleet_servers import ServerBenchOptions, run_label, server_bench

    opts = ServerBenchOptions(servers=("ray",), robots=(2,), replicas=(2,), netns=True,
                              checkpoint=str(tiny_checkpoint(tmp_path / "ckpt")), decoder="ar", steps=3, ticks=10)
    streams = record_streams(2, opts.steps, opts.seed, 64)
    from vla_accel_ros.evaluation.ray_cluster import HOSTS, RayCluster, cpus_per_node

    with RayCluster(cpus_per_node(opts.replicas, opts.threads), NamespaceNetwork(f"vla_ray{os.getpid()}", HOSTS)) as c:
        (run,) = server_bench(opts, streams, 0.04, dds=None, cluster=c, progress=False)
    assert run["replica_hosts"] == {"head": 1, "worker": 1}  # Serve's controller: one replica on each node
    assert run_label(run) == "ray x2, 2-host cluster"
    assert run["actions_per_s"] > 0 and 0 < run["rtt_ms_p50"] <= run["rtt_ms_p99"] < float("inf")
    assert run["mean_batch_size"] >= 1 and run["failed_requests"] == 0
    assert f"vla_ray{os.getpid()}_" not in namespaces()
    assert processes_naming("/vla_ray_") == []  # Ray's processes (their temp dir) stopped
