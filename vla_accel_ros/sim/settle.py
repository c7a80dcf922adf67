"""Which commands a freshly reset arm ignores, for the sim bridge and the deterministic recorder alike.

After a reset, commands still in flight were computed for the previous pose, and the node's commands
then ramp to the new pose at the velocity limit (two consecutive commands never differ by more than
the velocity limit x the period). The arm ignores commands for at least ``RESET_SETTLE_S``, then until
one comes within ``RESET_CAPTURE_RAD`` of the reset pose, and at most ``RESET_SETTLE_MAX_S``, so that
the ramp does not drag the reset arm back toward where it was.
"""

from __future__ import annotations

import numpy as np

RESET_SETTLE_S = 0.1
RESET_CAPTURE_RAD = 0.05
RESET_SETTLE_MAX_S = 2.0


def settling_after_reset(since_reset_s: float, q_command: np.ndarray | None, reset_pose: np.ndarray) -> bool:
    """Whether the arm still ignores ``q_command``, ``since_reset_s`` seconds after a reset to ``reset_pose``."""
    if since_reset_s < RESET_SETTLE_S:
        return True
    if since_reset_s >= RESET_SETTLE_MAX_S:
        return False
    return q_command is None or float(np.max(np.abs(q_command - reset_pose))) > RESET_CAPTURE_RAD
