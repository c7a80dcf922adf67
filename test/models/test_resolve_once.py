"""A checkpoint is resolved once per process start: its ``config.json`` is opened once, by
:func:`~vla_accel_ros.models.load.resolve_checkpoint`, and never again while its family loads the
policy; an inference child, which gets the resolved record as JSON
(:meth:`~vla_accel_ros.models.api.ResolvedCheckpoint.to_json`), does not open it at all.

Each count runs in a fresh Python process of its own, with an audit hook (``sys.addaudithook``)
counting the ``open`` events of the directory's ``config.json``: one process resolves and loads (as
the node or a command does), a second loads from the record the first printed (as the child does).
The checkpoints: a Hugging Face VLA (``checkpoints/hf_small``), an OpenVLA and an OpenVLA-OFT
directory written by ``test/fixtures/{openvla,oft}/layout.py``, and the LeRobot SmolVLA fixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "test" / "fixtures"
HF_SMALL = ROOT / "checkpoints" / "hf_small"
SMOLVLA = FIXTURES / "lerobot" / "smolvla"
SMOLVLA_TOKENIZER = FIXTURES / "lerobot" / "tokenizers" / "smolvlm2"

# argv: the directory, "resolve" (resolve, then load) or "child" (load the record read from stdin),
# and a tokenizer directory ("" for none). Prints one JSON line: the opens and the resolved record.
COUNT_OPENS = r'''
import json
import os
import sys

directory = os.path.realpath(sys.argv[1])
config_file = os.path.join(directory, "config.json")
opens = []


def count(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.endswith("config.json") and os.path.realpath(path) == config_file:
            opens.append(path)


sys.addaudithook(count)

from pathlib import Path

from vla_accel_ros.models.api import ResolvedCheckpoint
from vla_accel_ros.models.load import load_policy, resolve_checkpoint

options = {"tokenizer_dir": Path(sys.argv[3])} if sys.argv[3] else {}
if sys.argv[2] == "resolve":
    resolved = resolve_checkpoint(directory)
else:
    resolved = ResolvedCheckpoint.from_json(json.loads(sys.stdin.read()))
load_policy(resolved, **options)
print(json.dumps({"opens": len(opens), "resolved": resolved.to_json()}))
'''


def _openvla_dir(root: Path, layout) -> Path:
    return layout("openvla").write_openvla_dir(root / "openvla")


def _oft_dir(root: Path, layout) -> Path:
    from vla_accel_ros.models.oft.weights import convert_directory

    directory = layout("oft").write_oft_dir(root / "oft")
    convert_directory(directory, report=lambda line: None)
    return directory


CHECKPOINTS = {
    "hf_small": (lambda root, layout: HF_SMALL, ""),
    "openvla": (_openvla_dir, ""),
    "oft": (_oft_dir, ""),
    "lerobot_smolvla": (lambda root, layout: SMOLVLA, str(SMOLVLA_TOKENIZER)),
}


def _count_opens(directory: Path, mode: str, tokenizer: str, record: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", COUNT_OPENS, str(directory), mode, tokenizer], input=record,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    if proc.returncode:
        pytest.fail(f"{mode} of {directory} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_config_json_is_opened_once_per_start_and_never_by_the_child(name, tmp_path, fixture_layout) -> None:
    make, tokenizer = CHECKPOINTS[name]
    directory = make(tmp_path, fixture_layout)
    assert (directory / "config.json").is_file()
    started = _count_opens(directory, "resolve", tokenizer)
    assert started["opens"] == 1, f"{directory / 'config.json'} opened {started['opens']} times by resolve + load"
    assert started["resolved"]["config"] == json.loads((directory / "config.json").read_text())
    child = _count_opens(directory, "child", tokenizer, json.dumps(started["resolved"]))
    assert child["opens"] == 0, f"{directory / 'config.json'} opened {child['opens']} times loading the record"
    assert child["resolved"] == started["resolved"]
