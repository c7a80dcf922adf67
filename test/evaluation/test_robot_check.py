"""The closed-loop commands refuse a checkpoint made for another arm before any episode runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from vla_accel_ros.cli import main
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.robot_record import ROBOT_KEY, RobotRecord, read_robot_record
from vla_accel_ros.evaluation.robot_check import checkpoints_fit_robot, sim_robot
from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

SHIPPED = default_checkpoint()
pytestmark = pytest.mark.skipif(not (SHIPPED / "model.json").is_file(), reason="no shipped checkpoint")
ARM7 = [f"joint{i}" for i in range(1, 8)]


def sim_arm() -> RobotRecord:
    """What the eval command's sim drives: the package arm, 20 Hz, the shipped checkpoint's image size."""
    return RobotRecord(dof=7, joint_names=tuple(ARM7), tcp_frame="tcp", control_rate_hz=20.0, image_size=128)


def foreign_checkpoint(tmp_path: Path, **record: Any) -> Path:
    """A copy of the shipped checkpoint (weights linked) whose robot record is changed by ``record``."""
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for item in SHIPPED.iterdir():
        if item.suffix == ".safetensors":
            (copy / item.name).symlink_to(item)
        elif item.is_file():
            shutil.copy2(item, copy / item.name)
    meta = json.loads((copy / "model.json").read_text())
    meta[ROBOT_KEY] = {**meta[ROBOT_KEY], **record}
    (copy / "model.json").write_text(json.dumps(meta))
    return copy


def run_eval(checkpoint: Path, out: Path, *flags: str) -> int:
    return main(["eval", "--checkpoint", str(checkpoint), "--out", str(out), "--episodes", "1", "--max-steps", "1",
                 *flags])


def test_shipped_checkpoint_is_the_sim_arm() -> None:
    assert read_robot_record(SHIPPED) == sim_arm()
    with PickCubeEnv(SimConfig(image_size=128)) as env:  # the record the commands compare it with
        assert sim_robot(env) == sim_arm()


def test_eval_refuses_a_six_dof_checkpoint_even_when_allowed(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = foreign_checkpoint(tmp_path, dof=6, joint_names=ARM7[:6])
    for flags in ((), ("--allow-unmatched-robot",)):
        assert run_eval(checkpoint, tmp_path / "out", *flags) == 2
        err = capsys.readouterr().err
        assert err.startswith("eval: error: "), err
        assert "6-DoF" in err and "7-DoF" in err, err
    assert not (tmp_path / "out" / "summary.json").exists()  # no episode ran


def test_eval_refuses_another_arm_of_the_same_dof(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = foreign_checkpoint(tmp_path, joint_names=[f"arm_{name}" for name in ARM7], tcp_frame="tool0")
    assert run_eval(checkpoint, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith("eval: error: ") and "--allow-unmatched-robot" in err, err
    assert "TCP frame: checkpoint 'tool0', in use 'tcp'" in err and "arm_joint1" in err, err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_allowed_same_dof_mismatch_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = foreign_checkpoint(tmp_path, control_rate_hz=10.0)
    assert not checkpoints_fit_robot("bench", [SHIPPED, checkpoint], sim_arm())
    assert "bench: error: " in capsys.readouterr().err
    assert checkpoints_fit_robot("bench", [SHIPPED, checkpoint], sim_arm(), allow_unmatched=True)
    err = capsys.readouterr().err
    assert err.startswith("bench: WARN: ") and "checkpoint 10 Hz, in use 20 Hz" in err and err.count("\n") == 1, err


def test_malformed_record_is_an_error_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = foreign_checkpoint(tmp_path, wheels=4)
    assert not checkpoints_fit_robot("vision-fidelity", [checkpoint], sim_arm(), allow_unmatched=True)
    err = capsys.readouterr().err
    assert err.startswith("vision-fidelity: error: ") and str(checkpoint / "model.json") in err, err
