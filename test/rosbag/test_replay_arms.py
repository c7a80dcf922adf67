"""Replay of another arm's bag: --urdf, --tcp-frame, --controller-joints and --params-file, the
bag's /robot_description, the check against the checkpoint's robot, CompressedImage in realtime
and the input errors counted by kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("rclpy")

from vla_accel_ros.cli import main as cli_main
from vla_accel_ros.core.errors import RunFailed
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.ros.processes import exit_error
from vla_accel_ros.rosbag.io import (
    TOPICS,
    BagWriter,
    make_compressed_image,
    make_float_array,
    make_image,
    make_joint_state,
    make_string,
    open_bag,
)
from vla_accel_ros.rosbag.replay_settings import (
    ReplayOptions,
    node_arguments,
    node_settings,
    overrides_yaml,
)

PACKAGE_ARM = list(ArmKinematics(default_urdf()).joint_names)
FR = [f"fr_joint{k}" for k in range(1, 8)]  # the foreign arm's joints
FR_HOME = [0.0, 0.5, 0.0, -1.2, 0.0, 1.0, 0.0]
REALTIME_DOMAIN_ID = 74
REFUSAL_DOMAIN_ID = 75


def arm_urdf(dof: int = 7, prefix: str = "fr_", tool: str = "fr_tool") -> str:
    """A small serial arm: ``dof`` revolute joints (``<prefix>joint<k>``, alternating axes, limits
    and velocities on each), a flange and a TCP frame ``tool`` beyond it."""
    links = [f'<link name="{prefix}base"/>']
    joints = []
    parent = f"{prefix}base"
    for k in range(1, dof + 1):
        child = f"{prefix}link{k}"
        axis = "0 0 1" if k % 2 else "0 1 0"
        links.append(f'<link name="{child}"/>')
        joints.append(f'<joint name="{prefix}joint{k}" type="revolute"><parent link="{parent}"/><child link="{child}"/>'
                      f'<origin xyz="0 0 {0.3 if k == 1 else 0.15}"/><axis xyz="{axis}"/>'
                      f'<limit lower="-2.9" upper="2.9" velocity="2.0" effort="50"/></joint>')
        parent = child
    for name, length in ((f"{prefix}flange", 0.05), (tool, 0.1)):
        links.append(f'<link name="{name}"/>')
        joints.append(f'<joint name="{name}_joint" type="fixed"><parent link="{parent}"/><child link="{name}"/>'
                      f'<origin xyz="0 0 {length}"/></joint>')
        parent = name
    return f'<?xml version="1.0"?>\n<robot name="{prefix}arm">\n' + "\n".join(links + joints) + "\n</robot>\n"


def write_arm_bag(path: Path, names: list[str], positions: list[float], *, frames: int = 6, urdf: str = "",
                  compressed: bool = False, bad_every: int = 0, commands: bool = False,
                  custom: dict[str, Any] | None = None) -> Path:
    """``frames`` camera frames at 20 Hz, each with a joint state at its stamp, an instruction,
    optionally the arm's /robot_description, recorded commands (URDF order) and, every ``bad_every``
    frames, an undecodable image and a joint state with a NaN (two kinds of bad input)."""
    camera_type = "sensor_msgs/msg/CompressedImage" if compressed else "sensor_msgs/msg/Image"
    with BagWriter(path, custom=custom) as writer:
        t0 = 10**12
        if urdf:
            writer.write(TOPICS["robot_description"][0], t0 - 2, make_string(urdf))
        writer.write(TOPICS["instruction"][0], t0 - 1, make_string("pick up the red cube"))
        rgb = np.full((32, 32, 3), 80, np.uint8)
        for k in range(frames):
            t = t0 + k * 50_000_000
            bad = bool(bad_every) and k % bad_every == bad_every - 1
            q = list(positions)
            if bad:
                q[2] = float("nan")
            writer.write(TOPICS["joint_states"][0], t, make_joint_state(names, q, t))
            if compressed:
                image = make_compressed_image(rgb, t)
                if bad:
                    image.data = np.frombuffer(b"not a jpeg at all", dtype=np.uint8).copy()
            else:
                image = make_image(rgb, t)
            assert image.__msgtype__ == camera_type
            writer.write(TOPICS["camera"][0], t, image)
            if commands:
                writer.write(TOPICS["commands"][0], t, make_float_array(positions))
    return path


def out_commands(bag: Path) -> list[np.ndarray]:
    with open_bag(bag) as reader:
        return [np.asarray(m.msg.data, dtype=float) for m in reader.messages([TOPICS["commands"][0]])]


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Any) -> dict[str, Path]:
    """The checkpoint, the foreign arm's URDF (7 and 6 DoF), its params file, and its bags."""
    root = tmp_path_factory.mktemp("arms")
    urdf = root / "fr_arm.urdf"
    urdf.write_text(arm_urdf())
    urdf6 = root / "fr6_arm.urdf"
    urdf6.write_text(arm_urdf(dof=6))
    params = root / "fr_arm.yaml"
    params.write_text(f"/**:\n  ros__parameters:\n    decoder: sd\nvla_accel_node:\n  ros__parameters:\n"
                      f"    urdf_file: {urdf}\n    tcp_frame: fr_tool\n    decoder: kerv\n"
                      f"    allow_unmatched_robot: true\n    use_sim_time: false\n")
    recording = {"decoder": "ar"}  # the recording's own settings: the params file and flags outrank them
    return {
        "ckpt": tiny_checkpoint(root / "ckpt"),
        "urdf": urdf, "urdf6": urdf6, "params": params,
        "plain": write_arm_bag(root / "plain", FR, FR_HOME, commands=True, custom=recording),
        "described": write_arm_bag(root / "described", FR, FR_HOME, urdf=arm_urdf(), custom=recording),
        "six": write_arm_bag(root / "six", FR[:6], FR_HOME[:6]),
        "bad_input": write_arm_bag(root / "bad_input", PACKAGE_ARM, [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785],
                                   frames=8, compressed=True, bad_every=2),
        "root": root,
    }


