"""``--device cuda`` on a host whose torch sees no CUDA device: every command that runs a policy
(predict, eval, bench, sim, serve-openpi) refuses it in one line with exit status 2, before it loads
a model or starts a process, for the token VLAs (OpenVLA as published, OpenVLA-OFT) whose families
run on a GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURES = Path(__file__).parents[1] / "fixtures"
_spec = importlib.util.spec_from_file_location("oft_layout", FIXTURES / "oft" / "layout.py")
oft_layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oft_layout)  # it loads openvla/layout.py beside it
openvla_layout = oft_layout.openvla

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a CUDA device")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("device_flag")
    image = root / "frame.npy"
    np.save(image, np.zeros((112, 112, 3), dtype=np.uint8))
    return {"openvla": openvla_layout.write_openvla_dir(root / "openvla"),
            "oft": oft_layout.write_oft_dir(root / "oft"), "image": image, "out": root / "out"}


def command_line(command: str, paths: dict[str, Path], family: str) -> list[str]:
    checkpoint = ["--checkpoint", str(paths[family])]
    specific = {"predict": ["--image", str(paths["image"]), "--instruction", "pick up the cube"],
                "eval": ["--out", str(paths["out"] / "eval"), "--episodes", "1"],
                "bench": ["--out", str(paths["out"] / "bench"), "--episodes", "1"],
                "sim": ["--out", str(paths["out"] / "sim"), "--episodes", "1"],
                "serve-openpi": ["--port", "0"]}[command]
    return [sys.executable, "-m", "vla_accel_ros.cli", command, *checkpoint, *specific, "--device", "cuda"]


@pytest.mark.parametrize("command, family", [("predict", "openvla"), ("predict", "oft"), ("eval", "openvla"),
                                             ("bench", "openvla"), ("sim", "openvla"), ("serve-openpi", "openvla")])
def test_every_command_refuses_cuda_without_a_gpu_in_one_line(checkpoints: dict[str, Path], command: str,
                                                              family: str) -> None:
    proc = subprocess.run(command_line(command, checkpoints, family), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr  # one line, no traceback
    assert proc.stderr.startswith(f"{command}: error: device 'cuda': this torch sees no CUDA device"), proc.stderr
    assert proc.stdout == ""
    assert not (checkpoints["out"] / command).exists()  # nothing ran: no output directory
