"""Settings: defaults, ROS/YAML mapping, validation messages and the shipped parameter files."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass

import pytest

from vla_accel_ros.core.controller import ControllerConfig
from vla_accel_ros.core.params_file import read_node_parameters
from vla_accel_ros.core.resources import share_dir
from vla_accel_ros.core.settings import (
    ConfigError,
    check_fields,
    dump_yaml_params,
    from_params,
    nested,
    parameter_specs,
    setting,
    to_params,
)
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.ros.parameters import InferenceNodeConfig, NodeConfig, PolicySettings, SimBridgeConfig

POLICY_PARAMETERS = ["checkpoint", "unnorm_key", "decoder", "temperature", "kf_fill_check", "kinematic_r_min",
                     "kinematic_r_max", "rtc_horizon", "rtc_guidance", "device", "draft_head"]
VISION_PARAMETERS = ["vision_reuse", "vision_threshold", "vision_refresh_steps", "vision_max_drift", "vision_reuse_kv",
                     "vision_feature_threshold", "vision_reuse_tower", "vision_tower_threshold",
                     "vision_tower_refresh_steps"]


CHUNK_PARAMETERS = ["chunk_execution", "chunk_refill_threshold", "chunk_blend", "chunk_verify_threshold_rad",
                    "chunk_anchor"]


@pytest.mark.parametrize("cls", [NodeConfig, InferenceNodeConfig, SimBridgeConfig, ControllerConfig])
def test_every_field_is_documented_and_numeric_ones_have_ranges(cls):
    specs = parameter_specs(cls)
    groups = {"vision": VISION_PARAMETERS, "policy": POLICY_PARAMETERS, "chunks": CHUNK_PARAMETERS}
    flat = [name for f in dataclasses.fields(cls) for name in groups.get(f.name, [f.name])]
    assert [s.name for s in specs] == flat
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
    assert from_params(NodeConfig, read_node_parameters(path, "vla_accel_node")) == cfg
    with pytest.raises(ValueError, match="other_node"):
        read_node_parameters(path, "other_node")


def test_wildcard_section_applies_to_every_node(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("/**:\n  ros__parameters:\n    control_rate_hz: 40.0\n")
    assert from_params(NodeConfig, read_node_parameters(path, "vla_accel_node")).control_rate_hz == 40.0


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


def test_fallback_max_s_is_declared_with_a_range_validated_and_passed_to_the_controller():
    spec = {s.name: s for s in parameter_specs(NodeConfig)}["fallback_max_s"]
    assert spec.kind is float and spec.default == 0.25 and spec.range == (0.0, 10.0)
    assert "fallback" in spec.description and "hold" in spec.description
    ctrl = NodeConfig(fallback_max_s=0.4).controller_config()
    assert ctrl.fallback_max_s == 0.4 and ctrl.expect_actions
    assert NodeConfig(inference=False).controller_config().expect_actions is False
    assert NodeConfig(fallback_max_s=0).controller_config().fallback_max_s == 0.0  # hold at once
    for value, words in [(-0.1, ["fallback_max_s", "out of range"]), (11.0, ["fallback_max_s", "out of range"]),
                         (float("nan"), ["fallback_max_s", "finite"]), ("long", ["fallback_max_s"])]:
        with pytest.raises(ConfigError) as err:
            from_params(NodeConfig, {"fallback_max_s": value})
        for word in words:
            assert word in str(err.value)


@pytest.mark.parametrize("file", ["vla_accel.yaml", "sim.yaml"])
def test_shipped_parameter_files_set_and_document_fallback_max_s(file):
    path = share_dir() / "config" / file
    assert read_node_parameters(path, "vla_accel_node")["fallback_max_s"] == 0.25
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("fallback_max_s:"))
    assert lines[at - 1].strip().startswith("#") and "[0 .. 10]" in lines[at - 1]  # documented with its range
    assert any("action_timeout_s:" in line for line in lines[at - 6:at])  # next to the other timeouts


@pytest.mark.parametrize("file, node, cls", [
    ("vla_accel.yaml", "vla_accel_node", NodeConfig),
    ("sim.yaml", "vla_accel_node", NodeConfig),
    ("sim.yaml", "sim_node", SimBridgeConfig),
])
def test_shipped_parameter_files_are_valid(file, node, cls):
    params = read_node_parameters(share_dir() / "config" / file, node)
    assert params, f"{file} has no section for {node}"
    from_params(cls, params)


def test_kf_fill_check_is_a_parameter_for_the_kalman_fill_decoders_only():
    for cls in (NodeConfig, InferenceNodeConfig):
        specs = {s.name: s for s in parameter_specs(cls)}
        assert (specs["kf_fill_check"].kind, specs["kf_fill_check"].default) == (bool, False)
        assert from_params(cls, {"decoder": "world_aware", "kf_fill_check": True}).runner_config().kf_fill_check
        with pytest.raises(ConfigError, match="kf_fill_check.*kerv, world_aware.*'sd'"):
            from_params(cls, {"decoder": "sd", "kf_fill_check": True})


def test_real_time_chunking_is_a_parameter_for_the_flow_decoders_only():
    for cls in (NodeConfig, InferenceNodeConfig):
        config = from_params(cls, {"decoder": "flow2", "rtc_horizon": 4, "rtc_guidance": 2.5}).runner_config()
        assert (config.rtc_horizon, config.rtc_guidance) == (4, 2.5)
        with pytest.raises(ConfigError, match="rtc_horizon.*flow10, flow2.*'kerv'"):
            from_params(cls, {"decoder": "kerv", "rtc_horizon": 4})
        with pytest.raises(ConfigError, match="rtc_guidance"):
            from_params(cls, {"decoder": "flow2", "rtc_guidance": -1.0})


def test_kinematic_r_bounds_are_parameters_for_the_kinematic_threshold_decoders_only():
    for cls in (NodeConfig, InferenceNodeConfig):
        specs = {s.name: s for s in parameter_specs(cls)}
        assert ([(specs[n].kind, specs[n].default) for n in ("kinematic_r_min", "kinematic_r_max")]
                == [(int, -1), (int, -1)])  # the model's
        assert from_params(cls, {"decoder": "sd"}).runner_config().kinematic_r_bounds is None  # the defaults
        # one bound alone: the other is the decoder's own
        one = from_params(cls, {"decoder": "kerv", "kinematic_r_max": 20})
        assert one.runner_config().kinematic_r_bounds == (5, 20)
        bounded = from_params(cls, {"decoder": "world_aware", "kinematic_r_min": 2, "kinematic_r_max": 6})
        assert bounded.runner_config().kinematic_r_bounds == (2, 6)
        with pytest.raises(ConfigError, match="kinematic_r_min.*kerv, world_aware.*'sd'"):
            from_params(cls, {"decoder": "sd", "kinematic_r_max": 9})
        with pytest.raises(ConfigError, match="'kinematic_r_min' = 7 exceeds 'kinematic_r_max' = 6"):
            from_params(cls, {"decoder": "kerv", "kinematic_r_min": 7, "kinematic_r_max": 6})


def test_policy_settings_are_one_group_of_flat_parameters_in_both_nodes():
    node, inference = ({s.name: s for s in parameter_specs(cls)} for cls in (NodeConfig, InferenceNodeConfig))
    assert [s.name for s in parameter_specs(PolicySettings)] == POLICY_PARAMETERS
    assert all(node[name] == inference[name] for name in POLICY_PARAMETERS)  # one definition
    cfg = from_params(NodeConfig, {"decoder": "world_aware", "kf_fill_check": True, "kinematic_r_min": 2})
    assert cfg.policy == PolicySettings(decoder="world_aware", kf_fill_check=True, kinematic_r_min=2)
    assert "policy" not in to_params(cfg) and to_params(cfg)["kinematic_r_min"] == 2
    with pytest.raises(ConfigError, match="kf_fill_check"):
        NodeConfig(policy=PolicySettings(decoder="sd", kf_fill_check=True))


def test_policy_settings_for_another_decoder_keep_only_what_it_takes():
    policy = PolicySettings(decoder="world_aware", kf_fill_check=True, kinematic_r_min=2, kinematic_r_max=6)
    assert policy.kinematic_r_bounds == (2, 6) and PolicySettings().kinematic_r_bounds is None
    assert policy.for_decoder("kerv") == PolicySettings(decoder="kerv", kf_fill_check=True, kinematic_r_min=2,
                                                        kinematic_r_max=6)
    plain = policy.for_decoder("ar")
    assert (plain.decoder, plain.kf_fill_check, plain.kinematic_r_bounds) == ("ar", False, None)


def test_bad_yaml_file_is_reported(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ValueError, match="bad.yaml"):
        read_node_parameters(path, "vla_accel_node")


def test_inference_mode_restarts_and_realtime_priority_are_validated():
    cfg = NodeConfig()
    assert cfg.inference_mode == "process" and cfg.inference_restarts >= 0 and 0 <= cfg.realtime_priority <= 98
    assert NodeConfig(inference_mode="thread", realtime_priority=0).inference_mode == "thread"
    for params, words in [({"inference_mode": "fork"}, ["inference_mode", "thread", "process"]),
                          ({"inference_python": "/usr/bin/python3", "inference_mode": "thread"},
                           ["inference_python", "process"]),
                          ({"inference_restarts": -1}, ["inference_restarts", "out of range"]),
                          ({"realtime_priority": 99}, ["realtime_priority", "out of range"])]:
        with pytest.raises(ConfigError) as err:
            from_params(NodeConfig, params)
        for word in words:
            assert word in str(err.value)


# --- the nested incremental-vision settings ----------------------------------------------------------
def test_vision_parameters_are_flat_on_ros_and_nested_in_the_config():
    specs = {s.name: s for s in parameter_specs(NodeConfig)}
    assert {name: (specs[name].kind, specs[name].default) for name in VISION_PARAMETERS} == {
        "vision_reuse": (bool, False), "vision_threshold": (float, 8.0), "vision_refresh_steps": (int, 20),
        "vision_max_drift": (float, 2.0), "vision_reuse_kv": (bool, False), "vision_feature_threshold": (float, 0.15),
        "vision_reuse_tower": (bool, False), "vision_tower_threshold": (float, 2.0),
        "vision_tower_refresh_steps": (int, 3)}
    assert specs["vision_threshold"].range == (0.0, 255.0) and specs["vision_refresh_steps"].range == (1, 100000)
    cfg = from_params(NodeConfig, {"vision_reuse": True, "vision_threshold": 4, "vision_reuse_kv": True})
    assert cfg.vision == VisionReuseConfig(threshold=4.0, refresh_steps=20, max_drift=2.0, reuse_kv=True, enabled=True)
    assert isinstance(cfg.vision.threshold, float)
    params = to_params(cfg)
    assert {k: params[k] for k in VISION_PARAMETERS} == {"vision_reuse": True, "vision_threshold": 4.0,
                                                         "vision_refresh_steps": 20, "vision_max_drift": 2.0,
                                                         "vision_reuse_kv": True, "vision_feature_threshold": 0.15,
                                                         "vision_reuse_tower": False, "vision_tower_threshold": 2.0,
                                                         "vision_tower_refresh_steps": 3}
    assert "vision" not in params and from_params(NodeConfig, params) == cfg
    assert NodeConfig().vision.enabled is False  # the node encodes every patch unless told otherwise


@pytest.mark.parametrize(
    "params, words",
    [
        ({"vision_threshold": -1.0}, ["vision_threshold", "out of range"]),
        ({"vision_max_drift": 300.0}, ["vision_max_drift", "out of range"]),
        ({"vision_refresh_steps": 0}, ["vision_refresh_steps", "out of range"]),
        ({"vision_refresh_steps": 2.5}, ["vision_refresh_steps", "integer"]),
        ({"vision_reuse": "yes"}, ["vision_reuse", "true or false"]),
        ({"vision_enabled": True}, ["unknown parameter", "vision_enabled"]),
    ],
)
def test_invalid_vision_settings_name_the_flat_parameter(params, words):
    with pytest.raises(ConfigError) as err:
        from_params(NodeConfig, params)
    for word in words:
        assert word in str(err.value)


def test_a_nested_config_given_directly_is_checked_under_the_flat_names():
    with pytest.raises(ConfigError, match="vision_max_drift"):
        NodeConfig(vision=VisionReuseConfig(max_drift=1e9))  # fine for the encoder, outside the node's range
    with pytest.raises(ConfigError, match="vision"):
        NodeConfig(vision=None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Inner:
    on: bool = setting(True, "Switch of the inner group")
    gain: float = setting(1.0, "Gain of the inner group", range=(0.0, 10.0))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class _Outer:
    rate: float = setting(10.0, "Rate of the outer config", range=(1.0, 100.0))
    inner: _Inner = nested(_Inner(on=False), prefix="inner_", names={"on": "use_inner"})

    def __post_init__(self) -> None:
        check_fields(self)


def test_nested_settings_map_prefix_and_names_both_ways(tmp_path):
    assert [(s.name, s.default) for s in parameter_specs(_Outer)] == [("rate", 10.0), ("use_inner", False),
                                                                      ("inner_gain", 1.0)]
    cfg = from_params(_Outer, {"use_inner": True, "inner_gain": 3})
    assert cfg == _Outer(inner=_Inner(on=True, gain=3.0)) and to_params(cfg) == {"rate": 10.0, "use_inner": True,
                                                                                 "inner_gain": 3.0}
    path = tmp_path / "outer.yaml"
    path.write_text(dump_yaml_params(cfg, "outer"))
    assert from_params(_Outer, read_node_parameters(path, "outer")) == cfg
    assert from_params(_Outer, {"rate": 20.0}).inner == _Inner(on=False)  # the nested default, not the class's
    with pytest.raises(ConfigError, match="'inner_gain'"):
        from_params(_Outer, {"inner_gain": 11.0})
    with pytest.raises(TypeError, match="missing"):
        nested(_Inner(), names={"missing": "x"})


def test_importing_the_parameters_does_not_import_torch():
    """The node's parameters (and so ``ros2 param describe`` and a process-mode node) load without torch."""
    code = "import sys, vla_accel_ros.ros.parameters; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_r_bounds_on_the_command_line():
    import argparse

    from vla_accel_ros.core.settings import parse_r_bounds

    assert parse_r_bounds("2:6") == (2, 6) and parse_r_bounds("0:0") == (0, 0)
    for bad in ("6:2", "3", "a:b", "-1:4", "2:6:9"):
        with pytest.raises(argparse.ArgumentTypeError, match="R_MIN:R_MAX"):
            parse_r_bounds(bad)


