"""The scripted expert's recovery and policy-in-the-loop (DAgger) collection."""

import mujoco
import numpy as np
import pytest

from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
from vla_accel_ros.sim.expert import ScriptedExpert, run_expert_episode


@pytest.fixture(scope="module")
def env():
    with PickCubeEnv(SimConfig(image_size=32)) as e:
        yield e


def test_expert_goes_back_to_approach_when_the_cube_is_lost(env):
    env.reset(3)
    expert = ScriptedExpert(env)
    obs = env.observation()
    while expert.phase != "close" and not env.done:
        obs, _ = env.step(expert.act(obs))
    assert expert.phase == "close"
    assert expert.act(obs)[6] == 0.0  # closing
    adr = env.handles.cube_qpos[env.color]  # the cube slides 8 cm away under the gripper
    env.data.qpos[adr] += 0.08
    mujoco.mj_forward(env.model, env.data)
    action = expert.act(obs)
    assert expert.phase == "approach" and action[6] == 1.0  # re-opens and heads for the cube again
    assert action[0] > 0  # towards its new x


def test_policy_in_the_loop_records_expert_labels(env):
    drift = np.array([0.0, 0.02, 0.0, 0.0, 0.0, 0.0, 1.0], np.float32)  # a "policy" that only slides sideways
    driven = run_expert_episode(env, 7, record=True, policy_action=lambda obs: drift, policy_share=1.0)
    assert driven["policy_in_loop"] and not driven["success"]
    labels = np.stack(driven["actions"])
    assert not np.allclose(labels, drift)  # recorded labels are the expert's, not what was executed
    tcp = np.stack(driven["tcp_pos"])
    assert tcp[-1, 1] - tcp[0, 1] > 0.2  # and the sideways policy really drove the arm
    mixed = run_expert_episode(env, 7, record=True, policy_action=lambda obs: drift, policy_share=0.3)
    again = run_expert_episode(env, 7, record=True, policy_action=lambda obs: drift, policy_share=0.3)
    np.testing.assert_array_equal(np.stack(mixed["actions"]), np.stack(again["actions"]))  # seeded mixing
    with pytest.raises(ValueError, match="policy_action"):
        run_expert_episode(env, 7, policy_share=0.5)
