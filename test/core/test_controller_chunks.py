"""A chunked policy's actions in the controller's queue: each used once, at the tick its action
step is due, in order; between steps and after the chunk the Kalman fallback, then the hold."""

from __future__ import annotations

import numpy as np
import pytest

from vla_accel_ros.core.chunks import ChunkSettings
from vla_accel_ros.core.controller import Controller, ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf

Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
IMAGE = np.zeros((32, 32, 3), np.uint8)
ACTION_DT = 0.05


@pytest.fixture(scope="module")
def kin() -> ArmKinematics:
    return ArmKinematics(default_urdf())


def chunk_of(h: int) -> np.ndarray:
    """h distinct actions: action k moves x by (k + 1) mm and sets the gripper to k / 10."""
    return np.array([[0.001 * (k + 1), 0, 0, 0, 0, 0, k / 10] for k in range(h)])


def run(kin: ArmKinematics, period: float, ticks: int, h: int, *, tick_times: list[float] | None = None,
        obs_age: float = 0.0, **cfg: object) -> tuple[list, Controller]:
    """A chunk of ``h`` arriving at t = 0 from an observation ``obs_age`` old, then ``ticks``
    ticks every ``period`` (or at ``tick_times``); the arm reported still at home throughout."""
    ctrl = Controller(kin, ControllerConfig(period_s=period, action_dt_s=ACTION_DT, **cfg))  # type: ignore[arg-type]
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)
    ctrl.on_joint_state(Q_HOME, 0.04, -0.01)
    ctrl.on_image(IMAGE, -0.01)
    assert ctrl.on_action_chunk(chunk_of(h), obs_stamp=-obs_age, now=0.0) is None
    results = []
    for t in tick_times if tick_times is not None else [i * period for i in range(ticks)]:
        ctrl.on_joint_state(Q_HOME, 0.04, t)
        ctrl.on_image(IMAGE, t)
        results.append(ctrl.tick(t))
    return results, ctrl


@pytest.mark.parametrize("period, h, expected", [
    (0.05, 4, ["policy"] * 4 + ["fallback"] * 2),  # one action per tick, then the fallback
    (0.025, 3, ["policy", "fallback"] * 3 + ["fallback"]),  # control twice the policy rate
    (0.05, 1, ["policy", "fallback", "fallback"]),  # one action: a chunk of one
], ids=["same-rate", "double-rate", "single"])
def test_each_action_runs_once_at_its_step(kin, period, h, expected):
    results, ctrl = run(kin, period, len(expected), h, fallback_max_s=1.0)
    assert [r.source for r in results] == expected
    used = [r for r in results if r.source == "policy"]
    assert [r.gripper_command for r in used] == pytest.approx([k / 10 for k in range(h)])  # in order
    if h > 1:
        assert "step 1 of" in used[0].reason and f"step {h} of {h}" in used[-1].reason
    assert ctrl.stats.actions_used == h and ctrl.stats.actions_expired == 0


def test_a_late_tick_skips_the_steps_it_missed_and_counts_them(kin):
    results, ctrl = run(kin, 0.05, 0, 5, tick_times=[0.0, 0.16, 0.2], fallback_max_s=1.0)
    assert [r.source for r in results] == ["policy", "policy", "policy"]
    assert [r.gripper_command for r in results] == pytest.approx([0.0, 0.3, 0.4])  # steps 1 and 2 skipped
    assert ctrl.stats.actions_expired == 2


def test_steps_whose_time_passed_during_inference_are_dropped(kin):
    # the observation is 0.08 s old when the chunk arrives: step 0 (due at -0.08) ran during
    # inference and is dropped; steps 1 and 2 run at their own times
    results, ctrl = run(kin, 0.05, 3, 3, obs_age=0.08, fallback_max_s=1.0)
    assert [r.source for r in results] == ["policy", "policy", "fallback"]
    assert [r.gripper_command for r in results[:2]] == pytest.approx([0.1, 0.2])
    assert ctrl.stats.chunk_steps_dropped == 1 and results[0].chunk_start and not results[1].chunk_start


def test_a_chunk_whose_last_step_is_older_than_the_action_timeout_is_not_executed(kin):
    # every step's time passed during a 0.3 s inference: only the last is kept, 0.2 s late for its step
    fresh, _ = run(kin, 0.05, 1, 3, obs_age=0.3, action_timeout_s=0.25, fallback_max_s=1.0)
    stale, ctrl = run(kin, 0.05, 1, 3, obs_age=0.3, action_timeout_s=0.15, fallback_max_s=1.0)
    assert [r.source for r in fresh] == ["policy"] and fresh[0].gripper_command == pytest.approx(0.2)
    assert [r.source for r in stale] == ["fallback"] and ctrl.stats.actions_expired == 1


@pytest.mark.parametrize("blend, grippers", [("latest_only", [0.1, 0.0]),
                                              ("weighted_average", [0.7 * 0.1 + 0.3 * 0.2, 0.3 * 0.3]),
                                              ("crossfade", [0.1 / 3 + 0.2 * 2 / 3, 0.0 * 2 / 3 + 0.3 / 3])])
def test_a_new_chunk_blends_with_what_is_left_of_the_last(kin, blend, grippers):
    results, ctrl = run(kin, 0.05, 2, 4, fallback_max_s=1.0, chunks=ChunkSettings(chunk_blend=blend))
    ctrl.on_action_chunk(chunk_of(2)[::-1], obs_stamp=0.09, now=0.1)  # gripper 0.1 then 0.0; old: 0.2, 0.3
    after = []
    for t in (0.1, 0.15, 0.2):
        ctrl.on_joint_state(Q_HOME, 0.04, t)
        ctrl.on_image(IMAGE, t)
        after.append(ctrl.tick(t))
    assert [r.source for r in after] == ["policy", "policy", "fallback"]
    assert [r.gripper_command for r in after[:2]] == pytest.approx(grippers)
    assert ctrl.stats.chunk_steps_blended == 2 and ctrl.stats.chunks_planned == 2


def test_the_fallback_after_a_chunk_is_bounded_and_every_step_is_continuous(kin):
    results, _ = run(kin, 0.05, 14, 4, fallback_max_s=0.25)
    sources = [r.source for r in results]
    assert sources[:4] == ["policy"] * 4 and "hold" in sources[4:]
    commands = np.array([r.q_command for r in results])
    assert np.all(np.abs(np.diff(commands, axis=0)) <= kin.limits.velocity * 0.05 + 1e-9)


@pytest.mark.parametrize("bad", [np.zeros((0, 7)), np.zeros((3, 6)), np.array([[0, 0, 0, np.nan, 0, 0, 0]]),
                                 np.zeros(7)])
def test_a_bad_chunk_is_rejected_with_a_reason(kin, bad):
    ctrl = Controller(kin, ControllerConfig(action_dt_s=ACTION_DT))
    assert "action rejected" in ctrl.on_action_chunk(bad, obs_stamp=0.0, now=0.0)
    assert ctrl.stats.inputs_rejected == 1
