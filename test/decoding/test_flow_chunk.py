"""A chunked flow head (horizon H): one sample is H actions, the decoder hands them all over,
and the worker puts them in the controller's queue (ChunkPolicy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.history import EpisodeHistory
from vla_accel_ros.models.own.flow import FlowHeadConfig, FlowHeads
from vla_accel_ros.runtime.runner import run_policy_step
from vla_accel_ros.runtime.thread_worker import StepReport
from vla_accel_ros.training.data import action_windows


@pytest.mark.parametrize("name, horizon", [("flow10", 1), ("flow10", 4), ("flow2", 3)])
def test_a_flow_head_with_a_horizon_decodes_a_chunk(policy, kin, observations, name, horizon):
    torch.manual_seed(0)
    policy.flow = FlowHeads(FlowHeadConfig(d_model=policy.config.d_model, hidden=16, layers=1, horizon=horizon)).eval()
    history = EpisodeHistory(JointKalmanFilter(kin, dt=0.05), max_steps=10, control_period_s=0.05)
    obs = observations(1)[0]
    history.observe_joints(np.asarray(obs.joint_pos), obs.stamp)
    result = run_policy_step(policy, obs, make_decoder(name), history.context())
    report = StepReport.of(result)
    assert report.actions.shape == (horizon, 7) and result.target_passes == 0
    np.testing.assert_array_equal(report.actions[0], result.action)
    if horizon == 1:
        assert result.chunk is None
    else:  # every action of the chunk within the tokenizer's range
        low, high = policy.tokenizer.q01, policy.tokenizer.q99
        assert np.all(report.actions >= low - 1e-9) and np.all(report.actions <= high + 1e-9)


def test_training_windows_stay_inside_their_episode():
    actions = torch.arange(6, dtype=torch.float32)[:, None].repeat(1, 7)  # action i is all i
    episode = torch.tensor([0, 0, 0, 1, 1, 1])
    windows = action_windows(actions, episode, 3).reshape(6, 3, 7)[..., 0]
    assert windows.tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 5], [4, 5, 5], [5, 5, 5]]
    assert torch.equal(action_windows(actions, episode, 1), actions)


def test_a_two_camera_head_reads_each_image_slot(policy, kin, observations):
    """The head's condition holds the prefix features of both cameras' images: the wrist image
    changes the chunk, a missing one is refused naming the slots."""
    from dataclasses import replace

    torch.manual_seed(0)
    policy.flow = FlowHeads(FlowHeadConfig(d_model=policy.config.d_model, hidden=16, layers=1, horizon=4,
                                           cameras=2)).eval()
    assert policy.capabilities().image_slots == 2
    obs = observations(1)[0]
    rng = np.random.default_rng(0)
    wrists = [rng.integers(0, 255, obs.image.shape, dtype=np.uint8) for _ in range(2)]

    def chunk(wrist: np.ndarray) -> np.ndarray:
        history = EpisodeHistory(JointKalmanFilter(kin, dt=0.05), max_steps=10, control_period_s=0.05)
        history.observe_joints(np.asarray(obs.joint_pos), obs.stamp)
        return StepReport.of(run_policy_step(policy, replace(obs, extra_images=(wrist,)), make_decoder("flow2"),
                                             history.context())).actions

    first, again, other = chunk(wrists[0]), chunk(wrists[0]), chunk(wrists[1])
    assert first.shape == (4, 7)
    np.testing.assert_array_equal(first, again)  # the same images and noise: the same chunk
    assert not np.allclose(first, other)  # the wrist image is read
    with pytest.raises(ValueError, match="2 camera images"):
        policy.prefill(obs)
    policy.flow = None
