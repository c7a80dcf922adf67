"""One loader recognises a checkpoint directory's family by its own files; ``hf:`` still declares one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.models.load import load_policy, recognise
from vla_accel_ros.models.own.policy import Policy
from vla_accel_ros.models.token_vla.policy import HFTokenVLA


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tiny_hf_vla) -> Path:
    return tiny_hf_vla(tmp_path_factory.mktemp("load") / "tiny_hf")


@pytest.fixture(scope="module")
def own_dir(tmp_path_factory, tiny_checkpoint) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("load") / "tiny_own")


def test_each_family_is_recognised_by_its_own_files(own_dir: Path, hf_dir: Path) -> None:
    assert recognise(own_dir).name == "own" and recognise(hf_dir).name == "hf"
    own, hf = load_policy(own_dir), load_policy(str(hf_dir))
    assert isinstance(own, Policy) and isinstance(hf, HFTokenVLA)
    assert own.capabilities().token_scoring and hf.capabilities().token_scoring  # both declare action tokens
    assert isinstance(load_policy(f"hf:{hf_dir}"), HFTokenVLA)  # the prefix still declares the family


def test_the_checkpoint_reference_is_parsed_once_and_written_back_alike(hf_dir: Path) -> None:
    ref = CheckpointRef.parse(f"hf:{hf_dir}")
    assert ref == CheckpointRef(hf_dir, "hf") and str(ref) == f"hf:{hf_dir}"
    assert CheckpointRef.parse(ref) is ref and CheckpointRef.parse(str(hf_dir)) == CheckpointRef(hf_dir)
    assert str(CheckpointRef.parse(hf_dir)) == str(hf_dir)


def test_a_directory_no_family_recognises_is_one_line_naming_the_file_and_the_families(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"does not exist") as missing:
        load_policy(tmp_path / "nowhere")
    assert "\n" not in str(missing.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    with pytest.raises(ValueError) as unknown:
        load_policy(tmp_path)
    message = str(unknown.value)
    assert "\n" not in message and "config.json" in message and "'paligemma'" in message
    assert "own: model.json" in message and "hf: config.json" in message
    assert 'openvla: config.json with model_type "openvla"' in message
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json: not a JSON object"):
        recognise(tmp_path)


def test_a_declared_family_survives_making_the_directory_absolute(tmp_path: Path) -> None:
    """Record, replay and sim hand the checkpoint to a node in another working directory."""
    from vla_accel_ros.ros.parameters import PolicySettings
    from vla_accel_ros.rosbag.recorder import RecordOptions

    ref = CheckpointRef.parse("hf:checkpoints/hf_small").resolved()
    assert ref.declared_family == "hf" and ref.directory.is_absolute()
    assert str(ref) == f"hf:{Path('checkpoints/hf_small').resolve()}"
    options = RecordOptions(out=str(tmp_path / "bag"), policy=PolicySettings(checkpoint="hf:checkpoints/hf_small"))
    assert options.custom()["checkpoint"] == str(ref)


def test_the_action_space_is_the_one_declared(own_dir: Path, hf_dir: Path, tmp_path: Path) -> None:
    from vla_accel_ros.core.actions import EE_DELTA, JOINT_POSITION
    from vla_accel_ros.core.resources import share_dir
    from vla_accel_ros.core.robot_record import LEGACY_ROBOT
    from vla_accel_ros.models.load import declared_action_space

    assert declared_action_space(own_dir) == EE_DELTA  # the package's own record
    assert declared_action_space(hf_dir) == EE_DELTA  # no robot recorded: end-effector deltas
    joint = tmp_path / "joint"  # the same model, its record saying absolute joint positions
    joint.mkdir()
    for item in own_dir.iterdir():
        (joint / item.name).symlink_to(item)
    (joint / "model.json").unlink()
    meta = json.loads((own_dir / "model.json").read_text())
    meta["robot"] = {**meta.get("robot", LEGACY_ROBOT), "action_space": JOINT_POSITION}
    (joint / "model.json").write_text(json.dumps(meta))
    assert declared_action_space(joint) == JOINT_POSITION
    # a policy server's: its spec's (DROID answers with joint velocities, executed as positions)
    droid = share_dir() / "config" / "openpi" / "droid.json"
    assert declared_action_space(f"openpi://127.0.0.1:9?spec={droid}") == JOINT_POSITION
    assert declared_action_space("openpi://127.0.0.1:9") == EE_DELTA  # LIBERO's keys, our actions
