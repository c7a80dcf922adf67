"""A fleet decodes several robots' steps in one batched prefill per round and one batched verify
pass after it, each robot's tokens those its own runner would give, its filter, history and noise
its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.decoding.protocol import PREFILL_VERIFIED
from vla_accel_ros.models import Policy, VLAConfig
from vla_accel_ros.models.tokenizer import ActionTokenizer
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.fleet import STAGES, FleetRunner
from vla_accel_ros.runtime.steps import BatchContact

KIN = ArmKinematics(default_urdf())
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


@pytest.fixture(scope="module")
def policy() -> Policy:
    config = VLAConfig(image_size=32, patch_size=16, d_model=32, n_heads=2, n_layers=2, vision_layers=1,
                       max_text_len=16, local_channels=8, contact_hidden=8)
    return Policy.create(config, ActionTokenizer(-np.full(7, 0.02), np.full(7, 0.02)), seed=5)


def streams(n_robots: int, steps: int) -> list[list[Observation]]:
    """Each robot its own images, arm moving slowly, and its own task."""
    colours = ("red", "green", "blue")
    out = []
    for r in range(n_robots):
        rng = np.random.default_rng(r)
        q = Q_HOME + rng.normal(0, 0.05, 7)
        out.append([Observation(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), f"pick up the {colours[r % 3]} cube",
                                q + 0.01 * t, 0.04, 0.05 * t) for t in range(steps)])
    return out


@pytest.mark.parametrize("decoder, temperature", [("world_aware", 0.0), ("world_aware", 0.5), ("kerv", 0.0),
                                                  ("kerv", 0.5), ("ar", 0.0), ("sd", 0.0)])
def test_a_fleet_gives_each_robot_what_its_own_runner_gives(policy, decoder, temperature):
    config = RunnerConfig(decoder=decoder, temperature=temperature, vision=None)
    data = streams(3, 6)
    alone = [build_runner(config, KIN, policy=policy) for _ in data]
    fleet = FleetRunner([build_runner(config, KIN, policy=policy) for _ in data])
    for t in range(6):
        together = fleet.step([(r, data[r][t]) for r in range(3)])
        for r in range(3):
            own = alone[r](data[r][t])
            np.testing.assert_array_equal(together[r].tokens, own.tokens, err_msg=f"robot {r} step {t}")
            assert together[r].target_passes == own.target_passes


def recording_score(policy, monkeypatch) -> list[tuple[int, int]]:
    """The shape (robots, tokens) of every ``policy.score`` call from now on, in order."""
    shapes: list[tuple[int, int]] = []
    score = policy.score
    monkeypatch.setattr(policy, "score",
                        lambda prefix, tokens: shapes.append(tuple(tokens.shape)) or score(prefix, tokens))
    return shapes


def test_the_verify_passes_after_the_prefill_are_one_batched_pass(policy, monkeypatch):
    config = RunnerConfig(decoder="kerv", temperature=0.5, vision=None)
    fleet = FleetRunner([build_runner(config, KIN, policy=policy) for _ in range(3)])
    data = streams(3, 4)
    shapes = recording_score(policy, monkeypatch)
    for t in range(4):
        results = fleet.step([(r, data[r][t]) for r in range(3)])
        assert all(r.target_passes == 1 and r.rounds == 1 for r in results)
        # the shared pass
        assert len({r.timings["verify"] for r in results}) == 1 and results[0].timings["verify"] > 0.0
        assert fleet.last_stages["batched_verify"] > 0.0
    assert shapes == [(3, 6)] * 4  # one verify pass a round for all three robots


def contact_by_observation(policy, data: list[list[Observation]]):
    """A contact head calling each robot near contact on some steps and free on others: its logit
    is steep in the prefix's first pooled feature, cut in the widest gap between the streams'
    values (so a batched prefill's rounding never moves a step across the cut)."""
    values = sorted(float(policy.prefill(obs).pooled[0, 0]) for stream in data for obs in stream)
    middle = range(len(values) // 4, 3 * len(values) // 4)
    gap, k = max((values[k + 1] - values[k], k) for k in middle)
    cut = 0.5 * (values[k] + values[k + 1])
    return lambda prefix: (prefix.pooled[:, 0] - cut) * (40.0 / gap)  # |logit| >= 20 at every step


def test_world_aware_through_contact_gives_each_robot_what_its_own_runner_gives(policy, monkeypatch):
    """Free space and contact mixed within rounds: the robots verified inside the prefill finish on
    their rows, the others share one verify pass after it, and every robot's tokens are its own."""
    data = streams(3, 10)
    monkeypatch.setattr(policy, "contact_logits", contact_by_observation(policy, data))
    config = RunnerConfig(decoder="world_aware", temperature=0.5, vision=None)
    alone = [build_runner(config, KIN, policy=policy) for _ in data]
    fleet = FleetRunner([build_runner(config, KIN, policy=policy) for _ in data])
    shapes = recording_score(policy, monkeypatch)
    after_prefill = []
    for t in range(10):
        shapes.clear()
        together = fleet.step([(r, data[r][t]) for r in range(3)])
        later = sum(result.mode != PREFILL_VERIFIED for result in together)
        assert shapes == ([(later, 6)] if later else [])  # those after the prefill: one pass together
        after_prefill.append(later)
        for r in range(3):
            own = alone[r](data[r][t])
            np.testing.assert_array_equal(together[r].tokens, own.tokens, err_msg=f"robot {r} step {t}")
            assert (together[r].mode, together[r].target_passes, together[r].accepted_len, together[r].threshold) == (
                own.mode, own.target_passes, own.accepted_len, own.threshold)
    assert after_prefill[0] == 3  # an episode's first step: no contact reading before the prefill
    assert any(0 < n < 3 for n in after_prefill[1:])  # rounds mixing free space and contact


def test_a_fleet_of_different_decoders(policy, monkeypatch):
    """kerv's and world_aware's verify passes and sd's first round share one pass after the prefill;
    sd's later rounds are its own."""
    names = ("kerv", "sd", "world_aware", "kerv")
    data = streams(len(names), 4)
    configs = [RunnerConfig(decoder=name, temperature=0.5, vision=None) for name in names]
    alone = [build_runner(c, KIN, policy=policy) for c in configs]
    fleet = FleetRunner([build_runner(c, KIN, policy=policy) for c in configs])
    shapes = recording_score(policy, monkeypatch)
    for t in range(4):
        shapes.clear()
        together = fleet.step([(r, data[r][t]) for r in range(len(names))])
        assert shapes[0] == (sum(result.mode != PREFILL_VERIFIED for result in together), 6)
        assert all(robots == 1 for robots, _ in shapes[1:])
        for r in range(len(names)):
            np.testing.assert_array_equal(together[r].tokens, alone[r](data[r][t]).tokens,
                                          err_msg=f"robot {r} step {t}")


def test_prefix_rows_select_in_order(policy):
    data = streams(4, 1)
    batch = policy.prefill_tensors(*(torch.cat(t)
                                     for t in zip(*(policy.observation_tensors(s[0]) for s in data)))).prefix
    for rows in ([2, 0], [1, 2], [3]):
        picked = batch.select_rows(rows)
        assert picked.batch_size == len(rows) and picked.prefix_len == batch.prefix_len
        for j, row in enumerate(rows):
            one = batch.select(row)
            torch.testing.assert_close(picked.select(j).cache.layers[0][0], one.cache.layers[0][0], atol=0, rtol=0)
            torch.testing.assert_close(picked.select(j).hidden_last, one.hidden_last, atol=0, rtol=0)
    # a view
    assert batch.select_rows([1, 2]).cache.layers[0][0].data_ptr() == batch.select(1).cache.layers[0][0].data_ptr()


def test_a_round_times_its_stages(policy):
    config = RunnerConfig(decoder="world_aware", temperature=0.0, vision=None)
    fleet = FleetRunner([build_runner(config, KIN, policy=policy) for _ in range(2)])
    data = streams(2, 3)
    for t in range(3):
        fleet.step([(r, data[r][t]) for r in range(2)])
    stages = fleet.last_stages
    assert set(stages) == set(STAGES) and all(v >= 0.0 for v in stages.values())
    assert stages["batched_pass"] > 0.0 and stages["alone"] == 0.0  # no robot was served on its own


def test_the_contact_head_runs_once_a_round_for_all_robots(policy, monkeypatch):
    config = RunnerConfig(decoder="world_aware", temperature=0.0, vision=None)
    fleet = FleetRunner([build_runner(config, KIN, policy=policy) for _ in range(3)])
    data = streams(3, 4)
    batches = []
    contact_logits = policy.contact_logits
    monkeypatch.setattr(policy, "contact_logits",
                        lambda prefix: batches.append(prefix.batch_size) or contact_logits(prefix))
    for t in range(4):
        fleet.step([(r, data[r][t]) for r in range(3)])
    assert batches == [3] * 4  # no scene clearance: every robot reads it, every round, in one call


def test_a_batched_prefills_contact_head_reads_every_row_at_once_as_each_would_alone(policy, monkeypatch):
    data = streams(3, 1)
    batch = policy.prefill_tensors(*(torch.cat(t)
                                     for t in zip(*(policy.observation_tensors(s[0]) for s in data)))).prefix
    batches = []
    contact_logits = policy.contact_logits
    monkeypatch.setattr(policy, "contact_logits",
                        lambda prefix: batches.append(prefix.batch_size) or contact_logits(prefix))
    contact = BatchContact(policy, batch)
    for row in (2, 0, 1):
        assert contact.row(row) == pytest.approx(policy.contact_probability(batch.select(row)), abs=1e-6)
    assert batches == [3, 1, 1, 1]  # one call for the rows; each row alone for the comparison


def test_only_some_robots_in_a_round_and_a_policy_without_batches(policy):
    config = RunnerConfig(decoder="world_aware", temperature=0.0, vision=None)
    fleet = FleetRunner([build_runner(config, KIN, policy=policy) for _ in range(3)])
    data = streams(3, 2)
    results = fleet.step([(2, data[2][0]), (0, data[0][0])])
    assert len(results) == 2 and all(r.tokens.shape == (7,) for r in results)
    with pytest.raises(ValueError, match="share one policy"):
        FleetRunner([build_runner(config, KIN, policy=policy),
                     build_runner(config, KIN, policy=Policy.create(policy.config, policy.tokenizer, seed=1))])


def test_the_batched_prefill_rows_are_each_robots_own(policy):
    data = streams(4, 1)
    tensors = [policy.observation_tensors(s[0]) for s in data]
    batch = policy.prefill_tensors(*(torch.cat([t[k] for t in tensors]) for k in range(3))).prefix
    for r, one in enumerate(tensors):
        alone = policy.prefill_tensors(*one).prefix
        torch.testing.assert_close(batch.select(r).hidden_last, alone.hidden_last, atol=1e-5, rtol=1e-5)
