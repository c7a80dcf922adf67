"""Never a silent non-run: a policy slower than ``action_timeout_s`` in ``vla-accel sim`` (every action
expires before use) is an ERROR on ``/diagnostics`` naming ``action_timeout_s``, ``policy_tick_share``
0 in summary.json and a non-zero exit whose last line names ``action_timeout_s``; with the timeout
raised the same policy drives the arm. The node's parameters come from a ``--params-file`` and
``--action-timeout-s`` (real node and bridge processes over DDS, domain ids 187 and 188)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
os.environ.setdefault("MUJOCO_GL", "egl")

from vla_accel_ros.cli import main as cli_main  # noqa: E402
from vla_accel_ros.core.settings import ConfigError  # noqa: E402
from vla_accel_ros.ros.launcher import SimRunOptions  # noqa: E402
from vla_accel_ros.ros.parameters import PolicySettings  # noqa: E402

ERROR_LEVEL = b"\x02"


def _params_file(path: Path, **params: object) -> Path:
    path.write_text(json.dumps({"vla_accel_node": {"ros__parameters": params}}))  # JSON is YAML
    return path


class DiagnosticsListener:
    """The /diagnostics statuses of the node, heard on ``domain_id`` while a run goes on."""

    def __init__(self, domain_id: int) -> None:
        from diagnostic_msgs.msg import DiagnosticArray

        from vla_accel_ros.ros.rclpy_util import BackgroundNode

        self._ros = BackgroundNode("silent_non_run_listener", domain_id)
        self.statuses: list = []
        self._lock = threading.Lock()
        self._ros.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 100)
        self._ros.spin(timeout_sec=0.1)

    def _on_diagnostics(self, msg) -> None:
        with self._lock:
            self.statuses.extend(s for s in msg.status if s.name == "/vla_accel_node: control loop")

    def close(self) -> None:
        self._ros.close()


def _sim(tmp_path: Path, checkpoint: Path, domain: int, *extra: str) -> tuple[int, dict, list]:
    """``vla-accel sim`` of one short episode: its exit code, summary.json and the node's statuses."""
    listener = DiagnosticsListener(domain)
    out = tmp_path / "run"
    try:
        rc = cli_main(["sim", "--episodes", "1", "--duration-s", "2", "--checkpoint", str(checkpoint),
                       "--out", str(out), "--domain-id", str(domain), "--inference-mode", "thread",
                       "--realtime-priority", "0", *extra])
    finally:
        listener.close()
    return rc, json.loads((out / "summary.json").read_text()), listener.statuses


def test_actions_expiring_before_use_fail_the_run_and_say_action_timeout_s(tmp_path, tiny_checkpoint, capsys):
    params = _params_file(tmp_path / "node.yaml", action_timeout_s=0.001)  # every action expires before use
    rc, summary, statuses = _sim(tmp_path, tiny_checkpoint(tmp_path / "ckpt"), 187, "--params-file", str(params))
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 1, lines
    assert lines[-1].startswith("sim: FAILED: no policy tick in the episode(s) of seed 100000")
    assert "action_timeout_s" in lines[-1] and "policy actions expire before use" in lines[-1], lines[-1]
    assert "inference takes" in lines[-1] and "ms (p50)" in lines[-1]
    assert "0.0% policy" in lines[-2]  # the result line
    assert summary["policy_tick_share"] == 0.0 and summary["policy_ticks"] == 0
    assert summary["per_episode"][0]["policy_ticks"] == 0 and summary["per_episode"][0]["ticks"] > 10
    assert summary["actions_expired"] > 0 and summary["no_policy_tick"] in lines[-1]
    errors = [s for s in statuses if s.level == ERROR_LEVEL and "policy actions expire before use" in s.message]
    assert errors, [(s.level, s.message) for s in statuses]
    assert "action_timeout_s is 0.001 s" in errors[-1].message and "inference takes" in errors[-1].message
    assert "raise action_timeout_s" in errors[-1].message


