"""A decoder is defined once, by its spec: a spec registered here is a decoder the node's parameters,
the builder and the runner accept, with its capabilities and settings, and nothing else names it."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.core.settings import ConfigError, parameter_specs
from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.kerv import KervDecoder
from vla_accel_ros.ros.parameters import InferenceNodeConfig, NodeConfig, PolicySettings
from vla_accel_ros.runtime.builder import build_runner


class Twin(specs.DecoderSpec):
    """kerv under another name, declared here only."""

    name = "kerv_twin"
    summary = "kerv under another name (a test's own decoder)"
    implementation = f"{__name__}:TwinDecoder"
    settings = specs.KervConfig
    fill_check = True
    kinematic_threshold = True


class TwinDecoder(KervDecoder):
    spec = Twin


@pytest.fixture
def twin() -> Iterator[type[specs.DecoderSpec]]:
    assert sys.modules[__name__].TwinDecoder is TwinDecoder  # importable by the spec's implementation path
    specs.register(Twin)
    yield Twin
    specs.unregister(Twin.name)


def test_a_spec_registered_here_is_a_decoder_of_the_node_and_the_builder(twin, policy) -> None:
    assert "kerv_twin" in next(p for p in parameter_specs(NodeConfig) if p.name == "decoder").choices
    config = NodeConfig(policy=PolicySettings(decoder="kerv_twin", kf_fill_check=True, kinematic_r_min=2,
                                              kinematic_r_max=6))
    inference = InferenceNodeConfig(policy=PolicySettings(decoder="kerv_twin", kf_fill_check=True))
    assert inference.policy.decoder == "kerv_twin"
    runner = build_runner(config.runner_config(), ArmKinematics(default_urdf()), policy=policy)
    assert isinstance(runner.decoder, TwinDecoder) and runner.decoder.name == "kerv_twin"
    assert runner.decoder.config.fill_check and (runner.decoder.config.r_min, runner.decoder.config.r_max) == (2, 6)
    assert specs.names_with(lambda s: s.fill_check)[-1] == "kerv_twin"


def test_a_spec_without_a_capability_is_refused_that_setting(twin) -> None:
    class Plain(specs.DecoderSpec):
        name = "plain_twin"
        implementation = f"{__name__}:TwinDecoder"
        settings = specs.KervConfig

    specs.register(Plain)
    try:
        with pytest.raises(ConfigError, match="kf_fill_check.*kerv, world_aware, kerv_twin.*'plain_twin'"):
            PolicySettings(decoder="plain_twin", kf_fill_check=True)
        with pytest.raises(ValueError, match="taken"):
            specs.register(Plain)
    finally:
        specs.unregister(Plain.name)
    with pytest.raises(ConfigError, match="plain_twin"):
        PolicySettings(decoder="plain_twin")