def run_cli(arms: dict[str, Path], bag: str, flags: list[str], tag: str,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | None, str]:
    summary_dir = arms["root"] / f"s_{tag}"
    out = arms["root"] / f"out_{tag}"
    words = [w.format(**{k: str(v) for k, v in arms.items()}) for w in flags]
    rc = cli_main(["replay", str(arms[bag]), "--checkpoint", str(arms["ckpt"]), "--summary", str(summary_dir),
                   "--out", str(out), *words])
    err = capsys.readouterr().err
    path = summary_dir / "summary.json"
    return rc, (json.loads(path.read_text()) if path.is_file() else None), err


ALLOW = "--allow-unmatched-robot"
FLAG_CASES = [
    # id, bag, flags, exit status, summary items, words on stderr
    ("package-urdf", "plain", [ALLOW], 2, {"arm_joints": PACKAGE_ARM, "commands": 0, "decoder": "ar"},
     ["no command produced", "another arm", "--urdf"]),
    ("urdf-and-tcp-frame", "plain", ["--urdf", "{urdf}", "--tcp-frame", "fr_tool", ALLOW], 0,
     {"arm_joints": FR, "tcp_frame": "fr_tool", "commands": 6, "controller_joints": FR},
     ["replay: warning:", "fr_tool"]),
    ("urdf-without-its-tcp-frame", "plain", ["--urdf", "{urdf}", ALLOW], 2, None, ["bad URDF", "'tcp'"]),
    ("another-tcp-frame", "plain", ["--urdf", "{urdf}", "--tcp-frame", "fr_flange", ALLOW], 0,
     {"tcp_frame": "fr_flange", "commands": 6}, ["'fr_flange'"]),
    ("controller-joints", "plain", ["--urdf", "{urdf}", "--tcp-frame", "fr_tool", ALLOW, "--controller-joints",
                                    ",".join(reversed(FR))], 0, {"controller_joints": FR[::-1], "commands": 6}, []),
    ("params-file", "plain", ["--params-file", "{params}"], 0,
     {"arm_joints": FR, "tcp_frame": "fr_tool", "decoder": "kerv", "commands": 6}, ["replay: warning:"]),
    ("flags-over-the-params-file", "plain", ["--params-file", "{params}", "--decoder", "sd", "--tcp-frame",
                                             "fr_flange"], 0, {"decoder": "sd", "tcp_frame": "fr_flange"}, []),
    ("bag-robot-description", "described", ["--tcp-frame", "fr_tool", ALLOW], 0,
     {"arm_joints": FR, "commands": 6, "urdf": "the bag's /robot_description"}, []),
    ("urdf-over-the-bag-robot-description", "described", ["--urdf", "{urdf6}", "--tcp-frame", "fr_tool", ALLOW],
     2, None, ["refusing to drive a 6-DoF arm"]),
]


