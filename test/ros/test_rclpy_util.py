"""A node executable's main (``rclpy_util.run_node``) shuts down cleanly however Ctrl-C arrives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("rclpy")

DOMAIN_ID = "76"


@pytest.mark.parametrize("gap_s", [0.0, 0.05, 0.3])
def test_a_second_sigint_during_shutdown_still_ends_cleanly(tmp_path: Path, gap_s: float) -> None:
    # ros2 launch delivers a terminal's Ctrl-C twice: once to the process group, once forwarded.
    # The second lands while spinning (0), during the clean-up or while the interpreter exits.
    env = dict(os.environ, ROS_DOMAIN_ID=DOMAIN_ID, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"),
               ROS_LOG_DIR=str(tmp_path / "log"), PYTHONUNBUFFERED="1")
    log = tmp_path / "sim_node.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vla_accel_ros.ros.sim_node", "--ros-args",
                                 "-p", "camera_rate_hz:=5.0", "-p", "image_size:=32"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 120
            while "MuJoCo bridge" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert proc.poll() is None, log.read_text()
            proc.send_signal(signal.SIGINT)
            if gap_s:
                time.sleep(gap_s)
                proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert rc == 0, text
    assert "Traceback" not in text, text
