"""The builder: settings in, a runner and a controller out, the same way for every caller."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vla_accel_ros.core.controller import ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_checkpoint, default_urdf
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.ros.parameters import NodeConfig, PolicySettings
from vla_accel_ros.runtime.builder import RunnerConfig, build_controller, build_runner

KIN = ArmKinematics(default_urdf())
Q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_checkpoint) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.mark.parametrize(
    "settings, word",
    [
        ({"decoder": " "}, "decoder"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"action_dt_s": 0.0}, "action_dt_s"),
        ({"period_s": -0.05}, "period_s"),
        ({"max_steps": 0}, "max_steps"),
        ({"torch_threads": 0}, "torch_threads"),
    ],
)
def test_runner_config_refuses_bad_settings_by_name(settings, word):
    with pytest.raises(ValueError, match=word):
        RunnerConfig(**settings)


def test_runner_config_defaults_and_the_node_s_view():
    assert RunnerConfig().checkpoint_path == default_checkpoint()
    assert RunnerConfig(checkpoint="/x").checkpoint_path == Path("/x")
    assert RunnerConfig().temperature is None  # the model's (RunDefaults)
    cfg = NodeConfig(policy=PolicySettings(checkpoint="/ckpt", decoder="sd", temperature=0.0), control_rate_hz=50.0,
                     action_dt_s=0.04, torch_threads=3, vision=VisionReuseConfig(threshold=5.0))
    assert cfg.runner_config() == RunnerConfig(checkpoint="/ckpt", decoder="sd", temperature=0.0,
                                               vision=VisionReuseConfig(threshold=5.0), action_dt_s=0.04,
                                               period_s=0.02, torch_threads=3)


def test_importing_the_builder_does_not_import_torch():
    """A process-mode node builds its controller here and leaves the policy (and torch) to the child."""
    code = ("import sys, vla_accel_ros.runtime.builder, vla_accel_ros.runtime.process_worker; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_build_runner_loads_the_checkpoint_with_the_settings(checkpoint):
    ticks = iter(range(10_000))
    config = RunnerConfig(str(checkpoint), "ar", temperature=0.0, vision=VisionReuseConfig(), action_dt_s=0.04,
                          period_s=0.02, max_steps=30)
    runner = build_runner(config, KIN, clock=lambda: next(ticks) * 1e-3)
    assert runner.decoder_name == "ar" and runner.period_s == 0.02 and runner.image_size == 64
    assert runner.history.max_steps == 30 and runner.history.control_period_s == 0.04
    assert runner.history.sampling.temperature == 0.0 and runner.vision is not None
    result = runner(Observation(np.zeros((64, 64, 3), np.uint8), "pick up the red cube", Q, 0.04))
    assert result.target_passes == 7 and result.timings["total"] > 0  # timed on the given clock
    off = build_runner(RunnerConfig(str(checkpoint), "ar", vision=VisionReuseConfig(enabled=False)), KIN)
    assert off.vision is None


def test_build_runner_loads_a_resolved_checkpoint_without_recognising_it_again(checkpoint, monkeypatch):
    from vla_accel_ros.models import load

    resolved = load.resolve_checkpoint(str(checkpoint))

    def recognised_again(directory: Path) -> None:
        raise AssertionError(f"{directory} was recognised again")

    monkeypatch.setattr(load, "read_config", recognised_again)
    runner = build_runner(RunnerConfig(str(checkpoint), "ar", resolved=resolved), KIN)
    assert runner.decoder_name == "ar" and runner.image_size == 64 and runner.policy_stats() == {}
    with pytest.raises(AssertionError, match="recognised again"):  # unresolved, it is resolved here
        build_runner(RunnerConfig(str(checkpoint), "ar"), KIN)


def test_build_runner_with_a_loaded_policy_and_a_configured_decoder(checkpoint):
    from vla_accel_ros.decoding import make_decoder
    from vla_accel_ros.models import load_checkpoint

    policy = load_checkpoint(checkpoint)
    decoder = make_decoder("sd", r=3)
    runner = build_runner(RunnerConfig(decoder="sd"), KIN, policy=policy, decoder=decoder)
    assert runner.policy is policy and runner.decoder is decoder
    assert build_runner(RunnerConfig(decoder="kerv"), KIN, policy=policy).decoder_name == "kerv"
    with pytest.raises(ValueError, match="'sd'.*'kerv'"):
        build_runner(RunnerConfig(decoder="kerv"), KIN, policy=policy, decoder=decoder)
    with pytest.raises(ValueError, match="policy"):
        build_runner(RunnerConfig(decoder="sd"), KIN, decoder=decoder)
    with pytest.raises(ValueError, match="greedy"):
        build_runner(RunnerConfig(decoder="greedy"), KIN, policy=policy)


def test_kf_fill_check_reaches_the_decoder_and_is_refused_for_one_without_a_kalman_fill(checkpoint):
    from vla_accel_ros.models import load_checkpoint

    policy = load_checkpoint(checkpoint)
    for name in ("kerv", "world_aware"):
        runner = build_runner(RunnerConfig(decoder=name, kf_fill_check=True), KIN, policy=policy)
        assert runner.decoder.config.fill_check is True
    loaded = build_runner(RunnerConfig(str(checkpoint), "kerv", kf_fill_check=True), KIN)
    assert loaded.decoder.config.fill_check is True
    assert build_runner(RunnerConfig(decoder="kerv"), KIN, policy=policy).decoder.config.fill_check is False
    for name in ("ar", "sd", "deadline"):
        with pytest.raises(ValueError, match=f"kf_fill_check.*kerv, world_aware.*'{name}'"):
            build_runner(RunnerConfig(decoder=name, kf_fill_check=True), KIN, policy=policy)


def test_kinematic_r_bounds_reach_the_decoder_and_are_refused_for_one_without_the_kinematic_threshold(checkpoint):
    from vla_accel_ros.models import load_checkpoint
    from vla_accel_ros.runtime.process_worker import ChildSpec

    policy = load_checkpoint(checkpoint)
    for name in ("kerv", "world_aware"):
        config = build_runner(RunnerConfig(decoder=name, kinematic_r_bounds=(2, 6)), KIN, policy=policy).decoder.config
        assert (config.r_min, config.r_max) == (2, 6)
    own = build_runner(RunnerConfig(decoder="kerv"), KIN, policy=policy).decoder.config
    assert (own.r_min, own.r_max) == (5, 15)
    for name in ("ar", "sd", "deadline"):
        with pytest.raises(ValueError, match=f"kinematic_r_min.*kerv, world_aware.*'{name}'"):
            build_runner(RunnerConfig(decoder=name, kinematic_r_bounds=(2, 6)), KIN, policy=policy)
    for bad in ((6, 2), (-1, 4), (2,), (2.5, 6)):
        with pytest.raises(ValueError, match="kinematic_r_bounds"):
            RunnerConfig(decoder="kerv", kinematic_r_bounds=bad)  # type: ignore[arg-type]
    # the inference process receives the settings as JSON, the bounds as a list
    spec = ChildSpec(RunnerConfig(decoder="kerv", kinematic_r_bounds=(2, 6)), "<robot/>", "tcp")
    message = json.loads(json.dumps(spec.to_message()))
    assert ChildSpec.from_message(message).runner.kinematic_r_bounds == (2, 6)


def test_build_controller_sets_enable_and_the_first_instruction():
    held = build_controller(ControllerConfig(period_s=0.02), KIN)
    assert not held.enabled and held.instruction == ""
    ready = build_controller(ControllerConfig(), KIN, enabled=True, instruction="pick up the red cube")
    assert ready.enabled and ready.instruction == "pick up the red cube"
    assert build_controller(ControllerConfig(), KIN, instruction="  ").instruction == ""
