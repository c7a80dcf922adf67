"""The node says what it waits for: an unconfigured node, once, that it waits for ``configure``; no
``robot_description`` within the timeout, a WARN naming the topic and the URDF used instead; a params
file made for another arm refused with the missing description first; the example files'
placeholder checkpoint refused at configure, before any URDF is waited for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")
from rclpy.parameter import Parameter

from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.ros.node import VlaAccelNode

_domains = iter(range(100, 107))


def node_log_until(arguments: list[str], marker: str, timeout_s: float = 90.0) -> str:
    """Run the node executable with ``arguments`` until its log shows ``marker`` (or it exits, or
    ``timeout_s`` passes), then stop it with SIGINT; its whole log."""
    process = subprocess.Popen([sys.executable, "-m", "vla_accel_ros.ros.node", "--ros-args", *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, ROS_DOMAIN_ID=str(next(_domains))))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None and not any(marker in line for line in lines):
        time.sleep(0.1)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    reader.join(10)
    return "".join(lines)


def test_an_unconfigured_node_says_once_that_it_waits_for_configure() -> None:
    log = node_log_until(["-p", "autostart:=false", "-p", "inference:=false"], "waiting for a lifecycle manager")
    waiting = [line for line in log.splitlines() if "waiting for a lifecycle manager" in line]
    assert len(waiting) == 1, log
    assert "ros2 lifecycle set /vla_accel_node configure" in waiting[0] and "autostart:=true" in waiting[0]


def test_no_robot_description_is_a_warning_naming_the_topic_and_the_fallback() -> None:
    log = node_log_until(["-p", "autostart:=true", "-p", "inference:=false", "-p", "robot_description_timeout_s:=0.5",
                          "-p", "instruction:=pick up the red cube"], "ready:")
    warning = next((line for line in log.splitlines() if "no robot_description received" in line), "")
    assert warning.startswith("[WARN]"), log
    assert "/robot_description within 0.5 s" in warning and str(default_urdf()) in warning


def test_a_params_file_for_another_arm_is_refused_saying_no_description_came_first(ros_context) -> None:
    overrides = [Parameter("autostart", value=True), Parameter("inference", value=False),
                 Parameter("robot_description_timeout_s", value=0.2), Parameter("tcp_frame", value="fr3_hand_tcp")]
    with ros_context(next(_domains)) as context, pytest.raises(ConfigError) as refused:
        VlaAccelNode(context=context, parameter_overrides=overrides)
    message = str(refused.value)
    assert message.startswith("no robot_description received on /robot_description within 0.2 s"), message
    assert "fr3_hand_tcp" in message and str(default_urdf()) in message


def test_the_example_files_placeholder_checkpoint_is_refused_before_any_urdf_wait() -> None:
    """Refused at configure with what to do, before the URDF is looked for: the log holds the
    refusal and no robot_description fallback (which would come first if the wait ran)."""
    log = node_log_until(["-p", "autostart:=true", "-p", "inference_mode:=thread",
                          "-p", "checkpoint:=hf:/path/to/your_fr3_vla", "-p", "robot_description_timeout_s:=0.2"],
                         "refusing to start")
    refusal = next((line for line in log.splitlines() if "refusing to start" in line), "")
    assert "hf:/path/to/your_fr3_vla" in refusal or "/path/to/your_fr3_vla" in refusal, log
    assert "set checkpoint to your model's directory" in refusal, log
    assert "robot_description" not in log and "URDF from" not in log, log


def test_the_example_files_point_at_the_placeholder_the_node_refuses() -> None:
    root = Path(__file__).resolve().parents[2]
    for example in sorted((root / "config" / "examples").glob("*.yaml")):
        assert 'checkpoint: "/path/to/' in example.read_text(), example.name