def test_chunk_and_camera_parameters_reach_the_controller_and_bad_ones_are_named():
    cfg = from_params(NodeConfig, {"chunk_execution": "sync", "chunk_blend": "weighted_average",
                                   "chunk_refill_threshold": 0.25, "image_topics": ["front/image", "wrist/image"],
                                   "image_transports": ["raw", "compressed"], "camera_sync_tolerance_s": 0.01})
    controller = cfg.controller_config()
    assert controller.chunks.chunk_execution == "sync" and controller.chunks.chunk_blend == "weighted_average"
    assert controller.chunks.chunk_refill_threshold == 0.25
    assert controller.camera_names == ("front/image", "wrist/image") and controller.camera_sync_tolerance_s == 0.01
    assert cfg.camera_compressed == (False, True)
    assert NodeConfig().camera_topics == ("camera/image_raw",)  # image_topic: the one-camera form
    for params, words in [({"chunk_execution": "later"}, "chunk_execution"),
                          ({"chunk_refill_threshold": 1.5}, "chunk_refill_threshold"),
                          ({"image_topics": ["a", "a"]}, "image_topics"),
                          ({"image_topics": ["a", "b"], "image_transports": ["raw"]}, "image_transports"),
                          ({"image_transports": ["h264"]}, "image_transports")]:
        with pytest.raises(ConfigError, match=words):
            from_params(NodeConfig, params)


def test_device_is_passed_to_the_runner_and_checked():
    config = from_params(PolicySettings, {"device": "cuda:1"}).runner_config()
    assert config.device == "cuda:1"
    assert from_params(PolicySettings, {}).runner_config().device == ""
    with pytest.raises(ConfigError, match="'device' must be empty, cpu, cuda or cuda:N, got 'gpu'"):
        from_params(PolicySettings, {"device": "gpu"})
