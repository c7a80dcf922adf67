"""The runner: episodes (explicit and detected), the sampling key, what reaches the decoder, the result type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.decoding.ar import ARDecoder
from vla_accel_ros.decoding.protocol import DecodeContext, DecodeResult, Step
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.runner import EPISODE_JUMP_RAD, PolicyRunner

KIN = ArmKinematics(default_urdf())
Q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
TASK = "pick up the red cube"


class RecordingAR(ARDecoder):
    """AR that keeps every context it decodes with."""

    def __init__(self) -> None:
        self.contexts: list[DecodeContext] = []

    def step(self, policy: Any, context: DecodeContext, prefix: Any = None) -> Step:
        self.contexts.append(context)
        return (yield from super().step(policy, context, prefix))


@pytest.fixture(scope="module")
def policy(tmp_path_factory, tiny_checkpoint) -> Any:
    from vla_accel_ros.models import load_checkpoint

    return load_checkpoint(tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny"))


def observation(step: int, q: np.ndarray = Q, instruction: str = TASK) -> Observation:
    image = np.random.default_rng(step).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    return Observation(image, instruction, q, 0.04, stamp=0.05 * (step + 1))


def runner_of(policy: Any, temperature: float = 1.0) -> tuple[PolicyRunner, RecordingAR]:
    decoder = RecordingAR()
    config = RunnerConfig(decoder="ar", temperature=temperature, action_dt_s=0.05, period_s=0.02)
    return build_runner(config, KIN, policy=policy, decoder=decoder), decoder


def test_the_episode_key_decides_the_sampling_noise(policy):
    tokens = {}
    for name, key in (("a", 100_003), ("b", 100_003), ("c", 7)):
        runner, _ = runner_of(policy)
        runner.start_episode(key)
        results = [runner(observation(i)) for i in range(3)]
        assert runner.history.episode == key  # the first observation does not start another episode
        tokens[name] = np.stack([r.tokens for r in results])
    np.testing.assert_array_equal(tokens["a"], tokens["b"])
    assert not np.array_equal(tokens["a"], tokens["c"])


def test_new_instruction_or_a_jump_of_the_arm_starts_a_new_episode(policy):
    runner, decoder = runner_of(policy, temperature=0.0)
    runner(observation(0))
    first = runner.history.episode
    runner(observation(1, Q + 0.5 * EPISODE_JUMP_RAD))
    assert runner.history.episode == first and decoder.contexts[-1].step == 1
    runner(observation(2, instruction="pick up the blue cube"))
    assert runner.history.episode == first + 1 and decoder.contexts[-1].step == 0
    runner(observation(3, Q + 2.0 * EPISODE_JUMP_RAD, instruction="pick up the blue cube"))
    assert runner.history.episode == first + 2 and decoder.contexts[-1].step == 0
    assert len(decoder.contexts[-1].joint_positions) == 1  # the history restarted with this measurement


def test_the_decoder_sees_the_clearance_and_one_period_of_time(policy):
    runner, decoder = runner_of(policy, temperature=0.0)
    result = runner(observation(0), target_clearance=0.03)
    assert isinstance(result, DecodeResult) and result.action.shape == (7,)
    context = decoder.contexts[-1]
    assert context.target_clearance == 0.03
    assert context.time_left_s is not None and context.time_left_s <= runner.period_s
    runner(observation(1))
    assert decoder.contexts[-1].target_clearance is None  # a robot: no scene to measure


def test_start_episode_clears_the_vision_cache_and_the_decoder_state(policy, monkeypatch):
    from vla_accel_ros.models.configuration import VisionReuseConfig

    runner = PolicyRunner(policy, RecordingAR(), KIN, action_dt_s=0.05, period_s=0.05, vision=VisionReuseConfig())
    resets: list[str] = []
    monkeypatch.setattr(runner.decoder, "reset", lambda: resets.append("decoder"))
    assert runner(observation(0)).vision_fraction == 1.0
    assert runner(observation(0)).vision_fraction == 0.0  # the same frame: nothing re-encoded
    runner.start_episode(5)
    assert runner(observation(0)).vision_fraction == 1.0 and resets == ["decoder", "decoder"]


def test_load_names_the_checkpoint_problem(tmp_path: Path):
    (tmp_path / "model.json").write_text("{not json")
    with pytest.raises(ValueError, match="model.json"):
        PolicyRunner.load(tmp_path, "ar", KIN, action_dt_s=0.05, period_s=0.05)
