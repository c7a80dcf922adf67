"""`vla-accel sim`'s options: what reaches the node as its parameters, and what is refused up front."""

from __future__ import annotations

import pytest

from vla_accel_ros.core.settings import from_params
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.ros.launcher import SimRunOptions, vision_parameters
from vla_accel_ros.ros.parameters import NodeConfig


def test_vision_settings_reach_the_node_under_its_parameter_names():
    vision = VisionReuseConfig(4.0, 10, reuse_kv=True, feature_threshold=0.05, reuse_tower=True, tower_refresh_steps=5)
    params = vision_parameters(vision)
    assert params["vision_reuse"] is True and params["vision_reuse_tower"] is True
    assert all(name.startswith("vision_") for name in params)
    assert from_params(NodeConfig, params).vision == vision  # the node reads back exactly these settings


def test_vision_is_refused_with_the_remote_inference_node():
    with pytest.raises(ValueError, match="--vision needs --inference-mode thread or process"):
        SimRunOptions(inference_mode="remote", vision=VisionReuseConfig())
    assert SimRunOptions(inference_mode="process", vision=VisionReuseConfig()).vision is not None
