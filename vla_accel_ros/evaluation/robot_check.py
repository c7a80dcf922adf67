"""The check every closed-loop command makes before it drives the sim arm with a checkpoint: was the
checkpoint made for this arm? (See :mod:`vla_accel_ros.core.robot_record`.)

A different DOF always ends the command; any other difference (joint names, TCP frame, policy
rate, image size) ends it unless ``--allow-unmatched-robot`` is given, which turns it into a
``WARN`` line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from vla_accel_ros.core.robot_record import (
    RobotMismatch,
    RobotRecord,
    check_robot,
    read_robot_record,
    robot_in_use,
)
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.sim.env import PickCubeEnv


def sim_robot(env: PickCubeEnv) -> RobotRecord:
    """The arm ``env`` drives: its URDF's arm joints and TCP frame, its control step (the
    runners' ``action_dt_s``), its camera and image size."""
    return robot_in_use(env.kin.joint_names, env.kin.tcp_frame, action_dt_s=env.control_dt,
                        image_size=env.config.image_size, camera=env.handles.camera)


def checkpoints_fit_robot(command: str, checkpoints: Iterable[Path | str], in_use: RobotRecord,
                          allow_unmatched: bool = False) -> bool:
    """True when every checkpoint may drive ``in_use`` (a same-DOF difference that
    ``allow_unmatched`` lets through prints ``<command>: WARN: ...`` on stderr); else False, with
    ``<command>: error: <both robots>`` on stderr. An unreadable record is an error naming its file."""
    for checkpoint in checkpoints:
        try:
            made_for = read_robot_record(CheckpointRef.parse(checkpoint).directory)
        except ValueError as err:  # a malformed record: the message names the file
            print(f"{command}: error: {err}", file=sys.stderr, flush=True)
            return False
        try:
            warning = check_robot(made_for, in_use, allow_unmatched=allow_unmatched, source=f"checkpoint {checkpoint}")
        except RobotMismatch as err:
            hint = " (--allow-unmatched-robot)" if made_for is not None and made_for.dof == in_use.dof else ""
            print(f"{command}: error: {err}{hint}", file=sys.stderr, flush=True)
            return False
        if warning:
            print(f"{command}: WARN: {checkpoint}: {warning}", file=sys.stderr, flush=True)
    return True
