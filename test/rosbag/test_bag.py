"""Record and replay rosbag2 (mcap and sqlite3): exact reproduction, live round trip, broken bags."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("rclpy")
os.environ.setdefault("MUJOCO_GL", "egl")

from vla_accel_ros.cli import main as cli_main  # noqa: E402
from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.ros.parameters import PolicySettings  # noqa: E402
from vla_accel_ros.rosbag.io import (  # noqa: E402
    TOPICS,
    BagError,
    BagWriter,
    make_image,
    make_joint_state,
    open_bag,
)
from vla_accel_ros.rosbag.recorder import RecordOptions, record  # noqa: E402
from vla_accel_ros.rosbag.replay_settings import ReplayOptions  # noqa: E402
from vla_accel_ros.rosbag.replayer import replay  # noqa: E402

torch.set_num_threads(1)
KIN = ArmKinematics(default_urdf())
RECORDED_TOPICS = ("camera", "joint_states", "instruction", "commands", "gripper", "clock", "robot_description",
                   "stats")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bags")


@pytest.fixture(scope="module")
def ckpt(work, tiny_checkpoint) -> Path:
    return tiny_checkpoint(work / "ckpt")


@pytest.fixture(scope="module")
def det_bag(work, ckpt) -> Path:
    """A deterministic sim recording: 2 short episodes (the second starts with a reset)."""
    out = work / "det_mcap"
    record(RecordOptions(episodes=2, out=str(out), mode="deterministic", duration_s=0.6,
                         policy=PolicySettings(checkpoint=str(ckpt), decoder="kerv"), seed=3), progress=False)
    return out


def commands_of(bag: Path) -> list[tuple[int, np.ndarray]]:
    with open_bag(bag) as reader:
        return [(m.log_ns, np.asarray(m.msg.data, dtype=float)) for m in reader.messages([TOPICS["commands"][0]])]


def test_deterministic_recording_holds_every_topic_and_its_settings(det_bag, ckpt):
    with open_bag(det_bag) as bag:
        for role in RECORDED_TOPICS + ("episode",):
            assert bag.count(TOPICS[role][0]) > 0, role
        frames = bag.count(TOPICS["camera"][0])
        assert bag.count(TOPICS["commands"][0]) == frames == 2 * 12  # 20 Hz frames over 2 x 0.6 s
        assert bag.count(TOPICS["joint_states"][0]) == 5 * frames
        assert bag.custom["mode"] == "deterministic" and bag.custom["checkpoint"] == str(ckpt.resolve())
        assert bag.custom["kf_fill_check"] is False  # stored, so that a replay decodes alike
        episodes = [json.loads(m.msg.data) for m in bag.messages([TOPICS["episode"][0]])]
    assert [e["seed"] for e in episodes] == [3, 4]
    metadata = (det_bag / "metadata.yaml").read_text()
    assert "storage_identifier: mcap" in metadata and "version: 9" in metadata


def test_replay_reproduces_a_deterministic_recording_and_two_replays_are_bit_identical(det_bag, work):
    summaries, outputs = [], []
    for k in range(2):
        out = work / f"replay_{k}"
        summaries.append(replay(ReplayOptions(bag=str(det_bag), out=str(out), summary=str(work / f"s{k}")),
                                progress=False))
        outputs.append(commands_of(out))
    s = summaries[0]
    assert s["frames"] == s["commands"] == s["recorded_commands"] == s["matched"] == 24
    assert s["max_abs_diff"] <= 1e-6 and s["identical"] and s["within_tolerance"]
    assert s["first_divergent_step"] is None and s["unsafe_commands"] == 0 and s["errors"] == []
    assert set(s["per_joint"]) == set(KIN.joint_names)
    assert s["sources"].get("policy", 0) >= 20  # the policy, not a hold, produced them
    on_disk = json.loads((work / "s0" / "summary.json").read_text())
    assert on_disk["identical"] is True and on_disk["frames"] == 24
    # Two replays: the same stamps and bit-identical values.
    assert [t for t, _ in outputs[0]] == [t for t, _ in outputs[1]]
    assert all(a.tobytes() == b.tobytes() for (_, a), (_, b) in zip(outputs[0], outputs[1]))
    # and the replayed commands are the recorded ones (arm order = controller order by default)
    recorded = commands_of(det_bag)
    assert all(a.tobytes() == b.tobytes() for (_, a), (_, b) in zip(outputs[0], recorded))


def test_sqlite3_storage_round_trip(work, ckpt):
    bag = work / "det_sqlite"
    record(RecordOptions(episodes=1, out=str(bag), mode="deterministic", storage="sqlite3",
                         policy=PolicySettings(checkpoint=str(ckpt), decoder="ar"), duration_s=0.4), progress=False)
    assert list(bag.glob("*.db3")) and "storage_identifier: sqlite3" in (bag / "metadata.yaml").read_text()
    out = work / "det_sqlite_replay"
    s = replay(ReplayOptions(bag=str(bag), out=str(out), storage="sqlite3"), progress=False)
    assert s["identical"] and s["commands"] == 8 and s["decoder"] == "ar"  # the recording's decoder
    assert len(commands_of(out)) == 8


def test_replay_command_line_prints_a_verdict_and_can_check(det_bag, work, capsys):
    rc = cli_main(["replay", str(det_bag), "--summary", str(work / "cli"), "--check"])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("replay ("))
    assert rc == 0 and "IDENTICAL" in line and "24 frames -> 24 commands" in line
    assert "at tolerance 1e-06 rad" in line and "live recording" not in line
    assert out.strip().splitlines()[-1] == f"replay -> {work / 'cli'} (summary.json, replay_steps.csv, replay.png)"
    # Another decoder than the recording's: the commands differ, and --check says so.
    rc = cli_main(["replay", str(det_bag), "--decoder", "ar", "--summary", str(work / "cli_ar"), "--check"])
    summary = json.loads((work / "cli_ar" / "summary.json").read_text())
    assert rc == 1 and not summary["identical"] and summary["max_abs_diff"] > 1e-6
    assert summary["first_divergent_step"] is not None


def test_the_replay_report_holds_every_step_and_a_plot(det_bag, work):
    s = replay(ReplayOptions(bag=str(det_bag), summary=str(work / "report")), progress=False)
    assert s["recording"] == "deterministic" and s["tolerance"] == 1e-6 and s["tolerance_source"] == "recording"
    with open(work / "report" / "replay_steps.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["time_s", "joint", "recorded", "replayed", "difference", "source"]
    fingers = list(KIN.gripper_joint_names)
    assert len(rows) == s["commands"] * (7 + len(fingers))
    assert [r["joint"] for r in rows[:7 + len(fingers)]] == [*KIN.joint_names, *fingers]
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and 0.0 <= times[0] < 1.0  # seconds since the bag's start, not stamps
    assert all(float(r["difference"]) == 0.0 for r in rows if r["joint"] in KIN.joint_names)
    assert {r["source"] for r in rows} <= {"policy", "fallback", "hold"}
    assert (work / "report" / "replay.png").read_bytes()[:4] == b"\x89PNG"
    assert s["steps_csv"] == str(work / "report" / "replay_steps.csv") and len(s["episode_boundaries_s"]) == 2


def test_a_live_recording_is_judged_at_a_stated_tolerance(det_bag, work, capsys):
    """The deterministic bag relabelled a live recording: the tolerance becomes two periods of the
    slowest joint's motion, and the verdict says why; --tolerance still decides when given."""
    bag = _copy(det_bag, work / "relabelled_live")
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())
    info = meta["rosbag2_bagfile_information"]["custom_data"]
    info["vla_accel"] = json.dumps({**json.loads(info["vla_accel"]), "mode": "live"})
    (bag / "metadata.yaml").write_text(yaml.safe_dump(meta))
    assert cli_main(["replay", str(bag), "--summary", str(work / "live_report"), "--check"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("replay ("))
    expected = 2 * 0.05 * float(min(KIN.limits.velocity[:7]))
    summary = json.loads((work / "live_report" / "summary.json").read_text())
    assert summary["recording"] == "live" and summary["tolerance"] == pytest.approx(expected)
    assert "of a live recording" in line and f"at tolerance {expected:.3g} rad" in line
    assert "cannot reproduce bit-identically" in line and "--mode deterministic" in line
    assert cli_main(["replay", str(bag), "--summary", str(work / "live_strict"), "--tolerance", "0"]) == 0
    summary = json.loads((work / "live_strict" / "summary.json").read_text())
    assert summary["tolerance"] == 0 and summary["tolerance_source"] == "--tolerance"


def test_live_recording_then_replays(work, ckpt, capsys):
    """The live node over DDS recorded by the recorder node; both replay modes on it. The command
    line's verdict names the live recording's tolerance and why, the report holds the per-step CSV
    and the plot, and no library warning (torch on a read-only frame) is raised on the way."""
    bag = work / "live"
    s = record(RecordOptions(episodes=1, out=str(bag), policy=PolicySettings(checkpoint=str(ckpt)), duration_s=1.0,
                             domain_id=40), progress=False)
    assert s["commands"] > 5
    with open_bag(bag) as reader:
        for role in RECORDED_TOPICS:
            assert reader.count(TOPICS[role][0]) > 0, role
        stamps = [m.log_ns for m in reader.messages([TOPICS["joint_states"][0]])]
    assert stamps == sorted(stamps) and stamps[0] > 10**18  # receive stamps on the sim clock (epoch ns)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli_main(["replay", str(bag), "--out", str(work / "live_det"), "--summary", str(work / "live_cli")]) == 0
    assert not [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("replay ("))
    det = json.loads((work / "live_cli" / "summary.json").read_text())
    assert det["recording"] == "live" and f"at tolerance {det['tolerance']:.3g} rad" in line, line
    assert "of a live recording" in line and "--mode deterministic" in line, line
    with open(work / "live_cli" / "replay_steps.csv", newline="") as file:
        assert len(list(csv.DictReader(file))) >= det["commands"] * 7
    assert (work / "live_cli" / "replay.png").read_bytes()[:4] == b"\x89PNG"
    # Every frame gives a command once a joint state is known; in a live recording a frame or two
    # may arrive before the first joint state (DDS discovery order).
    assert det["frames"] - 2 <= det["commands"] <= det["frames"] and det["commands"] > 0
    assert det["unsafe_commands"] == 0
    assert det["matched"] > 0 and np.isfinite(det["max_abs_diff"])  # reported, not expected to be 0
    rt = replay(ReplayOptions(bag=str(bag), mode="realtime", out=str(work / "live_rt"), summary=str(work / "rt"),
                              domain_id=41, timeout_s=120), progress=False)
    assert rt["commands"] > 5 and rt["matched"] > 0 and rt["unsafe_commands"] == 0
    assert all(KIN.within_limits(q) for _, q in commands_of(work / "live_rt"))


# --- broken bags -------------------------------------------------------------------------------
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _truncate(bag: Path) -> None:
    data = next(p for p in bag.iterdir() if p.suffix in (".mcap", ".db3"))
    os.truncate(data, data.stat().st_size // 2)


def _scramble(bag: Path) -> None:
    data = next(p for p in bag.iterdir() if p.suffix in (".mcap", ".db3"))
    raw = bytearray(data.read_bytes())
    rng = np.random.default_rng(0)
    raw[len(raw) // 3: 2 * len(raw) // 3] = rng.integers(0, 256, 2 * len(raw) // 3 - len(raw) // 3,
                                                         dtype=np.uint8).tobytes()
    data.write_bytes(bytes(raw))


def _camera_less(bag: Path) -> None:
    with BagWriter(bag) as writer:
        for k in range(5):
            t = 10**12 + k * 10**7
            writer.write(TOPICS["joint_states"][0], t, make_joint_state(KIN.joint_names, np.zeros(7), t))


def _metadata_garbage(bag: Path) -> None:
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [not, a, mapping\n")


@pytest.mark.parametrize("name, breaker, words", [
    ("truncated", _truncate, ["truncated or corrupt", "cannot be opened"]),
    ("scrambled", _scramble, ["truncated or corrupt", "cannot be opened", "cannot decode"]),
    ("metadata", _metadata_garbage, ["cannot be opened"]),
    ("no_camera", None, ["lacks topic", "/camera/image_raw"]),
    ("missing", None, ["does not exist"]),
])
def test_broken_bags_exit_non_zero_with_a_clear_message(det_bag, work, ckpt, capsys, name, breaker, words):
    bag = work / f"broken_{name}"
    if name == "no_camera":
        _camera_less(bag)
    elif breaker is not None:
        breaker(_copy(det_bag, bag))
    rc = cli_main(["replay", str(bag), "--checkpoint", str(ckpt), "--timeout-s", "60"])
    err = capsys.readouterr().err
    assert rc == 2 and str(bag) in err
    assert any(w in err for w in words), err
    if name == "no_camera":
        assert all(w in err for w in words)


def test_broken_sqlite3_bag_and_a_real_process_never_hangs(work, ckpt):
    bag = work / "sq_broken"
    with BagWriter(bag, "sqlite3") as writer:
        for k in range(40):
            t = 10**12 + k * 10**7
            writer.write(TOPICS["joint_states"][0], t, make_joint_state(KIN.joint_names, np.zeros(7), t))
            writer.write(TOPICS["camera"][0], t, make_image(np.zeros((32, 32, 3), np.uint8), t))
    _truncate(bag)
    proc = subprocess.run([sys.executable, "-m", "vla_accel_ros.cli", "replay", str(bag), "--checkpoint", str(ckpt)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "replay: error:" in proc.stderr and str(bag) in proc.stderr
    with pytest.raises(BagError, match="malformed|corrupt|cannot be opened"):
        with open_bag(bag) as reader:
            list(reader.messages())


def test_remap_renames_bag_topics(work, ckpt):
    bag = work / "remapped"
    with BagWriter(bag) as writer:
        for k in range(10):
            t = 10**12 + k * 50_000_000
            writer.write("/robot/joints", t,
                         make_joint_state(KIN.joint_names, [0, -0.785, 0, -2.356, 0, 1.571, 0.785], t))
            writer.write("/cam/rgb", t, make_image(np.full((48, 64, 3), 90, np.uint8), t))
    opts = dict(policy={"checkpoint": str(ckpt)}, instruction="pick up the red cube")
    with pytest.raises(BagError, match="lacks topic"):
        replay(ReplayOptions(bag=str(bag), **opts), progress=False)
    s = replay(ReplayOptions(bag=str(bag), remap=("/robot/joints:=/joint_states", "/cam/rgb:=/camera/image_raw"),
                             **opts), progress=False)
    assert s["frames"] == s["commands"] == 10 and s["recorded_commands"] == 0 and not s["identical"]
    assert s["unsafe_commands"] == 0
