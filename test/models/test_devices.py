"""The one device check (vla_accel_ros/models/devices.py) that every command and both nodes make
through the registry before anything loads: a device name, and a CUDA device this torch sees.
The number of CUDA devices is set through torch.cuda.device_count, so these run on any host."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.settings import from_params
from vla_accel_ros.models.devices import is_device_name, require_device_available
from vla_accel_ros.models.load import check_device, resolve_checkpoint
from vla_accel_ros.ros.parameters import NodeConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"


def visible_cuda_devices(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("name, valid", [("cpu", True), ("cuda", True), ("cuda:0", True), ("cuda:12", True),
                                         ("gpu", False), ("cuda:", False), ("cuda:x", False), ("CUDA", False),
                                         ("", False)])
def test_device_names(name: str, valid: bool) -> None:
    assert is_device_name(name) == valid


@pytest.mark.parametrize("device", ["", "cpu"])
def test_the_cpu_is_always_available(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    visible_cuda_devices(monkeypatch, 0)
    require_device_available(device)


def test_a_device_that_is_no_device_name_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^device must be cpu, cuda or cuda:N, got 'gpu'$"):
        require_device_available("gpu")


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_a_cuda_device_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    visible_cuda_devices(monkeypatch, 0)
    with pytest.raises(ValueError) as error:
        require_device_available(device)
    message = str(error.value)
    assert message.startswith(f"device '{device}': this torch sees no CUDA device (torch {torch.__version__}")
    assert "\n" not in message


def test_a_cuda_index_past_the_visible_devices_is_refused_naming_those_there(monkeypatch: pytest.MonkeyPatch) -> None:
    visible_cuda_devices(monkeypatch, 2)
    require_device_available("cuda")
    require_device_available("cuda:1")
    with pytest.raises(ValueError, match=r"^device 'cuda:2': this torch sees 2 CUDA devices \(cuda:0, cuda:1\)$"):
        require_device_available("cuda:2")


def test_an_interpreter_without_torch_leaves_the_check_to_the_process_that_loads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    require_device_available("cuda:3")


def test_the_module_imports_without_torch_and_asks_torch_only_about_cuda() -> None:
    code = ("import sys; from vla_accel_ros.models.devices import require_device_available as check; "
            "check(''); check('cpu'); assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_registry_names_the_family_before_asking_for_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint whose family runs on the CPU only is refused for that, on any host: the GPU
    would not help it."""
    visible_cuda_devices(monkeypatch, 1)
    with pytest.raises(ValueError, match="device 'cuda': a checkpoint of the own family runs on cpu only"):
        resolve_checkpoint(default_checkpoint(), device="cuda")


def test_the_registry_refuses_a_gpu_this_torch_does_not_see_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LeRobot directory (a family that runs on cuda): the device is refused by the registry's
    check, the same for resolve_checkpoint, check_device and a resolved checkpoint handed on."""
    directory = FIXTURES / "lerobot" / "smolvla"
    resolved = resolve_checkpoint(directory)
    visible_cuda_devices(monkeypatch, 0)
    for check in (lambda: resolve_checkpoint(directory, device="cuda"), lambda: check_device(directory, "cuda:0"),
                  lambda: resolve_checkpoint(resolved, device="cuda")):
        with pytest.raises(ValueError, match="this torch sees no CUDA device"):
            check()
    visible_cuda_devices(monkeypatch, 1)
    assert resolve_checkpoint(directory, device="cuda").family == "lerobot"
    with pytest.raises(ValueError, match=r"device 'cuda:1': this torch sees 1 CUDA device \(cuda:0\)"):
        check_device(directory, "cuda:1")



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_the_node_parameter_device_cuda_passes_the_configure_check_for_the_token_vlas(
        tmp_path: Path, tiny_hf_vla: Any) -> None:
    """What the control node's configure (and the inference node's start) resolves, without ROS:
    parameter ``device`` cuda, then cuda:N, for OpenVLA, OpenVLA-OFT and a Llava-style VLA; an index
    past the devices this torch sees is refused."""
    from vla_accel_ros.models.oft.weights import convert_directory

    oft_layout = fixture_layout("oft")
    oft = oft_layout.write_oft_dir(tmp_path / "oft")
    convert_directory(oft, report=lambda line: None)  # OFT's .pt components as safetensors, as it loads them
    directories = {"openvla": str(oft_layout.openvla.write_openvla_dir(tmp_path / "openvla")), "oft": str(oft),
                   "hf": f"hf:{tiny_hf_vla(tmp_path / 'hf')}"}
    last = torch.cuda.device_count() - 1
    for family, checkpoint in directories.items():
        for device in ("cuda", f"cuda:{last}"):
            runner = from_params(NodeConfig, {"checkpoint": checkpoint, "device": device}).runner_config()
            assert resolve_checkpoint(runner.checkpoint_ref, device=runner.device).family == family
        with pytest.raises(ValueError, match=f"device 'cuda:{last + 1}': this torch sees {last + 1} CUDA device"):
            resolve_checkpoint(checkpoint, device=f"cuda:{last + 1}")


def fixture_layout(family: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"{family}_layout", FIXTURES / family / "layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
