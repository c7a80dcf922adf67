"""What the control node says of its task instruction: a change logged cut to
``INSTRUCTION_LOG_CHARS`` and at most once per ``INSTRUCTION_LOG_S`` (a flood of long instructions
once filled the disk with logs), and ``~/stats``' cut of it with its hash. ROS-free.
"""

from __future__ import annotations

import hashlib

from vla_accel_ros.core.input_errors import shorten

INSTRUCTION_LOG_S = 1.0  # instruction changes are logged at most once per this long
INSTRUCTION_LOG_CHARS = 200  # of an instruction, the log, /diagnostics and ~/stats show this many characters


def instruction_stats(text: str) -> dict[str, str]:
    """``~/stats``' ``instruction`` (cut) and ``instruction_sha256`` (of the whole, 16 hex digits)."""
    return {"instruction": shorten(text, INSTRUCTION_LOG_CHARS),
            "instruction_sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


class InstructionLog:
    """The throttle of instruction-change log lines."""

    def __init__(self, every_s: float = INSTRUCTION_LOG_S) -> None:
        self.every_s = every_s
        self._logged_at = -float("inf")  # time.monotonic() of the last line
        self._unlogged = 0  # changes since

    def line(self, text: str, now: float) -> str | None:
        """The line to log for a change to ``text`` at ``now`` (time.monotonic()); None within
        ``every_s`` of the last line (the next line counts it)."""
        if now - self._logged_at < self.every_s:
            self._unlogged += 1
            return None
        more = f" ({self._unlogged} change(s) since the last one logged)" if self._unlogged else ""
        self._logged_at, self._unlogged = now, 0
        return f"instruction: '{shorten(text, INSTRUCTION_LOG_CHARS)}'{more}"
