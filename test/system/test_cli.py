"""The ``vla-accel`` command line as a user meets it: the grouped command list (and the README's
table of the same commands), ``--help`` without torch, defaults shown, the one shared error path,
and progress that writes whole lines when its output is not a terminal."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vla_accel_ros import cli
from vla_accel_ros.core.progress import LineProgress, progress_bar, success_text

ROOT = Path(__file__).resolve().parents[2]
# What a command's --help must not import: each costs seconds (torch, transformers) or a quarter of one.
HEAVY = ("torch", "transformers", "mujoco", "pinocchio", "rclpy", "matplotlib", "faiss")


def test_the_command_list_groups_every_command_once_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    text = capsys.readouterr().out
    listed = re.findall(r"^  (\S+) +\S", text.split("commands:\n", 1)[1], flags=re.MULTILINE)
    assert sorted(listed) == sorted(cli.COMMANDS) and len(listed) == len(set(listed))
    groups = re.findall(r"^(\w+): ", text.split("commands:\n", 1)[1], flags=re.MULTILINE)
    assert groups == ["run", "evaluate", "train", "inspect", "models"]
    assert all(len(line) <= 110 for line in text.splitlines())


def test_the_readme_lists_every_command() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in cli.COMMANDS if f"`vla-accel {name}" not in readme]
    assert not missing, f"README.md's command table lacks {missing}"


def test_help_imports_neither_torch_nor_the_simulators() -> None:
    """Every command's --help in one fresh interpreter: none of the heavy modules is imported."""
    script = ("import contextlib, io, json, sys\n"
              "from vla_accel_ros import cli\n"
              "for name in cli.COMMANDS:\n"
              "    try:\n"
              "        with contextlib.redirect_stdout(io.StringIO()):\n"
              "            cli.main([name, '--help'])\n"
              "    except SystemExit as done:\n"
              "        assert done.code == 0, name\n"
              f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_help_shows_the_defaults(name: str) -> None:
    parser = cli.build_parser(name)
    sub = next(a for a in parser._actions if a.dest == "command").choices[name]
    for action in sub._actions:
        if action.option_strings and action.nargs != 0 and action.default not in (None, "", [], ()):
            assert action.help and "default" in action.help.lower(), f"{name} {action.option_strings}"


def test_sim_and_record_take_the_flags_the_docs_promise() -> None:
    sim = cli.build_parser("sim").parse_args(["sim", "--allow-unmatched-robot"])
    assert sim.allow_unmatched_robot is True
    record = cli.build_parser("record").parse_args(["record", "--temperature", "0"])
    assert record.temperature == 0.0


def test_a_known_error_is_one_line_and_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from vla_accel_ros.commands import sim_speed

    def refuse(args: object) -> int:
        raise ValueError("a bad setting\nover two lines")

    monkeypatch.setattr(sim_speed, "run", refuse)
    assert cli.main(["sim-speed"]) == 2
    assert capsys.readouterr().err == "sim-speed: error: a bad setting over two lines\n"

    def crash(args: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(sim_speed, "run", crash)
    with pytest.raises(KeyError):
        cli.main(["sim-speed"])


def test_progress_off_a_terminal_writes_whole_lines_with_the_success_rate() -> None:
    stream = io.StringIO()
    bar = progress_bar(range(3), desc="eval ar", unit="ep", stream=stream)
    assert isinstance(bar, LineProgress)
    for i, _ in enumerate(bar):
        bar.success(i + 1, i + 1)
    text = stream.getvalue()
    last = text.splitlines()[-1]
    assert "\r" not in text and last.startswith("eval ar: 3/3 ep, ") and last.endswith(", success 100% (3/3) (done)")
    assert success_text(2, 3) == "67% (2/3)"
    quiet = io.StringIO()
    list(progress_bar(range(2), desc="x", disable=True, stream=quiet))
    assert quiet.getvalue() == ""
