"""vla_accel_node with ``checkpoint: openpi://HOST:PORT`` over real DDS and a loopback websocket to our
own openpi server: every tick publishes; the server killed gives fallback, then hold, then policy
ticks again when it returns on the same port. Run inside /work/tools/isolated (a private network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models.openpi.config import PolicySpec
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.openpi_server import OpenPIServer

KIN = ArmKinematics(default_urdf())
RATE_HZ = 20.0
DOMAIN_ID = 228


def test_the_node_drives_through_a_server_and_survives_it_going_away(
        dds_rig: Any, tmp_path: Path, tiny_checkpoint: Any, openpi_serving: Any, policy_node_fed: Any) -> None:
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    runner = build_runner(RunnerConfig(checkpoint=str(checkpoint), decoder="ar"), KIN)

    def server() -> OpenPIServer:
        return OpenPIServer(runner, PolicySpec(), n_joints=KIN.n, max_opening=0.04, metadata={"server": "test"})

    serving = openpi_serving(server())
    port = serving.port
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"image_size": 64}))
    rig = dds_rig(DOMAIN_ID, "robot")
    params = {"inference": True, "inference_mode": "thread", "autostart": True, "instruction": "pick up the red cube",
              "robot_description_timeout_s": 0.0, "control_rate_hz": RATE_HZ,
              "checkpoint": f"openpi://127.0.0.1:{port}?spec={spec}&timeout_s=0.5"}
    node, commands, _ = policy_node_fed(rig, params, still=True, fingers=0.03)
    try:
        assert rig.wait(lambda: node.stats()["policy_ticks"] >= 10, timeout=60.0), node.stats()
        stats = node.stats()
        assert stats["inference_server_replies"] >= 5 and stats["inference_server_bad_replies"] == 0
        before = node.stats()
        serving.close()  # the server goes away, its connection with it
        assert rig.wait(lambda: node.stats()["hold_ticks"] >= before["hold_ticks"] + 5, timeout=30.0), node.stats()
        gone = node.stats()
        assert gone["fallback_ticks"] > before["fallback_ticks"]  # the fallback first, then the hold
        assert gone["inference_errors"] > before["inference_errors"] and not gone["inference_server_connected"]
        serving = openpi_serving(server(), port)  # back on the same port
        assert rig.wait(lambda: node.stats()["policy_ticks"] >= gone["policy_ticks"] + 10, timeout=60.0), \
            node.stats()
        back = node.stats()
        assert back["inference_server_connects"] >= 2 and back["inference_server_connected"]
        # every tick since the first joint state published a command, through the outage too
        assert back["ticks"] - back["ticks_published"] == stats["ticks"] - stats["ticks_published"]
    finally:
        rig.close()
        serving.close()
    q = np.array([c[: KIN.n] for c in commands])
    assert len(q) > 30 and all(KIN.within_limits(c) for c in q)
    assert np.all(np.abs(np.diff(q, axis=0)) <= KIN.limits.velocity / RATE_HZ + 1e-9)  # never above v * T
