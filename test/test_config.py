"""Settings: defaults, ROS/YAML mapping, validation messages and the shipped parameter files."""

from __future__ import annotations

import dataclasses

import pytest

from vla_accel_ros.config import (
    ConfigError,
    ControllerConfig,
    NodeConfig,
    SimBridgeConfig,
    dump_yaml_params,
    from_params,
    load_yaml_params,
    parameter_specs,
    to_params,
)
from vla_accel_ros.resources import share_dir


@pytest.mark.parametrize("cls", [NodeConfig, SimBridgeConfig, ControllerConfig])
def test_every_field_is_documented_and_numeric_ones_have_ranges(cls):
    specs = parameter_specs(cls)
    assert [s.name for s in specs] == [f.name for f in dataclasses.fields(cls)]
    for spec in specs:
        assert len(spec.description) > 10, spec.name
        if spec.kind in (int, float):
            assert spec.range is not None, spec.name
            assert spec.range[0] <= spec.default <= spec.range[1], spec.name


def test_round_trip_through_params_and_yaml(tmp_path):
    cfg = NodeConfig(control_rate_hz=50.0, output="joint_trajectory", controller_joints=("joint2", "joint1"))
    assert from_params(NodeConfig, to_params(cfg)) == cfg
    path = tmp_path / "p.yaml"
    path.write_text(dump_yaml_params(cfg, "vla_accel_node"))
    assert from_params(NodeConfig, load_yaml_params(path, "vla_accel_node")) == cfg
    assert load_yaml_params(path, "other_node") == {}


def test_wildcard_section_applies_to_every_node(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("/**:\n  ros__parameters:\n    control_rate_hz: 40.0\n")
    assert from_params(NodeConfig, load_yaml_params(path, "vla_accel_node")).control_rate_hz == 40.0


@pytest.mark.parametrize(
    "params, words",
    [
        ({"control_rate_hz": 0.5}, ["control_rate_hz", "out of range"]),
        ({"control_rate_hz": float("nan")}, ["control_rate_hz", "finite"]),
        ({"output": "velocity"}, ["output", "forward_position"]),
        ({"autostart": "yes"}, ["autostart", "true or false"]),
        ({"image_size": 12.5}, ["image_size", "integer"]),
        ({"controller_joints": ["joint1", "joint1"]}, ["controller_joints", "duplicates"]),
        ({"control_rate_hz": 20.0, "camera_timeout_s": 0.04}, ["camera_timeout_s", "control period"]),
        ({"decoder": " "}, ["decoder"]),
        ({"bogus": 1}, ["unknown parameter", "bogus"]),
    ],
)
def test_invalid_settings_name_the_parameter(params, words):
    with pytest.raises(ConfigError) as err:
        from_params(NodeConfig, params)
    for word in words:
        assert word in str(err.value)


def test_integer_accepted_for_float_setting():
    assert NodeConfig(control_rate_hz=50).control_rate_hz == 50.0
    assert isinstance(NodeConfig(control_rate_hz=50).control_rate_hz, float)


def test_controller_config_follows_node_config():
    cfg = NodeConfig(control_rate_hz=50.0, action_dt_s=0.05, camera_timeout_s=0.3)
    ctrl = cfg.controller_config()
    assert ctrl.period_s == pytest.approx(0.02)
    assert ctrl.camera_timeout_s == 0.3


@pytest.mark.parametrize("file, node, cls", [
    ("vla_accel.yaml", "vla_accel_node", NodeConfig),
    ("sim.yaml", "vla_accel_node", NodeConfig),
    ("sim.yaml", "sim_node", SimBridgeConfig),
])
def test_shipped_parameter_files_are_valid(file, node, cls):
    params = load_yaml_params(share_dir() / "config" / file, node)
    assert params, f"{file} has no section for {node}"
    from_params(cls, params)


def test_bad_yaml_file_is_reported(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_yaml_params(path, "vla_accel_node")


def test_inference_mode_restarts_and_realtime_priority_are_validated():
    cfg = NodeConfig()
    assert cfg.inference_mode == "process" and cfg.inference_restarts >= 0 and 0 <= cfg.realtime_priority <= 98
    assert NodeConfig(inference_mode="thread", realtime_priority=0).inference_mode == "thread"
    for params, words in [({"inference_mode": "fork"}, ["inference_mode", "thread", "process"]),
                          ({"inference_restarts": -1}, ["inference_restarts", "out of range"]),
                          ({"realtime_priority": 99}, ["realtime_priority", "out of range"])]:
        with pytest.raises(ConfigError) as err:
            from_params(NodeConfig, params)
        for word in words:
            assert word in str(err.value)
