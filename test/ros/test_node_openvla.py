"""The node over DDS with a small OpenVLA model in the published layout (test/fixtures/openvla):
the checkpoint directory and its unnorm_key as the parameters name them, every tick publishes, the
policy drives, in the inference thread and in the child process, with and without the incremental
prefill."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("transformers")
from rclpy.parameter import Parameter  # noqa: E402

from vla_accel_ros.core.kinematics import ArmKinematics  # noqa: E402
from vla_accel_ros.core.resources import default_urdf  # noqa: E402
from vla_accel_ros.ros.node import VlaAccelNode  # noqa: E402

KIN = ArmKinematics(default_urdf())
Q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
_domains = iter(range(90, 100))


@pytest.fixture(scope="module")
def openvla_dir(tmp_path_factory: pytest.TempPathFactory, fixture_layout) -> Path:
    layout = fixture_layout("openvla")
    two = {**layout.STATISTICS, "libero_spatial": layout.STATISTICS[layout.DATASET]}  # unnorm_key picks one
    directory = layout.write_openvla_dir(tmp_path_factory.mktemp("openvla") / "openvla-7b-finetuned-tiny",
                                         statistics=two)
    (directory / "vla_spec.json").write_text(json.dumps({"dtype": "float32"}))
    return directory


@pytest.mark.parametrize("mode, decoder, reuse_kv", [("thread", "kerv", False), ("process", "ar", False),
                                                     ("thread", "world_aware", True)])
def test_the_node_runs_an_openvla_directory_and_every_tick_publishes(dds_rig, policy_node_over_dds, openvla_dir, mode,
                                                                     decoder, reuse_kv):
    rig = dds_rig(next(_domains), "robot")
    params = {"inference": True, "inference_mode": mode, "checkpoint": str(openvla_dir), "unnorm_key": "libero_spatial",
              "decoder": decoder, "autostart": True, "instruction": "pick up the red cube",
              "robot_description_timeout_s": 0.0, "stats_rate_hz": 10.0, "realtime_priority": 0,
              "inference_restarts": 0, "vision_reuse": reuse_kv, "vision_reuse_kv": reuse_kv}
    try:
        # with reuse, a still scene: the same frame again and again
        node, after, _ = policy_node_over_dds(rig, params, frame=(48, 64), still=reuse_kv, timeout=90.0)
        assert node.image_size == 112  # the processor's size, from preprocessor_config.json
        assert (after["inference_vision_recomputed_mean"] < 1.0) == reuse_kv, after
    finally:
        rig.close()


def test_a_bad_openvla_directory_is_refused_in_one_line_naming_the_file(ros_context, openvla_dir, tmp_path):
    import shutil

    from vla_accel_ros.core.settings import ConfigError

    broken = tmp_path / "broken"
    shutil.copytree(openvla_dir, broken)
    (broken / "model-00002-of-00002.safetensors").unlink()
    params = {"inference": True, "inference_mode": "thread", "checkpoint": str(broken), "unnorm_key": "libero_spatial",
              "decoder": "kerv", "autostart": True, "robot_description_timeout_s": 0.0}
    with ros_context(next(_domains)) as context, pytest.raises(ConfigError) as error:
        VlaAccelNode(context=context, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    message = str(error.value)
    assert "model-00002-of-00002.safetensors: missing" in message and "\n" not in message
