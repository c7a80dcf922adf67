"""Every ``vla-accel`` command that loads a checkpoint, on every kind of bad checkpoint: exactly one
``<command>: error: ...`` line naming the problem, exit status 2, no traceback.

The bad checkpoints: a directory that does not exist (plain and ``hf:``), a truncated safetensors
file (the package's own, a Hugging Face VLA's, a shard of an OpenVLA model), a Hugging Face VLA or
an OpenVLA model without its ``dataset_statistics.json``, a Hugging Face VLA whose ``config.json``
names other sizes than its weights (refused from the headers, naming the tensor and the field), a
``config.json`` of a family the package does not run, a Hugging Face or OpenVLA directory given
(without ``hf:``) to a command that needs the package's own checkpoint, and the example parameter
files' placeholder. Commands run in this process through :func:`vla_accel_ros.cli.main`; one runs as
``python -m vla_accel_ros.cli`` too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from vla_accel_ros.cli import COMMANDS, main

os.environ.setdefault("MUJOCO_GL", "egl")
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("openvla_layout", ROOT / "test" / "fixtures" / "openvla" / "layout.py")
openvla_layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(openvla_layout)  # type: ignore[union-attr]

# Which checkpoints a command takes: any family, only the package's own, only a Hugging Face VLA,
# a token VLA (a Hugging Face or an OpenVLA model), an OpenVLA-OFT model.
ANY, OWN, HF, TOKEN, OFT = "any", "own", "hf", "token", "oft"
# command -> (the families it takes, its arguments; {X}: the checkpoint, {O}: a fresh output path,
# {D}: a demo directory, {B}: a bag, {I}: an image file)
ARGV: dict[str, tuple[str, str]] = {
    "eval": (ANY, "eval --checkpoint {X} --episodes 1 --max-steps 2 --allow-unmatched-robot --out {O}"),
    "bench": (ANY, "bench --checkpoint {X} --episodes 1 --max-steps 2 --decoders ar --no-sweep "
                   "--allow-unmatched-robot --out {O}"),
    "fleet-bench": (ANY, "fleet-bench --checkpoint {X} --robots 1 --steps 2 --out {O}"),
    "sim": (ANY, "sim --checkpoint {X} --episodes 1 --out {O}"),
    "record": (ANY, "record --checkpoint {X} --episodes 1 --duration-s 0.5 --out {O}"),
    "replay": (ANY, "replay {B} --checkpoint {X} --summary {O}"),
    "serve-openpi": (ANY, "serve-openpi --checkpoint {X} --port 0"),
    "soak": (ANY, "soak --checkpoint {X} --minutes 0.1 --out {O}"),
    "predict": (ANY, "predict --checkpoint {X} --image {I} --instruction pick_up_the_red_cube --json"),
    "vision-fidelity": (OWN, "vision-fidelity --checkpoint {X} --episodes 1 --max-steps 2 --out {O}"),
    "demos": (OWN, "demos --policy {X} --episodes 1 --max-steps 2 --out {O}"),
    "train": (OWN, "train --data {D} --out {O} --init {X} --epochs 0 --draft-epochs 0 --no-progress"),
    "train-flow": (OWN, "train-flow --checkpoint {X} --data {D} --out {O} --no-progress"),
    "train-parallel-draft": (OWN, "train-parallel-draft --checkpoint {X} --data {D} --out {O} --no-progress"),
    "train-world": (OWN, "train-world --checkpoint {X} --data {D} --out {O} --no-progress"),
    "build-store": (OWN, "build-store --checkpoint {X} --data {D} --out {O} --no-progress"),
    "train-hf": (HF, "train-hf --data {D} --out {O} --init {X} --epochs 0 --no-progress"),
    "train-smolvla": (HF, "train-smolvla --data {D} --out {O} --vlm-from {X} --epochs 1 --no-progress"),
    "train-draft": (TOKEN, "train-draft --checkpoint {X} --data {D} --epochs 1 --no-progress"),
    "convert": (OFT, "convert {X}"),
}
NO_CHECKPOINT = {"sim-speed", "cost"}  # commands that load none (cost: random weights)
# bad checkpoint -> (the families of the commands it is given to, what the error line must say)
CASES: dict[str, tuple[tuple[str, ...], str]] = {
    "missing": ((ANY, OWN, HF, TOKEN, OFT), "does not exist"),
    "hf_missing": ((ANY, OWN, HF, TOKEN, OFT), "does not exist"),
    "truncated_own": ((ANY, OWN), "model.safetensors: truncated"),
    "truncated_hf": ((ANY, HF, TOKEN), "model.safetensors: truncated"),
    "truncated_openvla": ((ANY, TOKEN), "model-00001-of-00002.safetensors: truncated"),
    "no_statistics": ((ANY, HF, TOKEN), "dataset_statistics.json"),
    "no_statistics_openvla": ((ANY, TOKEN), "dataset_statistics.json"),
    "unsupported_family": ((ANY, OWN, HF, TOKEN, OFT), "config.json"),
    "hf_without_prefix": ((OWN,), "hf family"),
    "openvla_to_own": ((OWN, OFT), "openvla family"),
    "placeholder": ((ANY, OWN, HF, TOKEN, OFT), "set checkpoint to your model's directory"),
    "config_of_other_sizes": ((ANY,), "text_config.intermediate_size implies (128, *)"),
}

PAIRS = [(command, case) for command, (family, _) in ARGV.items() if command in COMMANDS
         for case, (families, _) in CASES.items() if family in families]


def episodes(rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for _ in range(2):
        yield (rng.integers(0, 256, (6, 64, 64, 3), dtype=np.uint8),
               rng.uniform(-0.01, 0.01, (6, 7)).astype(np.float32))


def _truncate(directory: Path) -> Path:
    weights = directory / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return directory


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Callable[..., Path],
        tiny_hf_vla: Callable[..., Path], demo_set: Callable[..., tuple[Path, Path]]) -> dict[str, str]:
    """The bad checkpoints by case, and the demos, bag and image the commands read."""
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.rosbag.io import TOPICS, BagWriter, make_image, make_joint_state, make_string

    root = tmp_path_factory.mktemp("bad_checkpoints")
    no_statistics = tiny_hf_vla(root / "no_statistics")
    (no_statistics / "dataset_statistics.json").unlink()
    openvla = openvla_layout.write_openvla_dir(root / "openvla")
    truncated_openvla = shutil.copytree(openvla, root / "truncated_openvla")
    shard = truncated_openvla / "model-00001-of-00002.safetensors"
    os.truncate(shard, shard.stat().st_size // 2)
    no_statistics_openvla = shutil.copytree(openvla, root / "no_statistics_openvla")
    (no_statistics_openvla / "dataset_statistics.json").unlink()  # and none in config.json (norm_stats)
    config = json.loads((no_statistics_openvla / "config.json").read_text())
    del config["norm_stats"]
    (no_statistics_openvla / "config.json").write_text(json.dumps(config))
    other_sizes = tiny_hf_vla(root / "other_sizes")  # config.json names a wider MLP than its weights hold
    config = json.loads((other_sizes / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 128
    (other_sizes / "config.json").write_text(json.dumps(config))
    unsupported = root / "unsupported"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    demos, _ = demo_set("bad_checkpoints", episodes)
    bag = root / "bag"
    names = ArmKinematics(default_urdf()).joint_names
    with BagWriter(bag) as writer:
        for k in range(3):
            t = 10**12 + k * 5 * 10**7
            writer.write(TOPICS["joint_states"][0], t, make_joint_state(names, np.zeros(7), t))
            writer.write(TOPICS["camera"][0], t, make_image(np.zeros((64, 64, 3), np.uint8), t))
        writer.write(TOPICS["instruction"][0], 10**12, make_string("pick up the red cube"))
    image = root / "frame.png"
    from PIL import Image

    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(image)
    return {
        "missing": str(root / "nowhere"),
        "hf_missing": f"hf:{root / 'nowhere'}",
        "truncated_own": str(_truncate(tiny_checkpoint(root / "truncated_own"))),
        "truncated_hf": f"hf:{_truncate(tiny_hf_vla(root / 'truncated_hf'))}",
        "no_statistics": str(no_statistics),
        "unsupported_family": str(unsupported),
        "hf_without_prefix": str(tiny_hf_vla(root / "hf")),
        "truncated_openvla": str(truncated_openvla), "no_statistics_openvla": str(no_statistics_openvla),
        "openvla_to_own": str(openvla),
        "placeholder": "hf:/path/to/your_fr3_vla",
        "config_of_other_sizes": f"hf:{other_sizes}",
        "demos": str(demos), "bag": str(bag), "image": str(image), "out": str(root / "out"),
    }


def test_every_command_that_loads_a_checkpoint_is_covered() -> None:
    untested = set(COMMANDS) - set(ARGV) - NO_CHECKPOINT
    assert not untested, f"add the arguments of {sorted(untested)} to ARGV (or to NO_CHECKPOINT)"


@pytest.mark.parametrize(("command", "case"), PAIRS)
def test_a_bad_checkpoint_is_one_error_line_and_exit_status_2(bad: dict[str, str], command: str, case: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = Path(bad["out"]) / f"{command}.{case}"
    argv = ARGV[command][1].format(X=bad[case], O=out, D=bad["demos"], B=bad["bag"], I=bad["image"]).split()
    rc = main(argv)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    errors = [line for line in text.splitlines() if "error:" in line]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in text, text
    assert errors[0].startswith(f"{command}: error: ") and CASES[case][1] in errors[0], errors[0]


def test_a_bad_checkpoint_ends_the_process_in_one_line(bad: dict[str, str]) -> None:
    """The same through the console entry point: what a user sees, with nothing else on stderr."""
    done = subprocess.run([sys.executable, "-m", "vla_accel_ros.cli", "eval", "--checkpoint", bad["truncated_hf"],
                           "--episodes", "1", "--out", str(Path(bad["out"]) / "process")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("eval: error: ") and "model.safetensors: truncated" in lines[0]
