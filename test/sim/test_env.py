import numpy as np
import pytest

from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
from vla_accel_ros.sim.expert import run_expert_episode


@pytest.fixture(scope="module")
def env():
    with PickCubeEnv(SimConfig()) as e:
        yield e


def test_render_shape_and_dtype(env):
    obs = env.reset(0)
    assert obs.image.shape == (128, 128, 3) and obs.image.dtype == np.uint8
    assert obs.image.std() > 5  # a real scene, not a blank frame
    assert env.render("wrist").shape == (128, 128, 3)
    with PickCubeEnv(SimConfig(image_size=64)) as small:
        assert small.reset(0).image.shape == (64, 64, 3)


def test_same_seed_same_first_frame_and_states(env):
    a = env.reset(7)
    qpos_a = env.data.qpos.copy()
    b = env.reset(7)
    assert np.array_equal(a.image, b.image)
    assert np.array_equal(qpos_a, env.data.qpos)
    action = np.array([0.01, -0.01, 0.0, 0.0, 0.0, 0.02, 1.0])
    states = []
    for _ in range(2):
        env.reset(7)
        for _ in range(5):
            env.step(action)
        states.append(env.data.qpos.copy())
    assert np.array_equal(states[0], states[1])
    c = env.reset(8)
    assert not np.array_equal(a.image, c.image)


def test_instruction_names_the_target_colour(env):
    colours = set()
    for seed in range(12):
        obs = env.reset(seed)
        assert obs.instruction == f"pick up the {env.color} cube"
        colours.add(env.color)
    assert colours == {"red", "green", "blue"}
    with pytest.raises(ValueError, match="unknown cube colour"):
        env.reset(0, color="purple")


def test_cubes_do_not_overlap_and_are_in_reach(env):
    for seed in range(20):
        env.reset(seed)
        positions = [env.cube_position(c) for c in ("red", "green", "blue")]
        for i in range(3):
            assert 0.3 < positions[i][0] < 0.7 and abs(positions[i][1]) < 0.25
            for j in range(i):
                assert np.linalg.norm(positions[i][:2] - positions[j][:2]) >= 0.09


def test_expert_succeeds_on_20_seeds():
    with PickCubeEnv(SimConfig(render=False)) as env:
        results = [run_expert_episode(env, seed) for seed in range(1000, 1020)]
    assert all(r["success"] for r in results), [r["steps"] for r in results]


def test_near_contact_recorded_and_actions_go_through_ik():
    with PickCubeEnv(SimConfig(render=False)) as env:
        result = run_expert_episode(env, 5, record=True)
    clearance = np.asarray(result["target_clearance"])
    near = np.asarray(result["near_contact"])
    assert near.any() and not near.all()
    assert np.array_equal(near, clearance < 0.02)
    actions = np.stack(result["actions"])
    assert actions.shape[1] == 7 and set(np.unique(actions[:, 6])) <= {0.0, 1.0}


def test_not_lifting_is_not_success(env):
    env.reset(3)
    while not env.done:
        env.step(np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]))
    assert env.steps == env.config.max_steps
    assert not env.success()


def test_bad_action_rejected(env):
    env.reset(0)
    with pytest.raises(ValueError, match="7 numbers"):
        env.step(np.zeros(6))
    with pytest.raises(ValueError, match="non-finite"):
        env.step(np.array([np.nan, 0, 0, 0, 0, 0, 1]))


def test_front_camera_coordinates_land_on_the_rendered_cubes(env):
    """The projection used for keypoint labels agrees with the renderer to within ~2 pixels."""
    from vla_accel_ros.sim.scene import front_camera_coordinates

    obs = env.reset(3)
    im = obs.image.astype(int)
    r, g, b = im[..., 0], im[..., 1], im[..., 2]
    masks = {"red": (r > 150) & (g < 80) & (b < 80), "green": (g > 120) & (r < 80) & (b < 80),
             "blue": (b > 150) & (r < 80) & (g < 100)}
    for colour, mask in masks.items():
        rows, cols = np.nonzero(mask)
        assert len(rows) > 5, colour
        seen = np.array([(cols.mean() + 0.5) / 64 - 1, (rows.mean() + 0.5) / 64 - 1])
        projected = front_camera_coordinates(env.cube_position(colour))
        assert np.all(np.abs(projected - seen) < 2.5 / 64), (colour, projected, seen)
