"""Two hosts on one machine: the inference node in a network namespace of its own, over a veth
pair, with DDS across it (``vla-accel sim --inference-mode remote --netns``). Needs root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from vla_accel_ros.ros.netns import NetworkNamespace

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="network namespaces need root and iproute2")


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout


def test_the_namespace_and_its_pair_exist_inside_the_block_only():
    with NetworkNamespace("vla_accel_test_ns", index=241) as ns:
        assert "vla_accel_test_ns" in namespaces()
        ping = subprocess.run(ns.command(["ping", "-c", "1", "-W", "2", ns.host_ip]), capture_output=True,
                              check=False) if shutil.which("ping") else None
        assert ping is None or ping.returncode == 0
        addresses = subprocess.run(ns.command(["ip", "-4", "addr"]), capture_output=True, text=True,
                                   check=True).stdout
        assert ns.ns_ip in addresses
    assert "vla_accel_test_ns" not in namespaces()
    links = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert ns.host_if not in links


# Across the pair, DDS finds the other side by unicast to the ports of its first participants
# (7400 + 250 x domain + ...). A domain below 100 keeps them under the ephemeral port range
# (32768-60999), where sockets of other programs could take them and push the participants to
# ports the other side never tries.
NETNS_DOMAIN_ID = 77


def test_episodes_run_with_the_policy_in_another_namespace(tmp_path, tiny_checkpoint):
    # As a user runs it: vla-accel sim in an interpreter of its own, whatever earlier tests left in this one.
    out = tmp_path / "run"
    command = [sys.executable, "-m", "vla_accel_ros.cli", "sim", "--episodes", "1", "--duration-s", "4",
               "--inference-mode", "remote", "--netns", "--decoder", "kerv", "--domain-id", str(NETNS_DOMAIN_ID),
               "--checkpoint", str(tiny_checkpoint(tmp_path / "ckpt")), "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl")))
    assert (out / "summary.json").is_file(), run.stdout[-2000:] + run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 1 and summary["inference_round_trip_ms_p50"] > 0
    assert summary["policy_ticks"] > 0
    # every tick publishes once the arm's state is known (ticks before the first joint state cannot)
    commands = np.array(json.loads((out / "node_stats.json").read_text())["tick_log"]["command"], dtype=float)
    published = np.all(np.isfinite(commands), axis=1)
    assert published.any() and published[int(np.argmax(published)):].all()
    assert json.loads((out / "summary.json").read_text())["inference_round_trip_ms_p99"] > 0
    assert f"vla_accel_{NETNS_DOMAIN_ID}" not in namespaces()  # removed by the command itself
