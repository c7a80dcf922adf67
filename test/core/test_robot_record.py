"""The robot record of a checkpoint and its check against the robot in use (core/robot_record.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from vla_accel_ros.core.actions import JOINT_POSITION
from vla_accel_ros.core.robot_record import (
    ACTION_SPACE,
    LEGACY_ROBOT,
    ROBOT_KEY,
    RobotMismatch,
    RobotRecord,
    check_robot,
    package_robot,
    read_robot_record,
    robot_differences,
    robot_in_use,
)

ARM7 = tuple(f"joint{i}" for i in range(1, 8))
MADE_FOR = robot_in_use(ARM7, "tcp", action_dt_s=0.05, image_size=128)
SIX_DOF = robot_in_use(ARM7[:6], "tcp", action_dt_s=0.05, image_size=128)


def test_package_arm_is_the_legacy_record() -> None:
    assert package_robot(128) == MADE_FOR
    assert MADE_FOR.control_rate_hz == pytest.approx(20.0) and MADE_FOR.action_space == ACTION_SPACE
    assert RobotRecord.from_json(MADE_FOR.to_json()) == MADE_FOR
    assert json.loads(json.dumps(MADE_FOR.to_json())) == MADE_FOR.to_json()  # plain JSON


def test_same_robot_passes() -> None:
    assert check_robot(MADE_FOR, MADE_FOR) == ""
    assert check_robot(MADE_FOR, MADE_FOR, allow_unmatched=True) == ""
    assert robot_differences(MADE_FOR, MADE_FOR) == []


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("made_for, in_use", [(SIX_DOF, MADE_FOR), (MADE_FOR, SIX_DOF)], ids=["6_on_7", "7_on_6"])
def test_a_different_dof_is_always_refused(made_for: RobotRecord, in_use: RobotRecord, allow: bool) -> None:
    with pytest.raises(RobotMismatch) as info:
        check_robot(made_for, in_use, allow_unmatched=allow)
    message = str(info.value)
    assert f"{made_for.dof}-DoF" in message and f"{in_use.dof}-DoF" in message, message
    assert "arm DOF: checkpoint" in message


# Same DOF, another arm: (what differs, the robot in use, a fragment the message names)
SAME_DOF_OTHER_ARM = [
    ("joint_names", replace(MADE_FOR, joint_names=tuple(f"a{i}" for i in range(7))), "joint names"),
    ("tcp_frame", replace(MADE_FOR, tcp_frame="tool0"), "TCP frame: checkpoint 'tcp', in use 'tool0'"),
    ("rate", replace(MADE_FOR, control_rate_hz=10.0), "policy rate (1/action_dt_s): checkpoint 20 Hz, in use 10 Hz"),
    ("image_size", replace(MADE_FOR, image_size=96), "image size: checkpoint 128px, in use 96px"),
]


def test_either_action_space_runs_on_the_arm_and_no_other_is_a_record() -> None:
    joint_policy = replace(MADE_FOR, action_space=JOINT_POSITION)  # executed as joint targets: no mismatch
    assert check_robot(joint_policy, MADE_FOR) == ""
    assert RobotRecord.from_json(joint_policy.to_json()) == joint_policy
    with pytest.raises(ValueError, match="action_space must be one of"):
        replace(MADE_FOR, action_space="joint_delta")


@pytest.mark.parametrize("in_use, fragment", [case[1:] for case in SAME_DOF_OTHER_ARM],
                         ids=[case[0] for case in SAME_DOF_OTHER_ARM])
def test_same_dof_on_another_arm_needs_allow_unmatched(in_use: RobotRecord, fragment: str) -> None:
    with pytest.raises(RobotMismatch, match="allow_unmatched_robot") as info:
        check_robot(MADE_FOR, in_use)
    assert fragment in str(info.value)
    warning = check_robot(MADE_FOR, in_use, allow_unmatched=True)
    assert fragment in warning and "allow_unmatched_robot" in warning


def test_unknown_rate_and_image_size_match_anything() -> None:
    assert check_robot(MADE_FOR, robot_in_use(ARM7, "tcp")) == ""
    assert check_robot(package_robot(), MADE_FOR) == ""


def write_meta(path: Path, meta: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.json").write_text(json.dumps(meta))
    return path


def test_checkpoint_without_a_record_is_the_package_arm(tmp_path: Path) -> None:
    legacy = write_meta(tmp_path / "legacy", {"format_version": 1, "config": {"image_size": 64}})
    assert read_robot_record(legacy) == package_robot(64)
    assert read_robot_record(legacy).joint_names == tuple(LEGACY_ROBOT["joint_names"])
    recorded = write_meta(tmp_path / "recorded", {"config": {"image_size": 128}, ROBOT_KEY: SIX_DOF.to_json()})
    assert read_robot_record(recorded) == SIX_DOF


def record_with(**changes: Any) -> dict[str, Any]:
    return {**MADE_FOR.to_json(), **changes}


@pytest.mark.parametrize("record, fragment", [
    ("7-DoF", "JSON object"),
    (record_with(dof=6), "7 joint names for dof 6"),
    (record_with(dof="7"), "dof must be a number"),
    (record_with(dof=7.5), "whole number"),
    (record_with(joint_names="joint1"), "list of strings"),
    (record_with(joint_names=["j"] * 7), "distinct"),
    (record_with(tcp_frame=""), "tcp_frame must not be empty"),
    (record_with(tcp_frame=3), "tcp_frame must be a string"),
    (record_with(control_rate_hz=-1.0), "control_rate_hz must be >= 0"),
    (record_with(image_size=-2), "image_size must be >= 0"),
    (record_with(wheels=4), "unknown keys ['wheels']"),
    ({k: v for k, v in MADE_FOR.to_json().items() if k != "tcp_frame"}, "missing key 'tcp_frame'"),
], ids=["not_an_object", "dof_vs_names", "dof_string", "dof_fraction", "names_string", "names_repeated",
        "empty_tcp", "tcp_number", "negative_rate", "negative_image_size", "unknown_key", "missing_key"])
def test_malformed_record_is_a_value_error_naming_the_file(tmp_path: Path, record: Any, fragment: str) -> None:
    checkpoint = write_meta(tmp_path / "bad", {"config": {"image_size": 128}, ROBOT_KEY: record})
    with pytest.raises(ValueError) as info:
        read_robot_record(checkpoint)
    message = str(info.value)
    assert str(checkpoint / "model.json") in message and fragment in message, message


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"], ids=["invalid_json", "not_an_object"])
def test_unreadable_metadata_names_the_file(tmp_path: Path, content: str) -> None:
    (tmp_path / "model.json").write_text(content)
    with pytest.raises(ValueError, match="model.json"):
        read_robot_record(tmp_path)
    with pytest.raises(ValueError, match="missing: the checkpoint directory does not exist"):
        read_robot_record(tmp_path / "missing")
