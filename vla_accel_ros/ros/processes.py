"""The package's node executables as child processes: start one with its parameters and a log file,
tell whether and why it refused to start, stop it. ``vla-accel sim`` (and the live recording, which
runs it) and the realtime replay start their nodes here.

A node that refuses to start (bad parameters, URDF or checkpoint, an arm the checkpoint was not made
for) logs one "refusing to start: ..." line and exits with :data:`REFUSED_EXIT`
(:func:`~vla_accel_ros.ros.rclpy_util.run_node`). Importable without rclpy.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vla_accel_ros.core.errors import RunFailed
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.runtime.process_worker import peak_rss_mb

REFUSED_EXIT = 2
REFUSAL = "refusing to start"
STOP_TIMEOUT_S = 15.0


class NodeRefused(ConfigError):
    """A node refused to start; the message is its own reason (a ConfigError: its settings, URDF or
    checkpoint are at fault, so a command reports it in one line)."""


def ros_value(value: Any) -> str:
    """A parameter value as ``-p name:=VALUE`` takes it (YAML; strings quoted, so that 'a: b' or
    '1.5' stay strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def parameter_arguments(params: Mapping[str, Any]) -> list[str]:
    """``-p name:=VALUE`` for each parameter, in order (they belong after ``--ros-args``)."""
    return [arg for name, value in params.items() for arg in ("-p", f"{name}:={ros_value(value)}")]


def _log_lines(log: Path) -> list[str]:
    try:
        return [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return []


# An rclpy log line: "[FATAL] [1796305748.725358312] [vla_accel_node]: message"
LOG_PREFIX = re.compile(r"^\[[A-Z]+\]\s*\[[0-9.]+\]\s*\[([^\]]+)\]:\s*")


def refusal(log: Path) -> str:
    """The node's "refusing to start" line from its log, as "NODE: refusing to start: REASON" (the
    level and stamp of the log line left out), or '' when there is none."""
    line = next((line for line in reversed(_log_lines(log)) if REFUSAL in line), "")
    return LOG_PREFIX.sub(lambda match: f"{match.group(1)}: ", line, count=1)


def exit_error(returncode: int, log: Path, when: str) -> Exception:
    """Why a node process ended: its refusal line when it refused to start (ConfigError), else the
    end of its log (RunFailed)."""
    reason = refusal(log)
    if reason:
        return ConfigError(f"the node exited with code {returncode} {when}: {reason} (see {log})")
    tail = " | ".join(_log_lines(log)[-3:]) or "(nothing)"
    return RunFailed(f"the node exited with code {returncode} {when}; its log ends: {tail} (see {log})")


@dataclass
class NodeProcess:
    """One node executable (``python -m MODULE --ros-args ...``) running as a child process, its
    output (stdout and stderr) in ``log``."""

    process: subprocess.Popen
    log: Path

    @classmethod
    def start(cls, module: str, ros_arguments: Sequence[str], log: Path, env: Mapping[str, str],
              wrap: Callable[[list[str]], list[str]] | None = None) -> NodeProcess:
        """Start ``module`` with ``ros_arguments`` (``--ros-args`` and what follows it) under ``env``;
        ``wrap`` rewrites the command line (to run it in a network namespace, say)."""
        command = [sys.executable, "-m", module, *ros_arguments]
        with open(log, "w") as out:  # the child keeps its own descriptor
            process = subprocess.Popen(wrap(command) if wrap is not None else command, env=dict(env), stdout=out,
                                       stderr=subprocess.STDOUT)
        return cls(process, log)

    @property
    def returncode(self) -> int | None:
        """The exit status, None while it runs."""
        return self.process.poll()

    @property
    def refused(self) -> bool:
        return self.returncode == REFUSED_EXIT

    def refusal(self) -> str:
        """Its "refusing to start" line, '' when it has logged none."""
        return refusal(self.log)

    def exit_error(self, when: str) -> Exception:
        """Why it ended (:func:`exit_error`); call it once it has."""
        return exit_error(self.process.returncode, self.log, when)

    def peak_rss_mb(self) -> float:
        """Its peak resident set size (MiB) while it runs; NaN once it has ended."""
        rss = peak_rss_mb(self.process.pid)
        return rss if rss > 0 else float("nan")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGINT (the node shuts down in order and writes its statistics), then SIGKILL after ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