def test_with_action_timeout_s_raised_the_same_policy_drives_the_arm(tmp_path, tiny_checkpoint, capsys):
    params = _params_file(tmp_path / "node.yaml", action_timeout_s=0.001)
    rc, summary, _ = _sim(tmp_path, tiny_checkpoint(tmp_path / "ckpt"), 188, "--params-file", str(params),
                             "--action-timeout-s", "2.0")  # the flag over the file
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, lines
    assert "FAILED" not in lines[-1] and summary["no_policy_tick"] == ""
    assert summary["policy_tick_share"] > 0.2 and summary["per_episode"][0]["policy_ticks"] > 0
    assert summary["options"]["action_timeout_s"] == 2.0
    stats = json.loads((tmp_path / "run" / "node_stats.json").read_text())
    measured = np.asarray(stats["tick_log"]["measured"], dtype=float)
    measured = measured[np.all(np.isfinite(measured), axis=1)]
    assert np.abs(measured - measured[0]).max() > 0.01  # the policy's commands moved the arm


def test_the_params_file_gives_the_node_any_parameter_the_run_does_not_set(tmp_path):
    params = _params_file(tmp_path / "node.yaml", action_timeout_s=0.3, fallback_max_s=0.1, decoder="sd",
                          control_rate_hz=50.0, image_topic="/my_arm/color/image_raw")
    cfg = SimRunOptions(out=str(tmp_path / "run"), params_file=str(params)).node_config()
    assert (cfg.action_timeout_s, cfg.fallback_max_s, cfg.policy.decoder) == (0.3, 0.1, "sd")
    # the sim's robot, topics and rate are the sim's whatever the file says
    assert cfg.control_rate_hz == 20.0 and cfg.image_topic == SimRunOptions().node_config().image_topic
    assert cfg.autostart and cfg.stats_file == str((tmp_path / "run" / "node_stats.json").resolve())
    # a flag that differs from the node's default applies over the file; --action-timeout-s too
    over = SimRunOptions(out=str(tmp_path / "run"), params_file=str(params), action_timeout_s=1.5,
                         policy=PolicySettings(decoder="ar")).node_config()
    assert (over.action_timeout_s, over.policy.decoder, over.fallback_max_s) == (1.5, "ar", 0.1)


def test_a_bad_params_file_or_action_timeout_s_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="--params-file .*missing.yaml: no such file"):
        SimRunOptions(params_file=str(tmp_path / "missing.yaml"))
    bad = _params_file(tmp_path / "bad.yaml", action_timout_s=0.3)
    with pytest.raises(ConfigError, match="with --params-file .*bad.yaml.*unknown parameter.*action_timout_s"):
        SimRunOptions(params_file=str(bad))
    with pytest.raises(ValueError, match=r"--action-timeout-s must be in \(0, 60\] s, got -1.0"):
        SimRunOptions(action_timeout_s=-1.0)


def test_record_and_eval_report_the_policy_tick_share(tmp_path, tiny_checkpoint, capsys):
    from vla_accel_ros.rosbag.recorder import RecordOptions, record

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    s = record(RecordOptions(episodes=1, out=str(tmp_path / "bag"), mode="deterministic", duration_s=0.6,
                             policy=PolicySettings(checkpoint=str(ckpt), decoder="kerv")), progress=False)
    episode = s["per_episode"][0]
    assert 0 < episode["policy_ticks"] <= episode["ticks"] == 12  # 20 Hz frames over 0.6 s
    assert s["policy_tick_share"] == episode["policy_ticks"] / episode["ticks"] and s["no_policy_tick"] == ""
    # eval's steps wait for the policy: each took its action from it
    rc = cli_main(["eval", "--checkpoint", str(ckpt), "--episodes", "1", "--max-steps", "3", "--decoder", "ar",
                   "--out", str(tmp_path / "eval")])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert rc == 0 and summary["policy_tick_share"] == 1.0 and summary["episodes_without_policy_steps"] == []
    assert "policy steps 100%" in line, line
