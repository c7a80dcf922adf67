"""Bag reading by topic, a replay that produces no command, and the command line's --remap kept out of rcl."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("rclpy")

from vla_accel_ros.cli import main as cli_main  # noqa: E402
from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.rosbag.compare import no_command_cause, verdict  # noqa: E402
from vla_accel_ros.rosbag.io import (  # noqa: E402
    TOPICS,
    BagWriter,
    make_image,
    make_joint_state,
    make_string,
    open_bag,
)
from vla_accel_ros.rosbag.replayer import BagPlayer  # noqa: E402

KIN = ArmKinematics(default_urdf())
Q_HOME = [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]
OTHER_ARM = [f"ur_joint_{k}" for k in range(1, 7)]  # a six-joint arm: none of the URDF's names
PLAYER_DOMAIN_ID = 72
REALTIME_DOMAIN_ID = 73


def write_bag(path: Path, joint_names: list[str], positions: list[float], storage: str = "mcap",
              joints_topic: str = TOPICS["joint_states"][0], frames: int = 6) -> Path:
    """``frames`` camera frames at 20 Hz, each with a joint state at the same stamp, and an instruction."""
    with BagWriter(path, storage) as writer:
        writer.write(TOPICS["instruction"][0], 10**12 - 1, make_string("pick up the red cube"))
        for k in range(frames):
            t = 10**12 + k * 50_000_000
            writer.write(joints_topic, t, make_joint_state(joint_names, positions, t))
            writer.write(TOPICS["camera"][0], t, make_image(np.full((32, 32, 3), 80, np.uint8), t))
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Any) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("edges") / "ckpt")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_messages_yield_only_the_requested_topics(tmp_path: Path, storage: str) -> None:
    bag = write_bag(tmp_path / "bag", list(KIN.joint_names), Q_HOME, storage=storage, frames=3)
    camera, joints, instruction = (TOPICS[r][0] for r in ("camera", "joint_states", "instruction"))
    with open_bag(bag) as reader:
        assert list(reader.messages(["/not/in/the/bag"])) == []
        assert list(reader.messages([])) == []
        assert list(reader.messages(["/not/in/the/bag"], raw=True)) == []
        assert [m.topic for m in reader.messages([joints, "/absent"])] == [joints] * 3
        assert {m.topic for m in reader.messages([camera, instruction])} == {camera, instruction}
        assert len(list(reader.messages())) == reader.message_count == 7  # no argument: everything


def test_messages_select_by_remapped_names(tmp_path: Path) -> None:
    bag = write_bag(tmp_path / "bag", list(KIN.joint_names), Q_HOME, joints_topic="/robot/joints", frames=3)
    with open_bag(bag, remap={"/robot/joints": TOPICS["joint_states"][0]}) as reader:
        got = list(reader.messages([TOPICS["joint_states"][0]]))
        assert [m.topic for m in got] == [TOPICS["joint_states"][0]] * 3
        assert list(reader.messages(["/robot/joints"])) == []  # that name is remapped away


def test_replay_of_another_arm_exits_2_and_says_why(tmp_path: Path, ckpt: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bag = write_bag(tmp_path / "ur_bag", OTHER_ARM, [0.0] * 6)
    rc = cli_main(["replay", str(bag), "--checkpoint", str(ckpt), "--summary", str(tmp_path / "s")])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "6 frames -> 0 commands" in out
    assert "replay: error: no command produced" in err
    assert "ur_joint_1" in err and KIN.joint_names[0] in err and "another arm" in err
    # the same bag of this arm replays to commands and exits 0
    good = write_bag(tmp_path / "bag", list(KIN.joint_names), Q_HOME)
    assert cli_main(["replay", str(good), "--checkpoint", str(ckpt)]) == 0


@pytest.mark.parametrize("facts, words", [
    ({"frames": 0}, ["no camera frames"]),
    ({"joint_states": 0}, ["no joint states"]),
    ({"errors": ["image rejected: 0x0 (x6)"]}, ["rejected its input", "image rejected"]),
    ({"inferences": 0}, ["no inference ran"]),
    ({"node_log": "/tmp/replay_node.log"}, ["no command for 6 frames", "/tmp/replay_node.log"]),
])
def test_no_command_cause_names_what_the_replay_saw(facts: dict[str, Any], words: list[str]) -> None:
    summary: dict[str, Any] = {"frames": 6, "joint_states": 6, "joint_state_names": list(KIN.joint_names),
                               "arm_joints": list(KIN.joint_names), "errors": [], **facts}
    cause = no_command_cause(summary)
    assert all(w in cause for w in words), cause


def test_the_player_node_takes_no_remap_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    bag = write_bag(tmp_path / "bag", list(KIN.joint_names), Q_HOME, frames=1)
    argv = ["vla-accel", "replay", str(bag), "--remap", f"{TOPICS['joint_states'][0]}:=/robot/joints"]
    monkeypatch.setattr(sys, "argv", list(argv))
    with open_bag(bag) as reader:
        player = BagPlayer(PLAYER_DOMAIN_ID, reader, KIN)
        try:
            assert player.pubs["joint_states"].topic_name == TOPICS["joint_states"][0]
            assert player.node.resolve_topic_name(TOPICS["joint_states"][0]) == TOPICS["joint_states"][0]
        finally:
            player.close()
    assert sys.argv == argv  # restored after rclpy.init
    assert "Found remap rule" not in capfd.readouterr().err


def test_realtime_replay_with_remaps_and_no_command_exits_2_without_rcl_warnings(tmp_path: Path, ckpt: Path) -> None:
    bag = write_bag(tmp_path / "ur_bag", OTHER_ARM, [0.0] * 6, joints_topic="/robot/joints", frames=4)
    proc = subprocess.run(
        [sys.executable, "-m", "vla_accel_ros.cli", "replay", str(bag), "--mode", "realtime", "--checkpoint", str(ckpt),
         "--remap", f"/robot/joints:={TOPICS['joint_states'][0]}", "--domain-id", str(REALTIME_DOMAIN_ID),
         "--summary", str(tmp_path / "s"), "--timeout-s", "120"],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert "Found remap rule" not in proc.stderr
    assert "no command produced" in proc.stderr and "ur_joint_1" in proc.stderr


def test_a_verdict_within_the_tolerance_but_short_of_matches_says_why() -> None:
    """Every difference within the tolerance, but too few recorded commands matched in time: the
    verdict is DIVERGED and says which of the two it is."""
    summary: dict[str, Any] = {"mode": "deterministic", "recording": "live", "frames": 257, "commands": 257,
                               "recorded_commands": 79, "matched": 46, "recorded_matched": 46, "identical": False,
                               "within_tolerance": False, "tolerance": 0.217, "tolerance_source": "recording",
                               "max_abs_diff": 0.07, "mean_abs_diff": 0.01, "first_divergent_step": None,
                               "errors": [], "unsafe_commands": 0}
    line = verdict(summary)
    assert "DIVERGED" in line and "only 46 of the 79 recorded commands" in line and "90% of them needed" in line
    assert "first beyond it" not in line
    assert "only" not in verdict({**summary, "within_tolerance": True, "recorded_matched": 79})
