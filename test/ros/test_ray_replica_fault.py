"""vla_accel_node with ``checkpoint: openpi://HOST:PORT`` in front of the Ray Serve application: a
replica killed mid-run (Ray starts another) costs the node a fallback, then a hold, then policy
ticks again; every tick publishes and no command leaves the limits or moves more than v * T."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
import ray  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.models.openpi.config import LIBERO  # noqa: E402
from vla_accel_ros.runtime import ray_serve  # noqa: E402
from vla_accel_ros.runtime.builder import RunnerConfig  # noqa: E402
from vla_accel_ros.runtime.ray_options import RayServeOptions  # noqa: E402

KIN = ArmKinematics(default_urdf())
RATE_HZ = 20.0
DOMAIN_ID = 163


def test_a_killed_replica_costs_a_fallback_and_a_hold_never_an_unsafe_command(
        dds_rig: Any, tmp_path: Path, tiny_checkpoint: Any, policy_node_fed: Any) -> None:
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rig = None
    try:
        port = ray_serve.start(RunnerConfig(checkpoint=str(checkpoint), decoder="ar"), LIBERO, {"server": "test"},
                               RayServeOptions(replicas=1, max_batch=4, batch_wait_ms=2), host="127.0.0.1", port=0)
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"image_size": 64}))
        rig = dds_rig(DOMAIN_ID, "robot")
        params = {"inference": True, "inference_mode": "thread", "autostart": True,
                  "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0,
                  "control_rate_hz": RATE_HZ, "checkpoint": f"openpi://127.0.0.1:{port}?spec={spec}&timeout_s=0.5"}
        node, commands, _ = policy_node_fed(rig, params, still=True, fingers=0.03)
        assert rig.wait(lambda: node.stats()["policy_ticks"] >= 10, timeout=90.0), node.stats()
        before = node.stats()
        (killed,) = ray_serve.replica_actors()
        ray.kill(killed, no_restart=False)  # Serve's controller replaces the replica
        assert rig.wait(lambda: node.stats()["fallback_ticks"] > before["fallback_ticks"], timeout=30.0), node.stats()
        assert rig.wait(lambda: node.stats()["policy_ticks"] >= before["policy_ticks"] + 10
                        and node.stats()["inference_server_connects"] >= 2, timeout=90.0), node.stats()
        back = node.stats()
        assert back["inference_errors"] > before["inference_errors"]
        assert back["hold_ticks"] + back["fallback_ticks"] > before["hold_ticks"] + before["fallback_ticks"]
        # every tick since the first joint state published a command, through the outage too
        assert back["ticks"] - back["ticks_published"] == before["ticks"] - before["ticks_published"]
    finally:
        if rig is not None:
            rig.close()
        ray_serve.stop()
        ray.shutdown()
    q = np.array([c[: KIN.n] for c in commands])
    assert len(q) > 30 and all(KIN.within_limits(c) for c in q)
    assert np.all(np.abs(np.diff(q, axis=0)) <= KIN.limits.velocity / RATE_HZ + 1e-9)  # never above v * T
