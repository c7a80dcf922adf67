"""vla_accel_node with ``checkpoint: openpi://HOST:PORT?api_key_file=F`` over real DDS in front of our
openpi server, which refuses the node's key, then takes it, then is overloaded: /diagnostics says
"refused the API key (HTTP 401)" and then "busy", the node falls back and holds meanwhile and comes
back to policy ticks after each; every tick publishes and no command leaves the limits or moves
more than v * T. The overload is a decode held at a gate in the server's runner with a queue bound
of one: every request the node makes meanwhile finds the bound full."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.observation import Observation  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.models.openpi.config import PolicySpec  # noqa: E402
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner  # noqa: E402
from vla_accel_ros.runtime.openpi_server import ApiKeyCheck, OpenPIServer  # noqa: E402

KIN = ArmKinematics(default_urdf())
RATE_HZ = 20.0
DOMAIN_ID = 165


class GatedRunner:
    """A runner whose decodes wait while ``gate`` is shut (the server then has a request in flight
    for as long as the test keeps it shut)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.policy = runner.policy
        self.gate = threading.Event()
        self.gate.set()

    def start_episode(self) -> None:
        self.runner.start_episode()

    def __call__(self, obs: Observation) -> Any:
        self.gate.wait(120)
        return self.runner(obs)


def test_the_node_reports_a_refused_key_and_a_busy_server_and_keeps_publishing(
        dds_rig: Any, tmp_path: Path, tiny_checkpoint: Any, openpi_serving: Any, policy_node_fed: Any) -> None:
    runner = GatedRunner(build_runner(RunnerConfig(checkpoint=str(tiny_checkpoint(tmp_path / "tiny")), decoder="ar"),
                                      KIN))
    server = OpenPIServer(runner, PolicySpec(), n_joints=KIN.n, max_opening=0.04, metadata={"server": "test"},
                          api_key=ApiKeyCheck("the-servers-key"), max_queue=1)
    serving = openpi_serving(server)
    key = tmp_path / "key"
    key.write_text("the-nodes-key\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"image_size": 64}))
    rig = dds_rig(DOMAIN_ID, "robot")
    params = {"inference": True, "autostart": True, "instruction": "pick up the red cube",
              "robot_description_timeout_s": 0.0, "control_rate_hz": RATE_HZ, "stats_rate_hz": 5.0,
              "checkpoint": f"openpi://127.0.0.1:{serving.port}?spec={spec}&timeout_s=0.5&api_key_file={key}"}
    def said(words: str, since: int) -> DiagnosticStatus | None:
        return next((s for s in statuses[since:] if words in s.message), None)

    node, commands, statuses = policy_node_fed(rig, params, still=True, fingers=0.03)
    try:
        # the key refused: ERROR on /diagnostics with the server's reason; the arm holds, publishing
        assert rig.wait(lambda: node.stats().get("hold_ticks", 0) >= 10
                        and said("refused the API key (HTTP 401", 0) is not None, timeout=120.0), \
            (node.stats(), [s.message for s in statuses[-3:]])
        refused = said("refused the API key (HTTP 401", 0)
        assert refused is not None and refused.level == DiagnosticStatus.ERROR, refused
        assert "wrong API key" in refused.message and "nodes-key" not in refused.message
        stats = node.stats()
        assert stats["policy_ticks"] == 0 and stats["inference_server_api_key_refusals"] >= 1
        assert server.unauthorized >= 1 and server.served == 0

        server.api_key = ApiKeyCheck("the-nodes-key")  # the server takes the node's key from now on
        assert rig.wait(lambda: node.stats()["policy_ticks"] >= 10, timeout=60.0), node.stats()
        assert node.stats()["inference_server_api_key_refused"] == ""

        # overloaded: a decode held in flight, so every request the node makes meanwhile is answered busy
        before, seen = node.stats(), len(statuses)
        runner.gate.clear()
        assert rig.wait(lambda: node.stats()["inference_server_busy"] >= 3 and said("busy", seen) is not None,
                        timeout=60.0), (node.stats(), [s.message for s in statuses[-3:]])
        busy = said("busy", seen)
        assert busy is not None and busy.level >= DiagnosticStatus.WARN
        assert "policy server busy" in busy.message and "refused the API key" not in busy.message
        assert server.busy >= 3
        assert rig.wait(lambda: node.stats()["hold_ticks"] >= before["hold_ticks"] + 5, timeout=30.0), node.stats()
        runner.gate.set()
        assert rig.wait(lambda: node.stats()["policy_ticks"] >= before["policy_ticks"] + 10
                        and node.stats()["inference_server_connected"], timeout=60.0), node.stats()
        back = node.stats()
        assert back["fallback_ticks"] > before["fallback_ticks"]  # the fallback first, then the hold
        # every tick since the first joint state published a command, through both refusals too
        assert back["ticks"] - back["ticks_published"] == stats["ticks"] - stats["ticks_published"]
    finally:
        runner.gate.set()
        rig.close()
        serving.close()
    q = np.array([c[: KIN.n] for c in commands])
    assert len(q) > 30 and all(KIN.within_limits(c) for c in q)
    assert np.all(np.abs(np.diff(q, axis=0)) <= KIN.limits.velocity / RATE_HZ + 1e-9)  # never above v * T
