"""The shipped Hugging Face VLA (checkpoints/hf_small, built by ``vla-accel train-hf``): it loads
offline as ``hf:DIR`` with its draft head, reads the arm's state from its prompt, was made for the
package arm, and one prefill in the sim's first held-out scene gives a finite action in range."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vla_accel_ros.core.resources import share_dir
from vla_accel_ros.core.robot_record import read_robot_record
from vla_accel_ros.models.api import PolicyCapabilities
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.training.hf_draft import greedy_rollout

HF_SMALL = share_dir() / "checkpoints" / "hf_small"


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    return load_hf_vla(f"hf:{HF_SMALL}")


def test_the_shipped_model_is_small_and_in_openvla_layout(policy) -> None:
    assert sum(p.stat().st_size for p in HF_SMALL.iterdir()) <= 15 * 2**20
    assert 5e6 <= sum(p.numel() for p in policy.model.parameters()) <= 30e6
    assert type(policy.model).__name__ == "LlavaForConditionalGeneration"
    assert policy.capabilities() == PolicyCapabilities(token_scoring=True, draft_head=True, incremental_prefill=True,
                                                       resizes_images=True)
    assert policy.spec.reads_proprio
    statistics = json.loads((HF_SMALL / "dataset_statistics.json").read_text())
    assert set(statistics["sim_pick_cube"]) >= {"action", "proprio", "num_transitions"}
    record = read_robot_record(HF_SMALL)
    assert record is not None and record.dof == 7 and record.tcp_frame == "tcp"


def test_one_greedy_action_in_the_first_held_out_scene(policy) -> None:
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

    with PickCubeEnv(SimConfig(image_size=policy.config.image_size)) as env:
        obs = env.reset(100000)
    action = policy.tokens_to_action(greedy_rollout(policy, obs)[1])
    assert action.shape == (7,) and np.all(np.isfinite(action))
    low, high = policy.tokenizer.q01, policy.tokenizer.q99
    assert np.all(action[:6] >= low[:6] - 1e-9) and np.all(action[:6] <= high[:6] + 1e-9)
    assert 0.0 <= action[6] <= 1.0
