"""Temperature sampling by Gumbel-max with per-step noise (vla_accel_ros/sampling.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_accel_ros.models.sampling import SamplingConfig, pick_tokens


def test_greedy_draws_no_noise_and_picks_the_argmax() -> None:
    assert SamplingConfig(0.0).token_noise(episode=3, step=5) is None
    logits = torch.randn(2, 4, 256, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(pick_tokens(logits, None, 0), logits.argmax(-1))


def test_noise_is_fixed_by_seed_episode_and_step() -> None:
    config = SamplingConfig(0.5, seed=1)
    noise = config.token_noise(episode=100000, step=4)
    assert noise is not None and noise.shape == (7, 256) and torch.isfinite(noise).all()
    torch.testing.assert_close(noise, config.token_noise(episode=100000, step=4))
    for other in (config.token_noise(100000, 5), config.token_noise(100001, 4),
                  SamplingConfig(0.5, seed=2).token_noise(100000, 4)):
        assert not torch.equal(noise, other)
    # the temperature only scales the same draw
    torch.testing.assert_close(SamplingConfig(1.0, seed=1).token_noise(100000, 4) * 0.5, noise)


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_picks_follow_the_tempered_softmax(temperature: float) -> None:
    """Over many steps' noise, the picked token of fixed logits is distributed as softmax(logits / T)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0] + [-30.0] * 251)
    config = SamplingConfig(temperature, seed=7)
    draws = 6000
    picks = torch.stack([pick_tokens(logits[None], config.token_noise(0, step), 3)[0] for step in range(draws)])
    freq = np.bincount(picks.numpy(), minlength=256)[:5] / draws
    expected = torch.softmax(logits / temperature, -1)[:5].numpy()
    np.testing.assert_allclose(freq, expected, atol=0.025)


def test_positions_read_their_own_dimension_and_clamp_at_the_last() -> None:
    noise = torch.zeros(7, 256)
    for dim in range(7):
        noise[dim, 10 * dim] = 100.0  # dimension d prefers token 10 d whatever the logits
    logits = torch.zeros(1, 4, 256)
    assert pick_tokens(logits, noise, 2).tolist() == [[20, 30, 40, 50]]
    assert pick_tokens(logits, noise, 5).tolist() == [[50, 60, 60, 60]]


@pytest.mark.parametrize("temperature", [-0.1, 2.5, float("nan")])
def test_bad_temperature_is_refused(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature)
    with pytest.raises(ValueError, match="seed"):
        SamplingConfig(0.5, seed=-1)


def test_policy_runner_samples_as_configured(tmp_path, tiny_checkpoint) -> None:
    """The node's runner (thread and process mode build the same one): the same sampling config
    gives the same tokens step for step, greedy gives the argmax ones, and they differ."""
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.runtime.runner import PolicyRunner

    kin = ArmKinematics(default_urdf())
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    frames = [Observation(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "pick up the red cube", q, 0.04,
                          stamp=0.05 * i) for i in range(4)]

    def tokens(sampling: SamplingConfig | None) -> list[list[int]]:
        runner = PolicyRunner.load(ckpt, "ar", kin, action_dt_s=0.05, period_s=0.05, sampling=sampling)
        return [runner(frame).tokens.tolist() for frame in frames]

    sampled = tokens(SamplingConfig(1.5, seed=4))
    assert sampled == tokens(SamplingConfig(1.5, seed=4))
    assert sampled != tokens(None) == tokens(SamplingConfig(0.0))
