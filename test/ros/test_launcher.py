"""`vla-accel sim`'s options: what reaches the node as its parameters, and what is refused up front."""

from __future__ import annotations

import pytest

from vla_accel_ros.core.settings import ConfigError, changed_params, from_params
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.ros.launcher import SimRunOptions
from vla_accel_ros.ros.parameters import InferenceNodeConfig, NodeConfig, PolicySettings


def test_vision_settings_reach_the_node_under_its_parameter_names():
    vision = VisionReuseConfig(4.0, 10, reuse_kv=True, feature_threshold=0.05, reuse_tower=True, tower_refresh_steps=5)
    params = changed_params(SimRunOptions(inference_mode="thread", vision=vision).node_config())
    assert params["vision_reuse"] is True and params["vision_reuse_tower"] is True
    assert from_params(NodeConfig, params).vision == vision  # the node reads back exactly these settings


def test_the_policy_reaches_both_nodes_as_their_parameters(tmp_path):
    policy = PolicySettings(checkpoint="ckpt", decoder="world_aware", kf_fill_check=True, kinematic_r_min=2,
                            kinematic_r_max=6)
    opts = SimRunOptions(policy=policy, out=str(tmp_path), inference_mode="remote")
    node = from_params(NodeConfig, changed_params(opts.node_config()))
    assert node.policy.checkpoint.startswith("/") and node.policy.checkpoint.endswith("/ckpt")  # absolute
    assert node.policy.decoder == "world_aware" and node.policy.kinematic_r_bounds == (2, 6)
    assert node.stats_file == str((tmp_path / "node_stats.json").resolve()) and node.inference_mode == "remote"
    remote = from_params(InferenceNodeConfig, changed_params(opts.inference_config()))
    assert remote.policy == node.policy and remote.control_period_s == pytest.approx(0.05)
    assert opts.to_json()["kinematic_r_bounds"] == (2, 6) and "policy" not in opts.to_json()


def test_vision_is_refused_with_the_remote_inference_node():
    with pytest.raises(ValueError, match="--vision needs --inference-mode thread or process"):
        SimRunOptions(inference_mode="remote", vision=VisionReuseConfig())
    assert SimRunOptions(inference_mode="process", vision=VisionReuseConfig()).vision is not None


def test_what_the_node_would_refuse_is_refused_up_front():
    with pytest.raises(ConfigError, match="camera_timeout_s"):
        SimRunOptions(control_rate_hz=1.5)  # the watchdog is shorter than a period
