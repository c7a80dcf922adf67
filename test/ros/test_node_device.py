"""Parameter ``device`` of the control node and the inference node for the token VLAs (OpenVLA as
published, a Hugging Face Llava-style VLA): without a CUDA device this torch sees, ``device: cuda``
is refused at configure in one line, before a model loads; with one (the tests marked for CUDA,
skipped elsewhere), the node takes it and every tick publishes with the policy on the GPU."""

from __future__ import annotations

from typing import Any

import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("transformers")
import torch  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from vla_accel_ros.core.settings import ConfigError  # noqa: E402
from vla_accel_ros.ros.inference_node import VlaInferenceNode  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402

_domains = iter(range(200, 208))
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a CUDA device")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_hf_vla: Any, fixture_layout: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("device")
    return {"openvla": str(fixture_layout("openvla").write_openvla_dir(root / "openvla")),
            "hf": f"hf:{tiny_hf_vla(root / 'hf')}"}


def node_parameters(checkpoint: str, **extra: Any) -> list[Parameter]:
    values = {"inference": True, "checkpoint": checkpoint, "decoder": "kerv", "autostart": True,
              "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0, "stats_rate_hz": 10.0,
              "realtime_priority": 0, "inference_restarts": 0, **extra}
    return [Parameter(k, value=v) for k, v in values.items()]


@no_cuda
@pytest.mark.parametrize("family, mode", [("openvla", "process"), ("hf", "thread")])
def test_without_a_gpu_the_node_refuses_cuda_at_configure_in_one_line(ros_context: Any, checkpoints: dict[str, str],
                                                                      family: str, mode: str) -> None:
    with ros_context(next(_domains)) as context, pytest.raises(ConfigError) as error:
        VlaAccelNode(context=context, parameter_overrides=node_parameters(checkpoints[family], device="cuda",
                                                                          inference_mode=mode))
    message = str(error.value)
    assert "device 'cuda': this torch sees no CUDA device" in message and "\n" not in message


@no_cuda
def test_without_a_gpu_the_inference_node_refuses_cuda_before_loading(ros_context: Any,
                                                                      checkpoints: dict[str, str]) -> None:
    params = {"robots": ["far"], "checkpoint": checkpoints["openvla"], "decoder": "kerv", "device": "cuda:0"}
    with ros_context(next(_domains)) as context, pytest.raises(ValueError) as error:
        VlaInferenceNode(context=context, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    message = str(error.value)
    assert message.startswith("device 'cuda:0': this torch sees no CUDA device") and "\n" not in message


@cuda
@pytest.mark.parametrize("family, mode, device", [("openvla", "thread", "cuda"), ("openvla", "process", "cuda:0"),
                                                  ("hf", "thread", "cuda")])
def test_cuda_the_node_runs_a_token_vla_on_the_gpu_and_every_tick_publishes(
        dds_rig: Any, policy_node_over_dds: Any, checkpoints: dict[str, str], family: str, mode: str,
        device: str) -> None:
    rig = dds_rig(next(_domains), "robot")
    params = {"inference": True, "inference_mode": mode, "checkpoint": checkpoints[family], "decoder": "kerv",
              "device": device, "autostart": True, "instruction": "pick up the red cube",
              "robot_description_timeout_s": 0.0, "stats_rate_hz": 10.0, "realtime_priority": 0,
              "inference_restarts": 0}
    try:
        node, after, _ = policy_node_over_dds(rig, params, frame=(48, 64), timeout=120.0)
        assert after["inference_errors"] == 0 and after["inference_actions"] > 0
        if mode == "thread":  # the policy lives in this process: it runs on the GPU
            assert node.worker.runner.policy.device.type == "cuda"
    finally:
        rig.close()


@cuda
def test_cuda_a_gpu_index_past_those_this_torch_sees_is_refused_at_configure(ros_context: Any,
                                                                            checkpoints: dict[str, str]) -> None:
    device = f"cuda:{torch.cuda.device_count()}"
    with ros_context(next(_domains)) as context, pytest.raises(ConfigError) as error:
        VlaAccelNode(context=context, parameter_overrides=node_parameters(checkpoints["openvla"], device=device,
                                                                          inference_mode="thread"))
    assert f"device '{device}': this torch sees {torch.cuda.device_count()} CUDA device" in str(error.value)


@no_cuda
def test_without_a_gpu_an_inference_python_of_its_own_refuses_cuda_at_configure(ros_context: Any,
                                                                                 checkpoints: dict[str, str]) -> None:
    """The interpreter of the inference process asks its own torch, as that process starts: the node
    still refuses at configure, with the child's line."""
    import sys

    with ros_context(next(_domains)) as context, pytest.raises(ConfigError) as error:
        VlaAccelNode(context=context, parameter_overrides=node_parameters(
            checkpoints["openvla"], device="cuda", inference_mode="process", inference_python=sys.executable))
    message = str(error.value)
    assert "device 'cuda': this torch sees no CUDA device" in message and "\n" not in message