@pytest.mark.parametrize("tag, bag, flags, rc, expected, words", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_each_flag_changes_what_the_replay_does(arms: dict[str, Path], capsys: pytest.CaptureFixture[str], tag: str,
                                               bag: str, flags: list[str], rc: int, expected: dict[str, Any] | None,
                                               words: list[str]) -> None:
    got_rc, summary, err = run_cli(arms, bag, flags, tag, capsys)
    assert got_rc == rc, err
    assert all(w in err for w in words), err
    if expected is None:
        return
    assert summary is not None
    for key, value in expected.items():
        assert (value in summary[key]) if key == "urdf" else (summary[key] == value), (key, summary[key])
    if rc == 0:
        assert summary["unsafe_commands"] == 0 and summary["robot_warning"]


def test_tcp_frame_and_controller_joints_change_the_commands(arms: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--urdf", "{urdf}", ALLOW]
    runs = {}
    for tag, extra in (("ref", ["--tcp-frame", "fr_tool"]), ("flange", ["--tcp-frame", "fr_flange"]),
                       ("reversed", ["--tcp-frame", "fr_tool", "--controller-joints", *reversed(FR)])):
        rc, summary, err = run_cli(arms, "plain", base + extra, f"cmd_{tag}", capsys)
        assert rc == 0, err
        runs[tag] = (summary, out_commands(arms["root"] / f"out_cmd_{tag}"))
    ref, flange, rev = (runs[t][1] for t in ("ref", "flange", "reversed"))
    assert len(ref) == len(flange) == len(rev) == 6
    assert any(not np.array_equal(a, b) for a, b in zip(ref, flange))  # IK at another frame
    assert all(np.array_equal(a[::-1], b) for a, b in zip(ref, rev))  # the same commands, in the controller's order
    # The bag's recorded commands (URDF order) parse in the controller's order: reversed, they do not match.
    assert runs["ref"][0]["matched"] == 6
    assert runs["reversed"][0]["max_abs_diff"] != runs["ref"][0]["max_abs_diff"]


ROBOT_CASES = [
    # id, bag, flags, words on stderr (exit status 2 for each)
    ("same-dof-foreign-arm", "plain", ["--urdf", "{urdf}", "--tcp-frame", "fr_tool"],
     ["fr_joint1", "'joint1'", "'fr_tool'", "'tcp'", "allow_unmatched_robot"]),
    ("six-dof-arm", "six", ["--urdf", "{urdf6}", "--tcp-frame", "fr_tool", ALLOW],
     ["refusing to drive a 6-DoF arm", "made for 7"]),
    ("six-dof-arm-params-file-allows", "six", ["--params-file", "{params}", "--urdf", "{urdf6}"],
     ["refusing to drive a 6-DoF arm"]),
]


@pytest.mark.parametrize("tag, bag, flags, words", ROBOT_CASES, ids=[c[0] for c in ROBOT_CASES])
def test_another_robot_than_the_checkpoints_exits_2_naming_both(arms: dict[str, Path],
                                                               capsys: pytest.CaptureFixture[str], tag: str, bag: str,
                                                               flags: list[str], words: list[str]) -> None:
    rc, summary, err = run_cli(arms, bag, flags, f"robot_{tag}", capsys)
    assert rc == 2 and summary is None
    assert "replay: error:" in err and all(w in err for w in words), err


def test_deterministic_summary_counts_input_errors_by_kind(arms: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The kinds are in summary.json and printed under the verdict, one line each."""
    summary_dir = arms["root"] / "s_det_bad"
    rc = cli_main(["replay", str(arms["bad_input"]), "--checkpoint", str(arms["ckpt"]), "--summary", str(summary_dir),
                   "--out", str(arms["root"] / "out_det_bad")])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    summary = json.loads((summary_dir / "summary.json").read_text())
    kinds = summary["input_errors_by_kind"]
    assert len(kinds) == 2 and sum(kinds.values()) == summary["input_errors"] == 8, kinds
    assert any(k.startswith("image rejected") for k in kinds) and any("non-finite" in k for k in kinds)
    assert summary["commands"] == 8 and len(summary["errors"]) == 2
    lines = printed.out.splitlines()
    at = lines.index("replay: the node rejected input of 2 kind(s):")
    assert lines[at + 1:at + 3] == [f"  - {line}" for line in summary["errors"]], printed.out


def test_params_file_then_flags_reach_the_node_in_that_order(arms: dict[str, Path]) -> None:
    opts = ReplayOptions(bag=str(arms["plain"]), params_file=str(arms["params"]), policy={"decoder": "sd"},
                         tcp_frame="fr_flange")
    settings = node_settings(opts, {"decoder": "ar", "control_rate_hz": 25.0})
    cfg = settings.config
    assert (cfg.policy.decoder, cfg.tcp_frame, cfg.control_rate_hz, cfg.allow_unmatched_robot) == (
        "sd", "fr_flange", 25.0, True)
    assert cfg.urdf_file == str(arms["urdf"]) and "use_sim_time" not in settings.file
    args = node_arguments(settings, {"use_sim_time": True}, "/tmp/over.yaml", str(arms["params"]))
    files = [i for i, a in enumerate(args) if a == "--params-file"]
    assert args[files[0] + 1] == str(arms["params"]) and args[files[1] + 1] == "/tmp/over.yaml"
    assert args.index("decoder:=\"ar\"") < files[0] < files[1] < args.index("decoder:=\"sd\"")
    assert "tcp_frame:=\"fr_flange\"" in args and "use_sim_time:=true" in args
    assert "control_rate_hz:=25.0" in args  # the recording's, as a float
    over = overrides_yaml(settings, {"use_sim_time": True})
    assert over.startswith("/vla_accel_node:\n  ros__parameters:\n") and "decoder: sd" in over


def test_a_recorded_kf_fill_check_reaches_the_replayed_node(arms: dict[str, Path]) -> None:
    opts = ReplayOptions(bag=str(arms["plain"]))
    assert node_settings(opts, {"decoder": "world_aware", "kf_fill_check": True}).config.policy.kf_fill_check is True
    assert node_settings(opts, {"decoder": "world_aware"}).config.policy.kf_fill_check is False  # an older bag
    for custom in ({"decoder": "sd", "kf_fill_check": True}, {"decoder": "kerv", "kf_fill_check": "yes"}):
        with pytest.raises(ValueError, match="kf_fill_check"):
            node_settings(opts, custom)


def test_params_file_errors_name_the_file(arms: dict[str, Path], tmp_path: Path) -> None:
    wrong = tmp_path / "other.yaml"
    wrong.write_text("sim_node:\n  ros__parameters:\n    seed: 1\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("vla_accel_node:\n  ros__parameters:\n    no_such_parameter: 1\n")
    for path, words in ((wrong, "no section for node /vla_accel_node"), (unknown, "no_such_parameter")):
        with pytest.raises(ValueError, match=words) as info:
            node_settings(ReplayOptions(bag=str(arms["plain"]), params_file=str(path)), {})
        assert str(path) in str(info.value)


@pytest.mark.parametrize("log, code, kind, words", [
    (("[INFO] [1.0] [vla_accel_node]: URDF from urdf_file\n[FATAL] [1.1] [vla_accel_node]: refusing to start: "
      "refusing to drive a 6-DoF arm with a policy made for 7 DoF\n"), 2, ConfigError,
     ["refusing to start: refusing to drive a 6-DoF arm", "code 2"]),
    ("Traceback (most recent call last):\n  File x\nImportError: no module named torch\n", 1, RunFailed,
     ["code 1", "ImportError: no module named torch"]),
    ("", -9, RunFailed, ["code -9", "(nothing)"]),
])
def test_exit_error_quotes_the_refusal(tmp_path: Path, log: str, code: int, kind: type, words: list[str]) -> None:
    path = tmp_path / "replay_node.log"
    path.write_text(log)
    err = exit_error(code, path, "before playback")
    assert type(err) is kind and str(path) in str(err) and all(w in str(err) for w in words), err


def test_realtime_compressed_foreign_arm_with_params_file(arms: dict[str, Path]) -> None:
    """The node over DDS: CompressedImage frames, the foreign arm from the params file (urdf_file and
    allow_unmatched_robot) and the flags, two kinds of bad input counted apart."""
    root = arms["root"]
    bag = write_arm_bag(root / "rt_bag", FR, FR_HOME, frames=24, compressed=True, bad_every=3)
    proc = subprocess.run(
        [sys.executable, "-m", "vla_accel_ros.cli", "replay", str(bag), "--mode", "realtime", "--checkpoint",
         str(arms["ckpt"]), "--params-file", str(arms["params"]), "--tcp-frame", "fr_tool", "--domain-id",
         str(REALTIME_DOMAIN_ID), "--summary", str(root / "rt"), "--out", str(root / "rt_out"), "--timeout-s", "120"],
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr + (root / "rt" / "replay_node.log").read_text()
    summary = json.loads((root / "rt" / "summary.json").read_text())
    assert summary["commands"] > 5 and summary["unsafe_commands"] == 0 and summary["arm_joints"] == FR
    kinds = summary["input_errors_by_kind"]
    assert any("image" in k for k in kinds) and any("non-finite" in k for k in kinds), kinds
    assert summary["input_errors"] == sum(kinds.values()) > 0
    assert summary["robot_warning"] and "replay: warning:" in proc.stderr


def test_realtime_node_refusal_ends_the_replay_with_its_reason(arms: dict[str, Path]) -> None:
    root = arms["root"]
    proc = subprocess.run(
        [sys.executable, "-m", "vla_accel_ros.cli", "replay", str(arms["six"]), "--mode", "realtime", "--checkpoint",
         str(arms["ckpt"]), "--urdf", str(arms["urdf6"]), "--tcp-frame", "fr_tool", ALLOW, "--domain-id",
         str(REFUSAL_DOMAIN_ID), "--summary", str(root / "rt_refused"), "--timeout-s", "120"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to start" in proc.stderr and "6-DoF" in proc.stderr, proc.stderr
