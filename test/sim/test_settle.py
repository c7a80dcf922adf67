"""After a reset the arm ignores the commands of the previous pose and of the node's ramp toward the new one."""

from __future__ import annotations

import numpy as np

from vla_accel_ros.sim.settle import (
    RESET_CAPTURE_RAD,
    RESET_SETTLE_MAX_S,
    RESET_SETTLE_S,
    settling_after_reset,
)

POSE = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


def test_every_command_is_ignored_for_the_minimum_settle_time() -> None:
    assert settling_after_reset(0.0, POSE, POSE)
    assert settling_after_reset(RESET_SETTLE_S * 0.99, POSE, POSE)


def test_a_command_far_from_the_reset_pose_is_ignored_until_the_limit() -> None:
    far = POSE + 0.5
    assert settling_after_reset(RESET_SETTLE_S, far, POSE)
    assert settling_after_reset(RESET_SETTLE_MAX_S * 0.99, far, POSE)
    assert settling_after_reset(RESET_SETTLE_S, None, POSE)
    assert not settling_after_reset(RESET_SETTLE_MAX_S, far, POSE)


def test_a_command_near_the_reset_pose_ends_the_settling() -> None:
    near = POSE.copy()
    near[3] += RESET_CAPTURE_RAD * 0.9
    assert not settling_after_reset(RESET_SETTLE_S, near, POSE)
