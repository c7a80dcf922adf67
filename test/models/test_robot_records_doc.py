"""docs/your_own_vla.md shows a complete ``vla_spec.json`` for each arm of config/examples/: each is
read by the token VLAs' spec reader and the robot-record reader, and the node's robot check passes
it against that example file's joints, TCP frame and policy step (``action_dt_s``), so a team that
copies the pair gets a checked robot, not a refusal."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vla_accel_ros.core.params_file import read_node_parameters
from vla_accel_ros.core.resources import share_dir
from vla_accel_ros.core.robot_record import check_robot, read_robot_record, robot_in_use
from vla_accel_ros.core.settings import from_params
from vla_accel_ros.models.token_vla.spec import SPEC_FILE, load_spec
from vla_accel_ros.ros.parameters import NodeConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "your_own_vla.md"
EXAMPLES = share_dir() / "config" / "examples"


def documented_specs() -> dict[str, dict]:
    """Each example file's name and the ``vla_spec.json`` the doc shows under it."""
    text = DOC.read_text()
    section = text[text.index("## The robot record in `vla_spec.json`"):]
    found = re.findall(r"`(\w+\.yaml)` \([^)]*\):\n\n```json\n(.*?)\n```", section, flags=re.S)
    return {name: json.loads(body) for name, body in found}


def test_the_doc_shows_a_spec_for_every_example_arm() -> None:
    assert sorted(documented_specs()) == sorted(p.name for p in EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_each_documented_spec_is_read_and_passes_the_robot_check(name: str, tmp_path: Path) -> None:
    spec = documented_specs()[name]
    (tmp_path / SPEC_FILE).write_text(json.dumps(spec))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    read = load_spec(tmp_path, {"model_type": "llava"})  # every key known, every value valid
    assert read.unnorm_key == spec["unnorm_key"] and read.dtype == spec["dtype"]
    record = read_robot_record(tmp_path)
    assert record is not None
    cfg = from_params(NodeConfig, read_node_parameters(EXAMPLES / name, "vla_accel_node"))
    in_use = robot_in_use(cfg.controller_joints, cfg.tcp_frame, action_dt_s=cfg.action_dt_s, image_size=cfg.image_size)
    assert check_robot(record, in_use) == ""  # no difference: no refusal, no warning
    assert record.control_rate_hz == pytest.approx(1.0 / cfg.action_dt_s)
