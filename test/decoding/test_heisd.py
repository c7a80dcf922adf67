"""HeiSD: the boundary metric, mode selection, sequence-wise acceptance and verify-skip, on a tiny
random policy (as in test_decoders.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from vla_accel_ros.core.actions import action_to_joint_targets
from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding import DecodeContext, make_decoder
from vla_accel_ros.decoding.boundary import (
    PUBLISHED_BOUNDARY,
    BoundaryConfig,
    boundary_distance,
    boundary_metric,
    boundary_radius,
    calibrate_boundary,
    metric_from_features,
    tcp_history,
)
from vla_accel_ros.decoding.history import EpisodeHistory
from vla_accel_ros.evaluation.episode import mode_summary
from vla_accel_ros.models import Policy

pytest.importorskip("faiss")
from vla_accel_ros.decoding.retrieval import RetrievalStore
from vla_accel_ros.runtime.runner import run_policy_step

torch.set_num_threads(1)
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
JOINT_STEP = np.array([0.02, -0.015, 0.01, 0.02, 0.0, 0.015, 0.0])  # a smooth joint-space motion
Observations = Callable[..., list[Observation]]  # the conftest.py fixture


# --- boundary metric ------------------------------------------------------------------------------
def tilted_circle(radius: float, angles: np.ndarray) -> np.ndarray:
    rotation, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(3, 3)))  # a random tilted plane
    local = np.stack([radius * np.cos(angles), radius * np.sin(angles), np.zeros_like(angles)], axis=1)
    return local @ rotation.T + np.array([0.4, -0.1, 0.3])


def test_straight_line_has_a_radius_above_the_range() -> None:
    line = np.array([0.3, 0.0, 0.2]) + np.outer(np.arange(5), [0.01, 0.004, -0.002])
    assert boundary_radius(line) > PUBLISHED_BOUNDARY.r_hi  # inf: no circle through a line
    d = boundary_distance(line)
    assert d == pytest.approx(np.linalg.norm([0.01, 0.004, -0.002]) * (4 + 3 + 2 + 1))
    d_hat = (d - PUBLISHED_BOUNDARY.d_lo) / (PUBLISHED_BOUNDARY.d_hi - PUBLISHED_BOUNDARY.d_lo)
    assert boundary_metric(line, PUBLISHED_BOUNDARY) == pytest.approx(0.5 * 1.0 + 0.5 * d_hat)


def test_tight_circle_in_a_tilted_plane() -> None:
    points = tilted_circle(0.01, np.linspace(0.0, 2.0, 5))
    assert boundary_radius(points) == pytest.approx(0.01, rel=0.01)
    r_hat = (0.01 - PUBLISHED_BOUNDARY.r_lo) / (PUBLISHED_BOUNDARY.r_hi - PUBLISHED_BOUNDARY.r_lo)
    d_hat = (boundary_distance(points) - PUBLISHED_BOUNDARY.d_lo) / (PUBLISHED_BOUNDARY.d_hi - PUBLISHED_BOUNDARY.d_lo)
    assert boundary_metric(points, PUBLISHED_BOUNDARY) == pytest.approx(0.5 * r_hat + 0.5 * d_hat, rel=0.02)


def test_too_little_history_nan_and_a_stationary_arm() -> None:
    line = np.outer(np.arange(6), [0.01, 0.0, 0.0])
    assert math.isnan(boundary_metric(line[:4], PUBLISHED_BOUNDARY))  # 4 points: too few
    assert not math.isnan(boundary_metric(line, PUBLISHED_BOUNDARY))  # the last 5 of 6
    bad = line.copy()
    bad[-2, 1] = np.nan
    assert math.isnan(boundary_metric(bad, PUBLISHED_BOUNDARY))
    still = np.tile([0.3, 0.1, 0.2], (5, 1))
    assert boundary_radius(still) == 0.0 and boundary_distance(still) == 0.0
    assert boundary_metric(still, PUBLISHED_BOUNDARY) == 0.0  # stopped: a boundary, never retrieval


def test_metric_is_clipped_to_the_unit_interval() -> None:
    cfg = BoundaryConfig(r_lo=0.01, r_hi=0.1, d_lo=0.0, d_hi=0.1, threshold=0.5)
    assert metric_from_features(math.inf, 5.0, cfg) == 1.0
    assert metric_from_features(0.0, 0.0, cfg) == 0.0
    assert metric_from_features(0.055, 0.05, cfg) == pytest.approx(0.5)
    assert math.isnan(metric_from_features(math.nan, 0.05, cfg))
    with pytest.raises(ValueError, match="r_lo < r_hi"):
        BoundaryConfig(r_lo=0.1, r_hi=0.1, d_lo=0.0, d_hi=0.1, threshold=0.5)
    with pytest.raises(ValueError, match="threshold"):
        BoundaryConfig(r_lo=0.0, r_hi=0.1, d_lo=0.0, d_hi=0.1, threshold=1.5)
    assert BoundaryConfig.from_dict(PUBLISHED_BOUNDARY.to_dict() | {"extra": 1}) == PUBLISHED_BOUNDARY


def test_calibration_uses_min_max_and_the_25th_percentile() -> None:
    rng = np.random.default_rng(0)
    radii = np.concatenate([rng.uniform(0.001, 2.0, 300), [math.inf] * 20, [math.nan] * 5])
    distances = np.concatenate([rng.uniform(0.0, 0.15, 320), [0.1] * 5])
    cfg, info = calibrate_boundary(radii, distances)
    finite = np.isfinite(radii)
    assert cfg.r_lo == pytest.approx(radii[finite].min()) and cfg.r_hi == pytest.approx(radii[finite].max())
    assert cfg.d_lo == pytest.approx(distances[:320].min()) and cfg.d_hi == pytest.approx(distances[:320].max())
    m = np.array([metric_from_features(r, d, cfg) for r, d in zip(radii[:320], distances[:320])])
    assert cfg.threshold == pytest.approx(np.percentile(m, 25))
    assert info["windows"] == 320 and info["retrieval_share"] == pytest.approx(0.75, abs=0.01)
    with pytest.raises(ValueError, match="too few"):
        calibrate_boundary(np.array([math.inf, math.inf]), np.array([0.1, 0.2]))


# --- the decoder --------------------------------------------------------------------------------
# the tiny ``policy`` and ``kin`` come from conftest.py
@pytest.fixture(scope="module")
def observations(observations: Observations) -> Observations:
    """conftest.py's observations, all naming the red cube (one instruction: only the images differ)."""
    return functools.partial(observations, colours=("red",))


def make_store(policy: Policy, obs: list[Observation], threshold: float = 0.0, seed: int = 0,
               calibration: bool = True) -> RetrievalStore:
    """Keys: the policy's own embeddings of ``obs``; values: random trajectories."""
    keys = np.concatenate([policy.prefill(o).pooled.numpy() for o in obs])
    values = np.random.default_rng(seed).integers(0, 255, (len(obs), 4, 7))
    meta = {"calibration": BoundaryConfig(0.0, 0.05, 0.0, 0.05, threshold).to_dict()} if calibration else {}
    return RetrievalStore.build(keys, values, meta=meta)


def moving_context(kin: ArmKinematics, n: int = 5, step: int = 4) -> DecodeContext:
    """A context with ``n`` joint samples along a smooth motion (the TCP moves: m > 0)."""
    kf = JointKalmanFilter(kin, dt=0.05)
    q = np.array([Q_HOME + JOINT_STEP * i for i in range(n)])
    for i, row in enumerate(q):
        kf.update(row, 0.05 * i)
    return DecodeContext(joint_positions=q, joint_stamps=0.05 * np.arange(n), kalman=kf, step=step,
                         gripper_history=(1.0,))


class CountingPolicy:
    """The policy, counting prefill and target passes."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self.prefills = 0
        self.scores = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def prefill(self, obs: Observation) -> Any:
        self.prefills += 1
        return self._policy.prefill(obs)

    def score(self, prefix: Any, tokens: torch.Tensor) -> Any:
        self.scores += 1
        return self._policy.score(prefix, tokens)


def test_metric_from_the_context_uses_fk_of_the_last_five_joint_samples(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    context = moving_context(kin, n=7)
    decoder = make_decoder("heisd", preset="published", store=make_store(policy, observations(2)))
    tcp = np.array([kin.fk(q).position for q in context.joint_positions[-5:]])
    np.testing.assert_allclose(tcp_history(kin, context.joint_positions), tcp)
    assert decoder.metric(context) == pytest.approx(boundary_metric(tcp, PUBLISHED_BOUNDARY))
    assert math.isnan(decoder.metric(moving_context(kin, n=4)))  # too little history
    assert math.isnan(decoder.metric(DecodeContext(joint_positions=context.joint_positions)))  # no kinematics


def test_verify_skip_executes_the_retrieved_actions_without_the_model(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    obs = observations(6, seed=7)
    store = make_store(policy, obs, threshold=0.0)
    decoder = make_decoder("heisd", store=store, r_seq=255.0)  # every retrieved action passes as a whole
    counting = CountingPolicy(policy)
    history = EpisodeHistory(JointKalmanFilter(kin, dt=0.05), max_steps=20, control_period_s=0.05)
    modes, results = [], []
    for step in range(8):
        q = Q_HOME + JOINT_STEP * step
        history.observe_joints(q, 0.05 * step)
        before = (counting.prefills, counting.scores)
        result = run_policy_step(counting, obs[2], decoder, history.context(time_left_s=0.05))
        history.record(result)
        modes.append(result.mode)
        results.append((result, before, (counting.prefills, counting.scores)))
    # 4 steps of too little history, a retrieval step, 2 skipped steps, then the model again
    assert modes == ["drafter"] * 4 + ["retrieval", "skip", "skip", "retrieval"]
    retrieval, _, _ = results[4]
    np.testing.assert_array_equal(retrieval.tokens, store.values[2, 0])
    assert retrieval.target_passes == 1 and retrieval.accepted_len == 7 and "retrieval_query" in retrieval.timings
    for k, step in ((1, 5), (2, 6)):
        result, before, after = results[step]
        np.testing.assert_array_equal(result.tokens, store.values[2, k])  # the stored rows 1..2
        assert after == before  # no prefill, no target pass
        assert result.target_passes == 0 and result.draft_passes == 0 and result.timings["prefill"] == 0.0
        np.testing.assert_allclose(result.action, policy.tokens_to_action(store.values[2, k]))
        assert (np.all(result.action >= policy.tokenizer.q01 - 1e-12)
                and np.all(result.action <= policy.tokenizer.q99 + 1e-12))
        q_target, gripper = action_to_joint_targets(kin, Q_HOME + JOINT_STEP * step, result.action, 0.05)
        assert kin.within_limits(q_target) and 0.0 <= gripper <= 1.0
    assert results[7][2][0] == results[7][1][0] + 1  # step 7: prefilled again
    stats = decoder.stats()
    assert stats["skip_steps"] == 2 and stats["retrieval_steps"] == 2 and stats["drafter_steps"] == 4
    assert stats["verify_skip_share"] == pytest.approx(2 / 8) and stats["retrieval_mode_share"] == pytest.approx(2 / 6)
    summary = mode_summary(modes, [r.accepted_len for r, _, _ in results], list(decoder.query_ms))
    assert summary["verify_skip_share"] == pytest.approx(2 / 8) and summary["retrieval_accept_rate"] == 1.0


def test_queue_is_dropped_on_a_new_episode_or_a_gap(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    obs = observations(3, seed=8)
    decoder = make_decoder("heisd", store=make_store(policy, obs), r_seq=255.0)
    for skip_context, expect in ((DecodeContext(step=0), None), (DecodeContext(step=7), None),
                                 (DecodeContext(step=5), "skip")):
        result = decoder.decode(policy, policy.prefill(obs[0]), moving_context(kin, step=4))
        assert result.mode == "retrieval"
        skipped = decoder.skip_step(skip_context)
        assert (skipped.mode if skipped else None) == expect
    decoder.reset()
    assert decoder.skip_step(DecodeContext(step=6)) is None
    no_skip = make_decoder("heisd", store=make_store(policy, obs), r_seq=255.0, skip_steps=0)
    no_skip.decode(policy, policy.prefill(obs[0]), moving_context(kin, step=4))
    assert no_skip.skip_step(DecodeContext(step=5)) is None


def test_drafter_mode_equals_sd_r9(policy: Policy, kin: ArmKinematics, observations: Observations) -> None:
    obs = observations(5, seed=9)
    never = make_store(policy, obs, threshold=1.0)  # m <= 1 always: never retrieval
    sd = make_decoder("sd", r=9)
    for decoder, context in (
        (make_decoder("heisd", store=never), moving_context(kin)),
        (make_decoder("heisd", store=make_store(policy, obs)), DecodeContext()),  # no history
        (make_decoder("heisd", store=make_store(policy, obs)), moving_context(kin, n=3)),
    ):
        for o in obs:
            prefix = policy.prefill(o)
            got, want = decoder.decode(policy, prefix, context), sd.decode(policy, prefix, context)
            assert got.mode == "drafter" and got.decoder == "heisd"
            np.testing.assert_array_equal(got.tokens, want.tokens)
            assert (got.target_passes, got.draft_passes, got.accepted_len, got.rounds) == (
                want.target_passes, want.draft_passes, want.accepted_len, want.rounds)


def test_rejected_retrieval_falls_back_to_exact_sd_at_r0(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    """r = 0 without sequence-wise acceptance: whatever was retrieved, the action is the AR one."""
    obs = observations(6, seed=10)
    decoder = make_decoder("heisd", store=make_store(policy, obs, seed=2), r=0, sequence_accept=False)
    ar = make_decoder("ar")
    for o in obs:
        prefix = policy.prefill(o)
        result = decoder.decode(policy, prefix, moving_context(kin))
        assert result.mode == "retrieval" and result.target_passes >= 1
        np.testing.assert_array_equal(result.tokens, ar.decode(policy, prefix, DecodeContext()).tokens)
        if result.accepted_len < 7:
            assert decoder.skip_step(DecodeContext(step=5)) is None  # nothing queued after a rejection


def test_sequence_wise_acceptance_bounds_the_mean_distance(
    policy: Policy, kin: ArmKinematics, observations: Observations
) -> None:
    obs = observations(1, seed=11)
    prefix = policy.prefill(obs[0])
    ar_tokens = make_decoder("ar").decode(policy, prefix, DecodeContext()).tokens
    draft = np.clip(ar_tokens + np.array([3, -3, 3, 0, 0, 0, 0]), 0, 254)  # a few bins off the AR action
    key = prefix.pooled.numpy()
    meta = {"calibration": BoundaryConfig(0.0, 0.05, 0.0, 0.05, 0.0).to_dict()}
    store = RetrievalStore.build(key, np.tile(draft, (1, 4, 1)), meta=meta)
    # the target's argmax after the draft's own tokens may differ from AR's after position 0, so
    # compare against the pass itself: r_seq at the measured mean accepts, just below it rejects
    argmax = policy.score(prefix, torch.tensor(draft[None], dtype=torch.long)).logits[0].argmax(-1).numpy()[:7]
    mean = float(np.abs(draft - argmax).mean())
    accept = make_decoder("heisd", store=store, r=0, r_seq=mean).decode(policy, prefix, moving_context(kin))
    assert accept.accepted_len == 7 and accept.target_passes == 1
    np.testing.assert_array_equal(accept.tokens, draft)
    if mean > 0:
        reject = make_decoder("heisd", store=store, r=0, r_seq=mean - 1e-6).decode(policy, prefix, moving_context(kin))
        assert reject.accepted_len < 7 and reject.target_passes >= 1


def test_always_seven_valid_tokens(policy: Policy, kin: ArmKinematics, observations: Observations) -> None:
    obs = observations(6, seed=12)
    contexts = [DecodeContext(), moving_context(kin), moving_context(kin, n=8, step=7),
                moving_context(kin, n=2, step=1)]
    for threshold, r_seq, preset in ((0.0, 4.0, "calibrated"), (0.5, 0.0, "calibrated"), (0.0, 4.0, "published")):
        decoder = make_decoder("heisd", store=make_store(policy, obs[:3], threshold=threshold), r_seq=r_seq,
                               preset=preset)
        for o, context in zip(obs, contexts * 2):
            result = decoder.decode(policy, policy.prefill(o), context)
            assert result.tokens.shape == (7,) and np.all((0 <= result.tokens) & (result.tokens <= 254))
            assert np.all(np.isfinite(result.action)) and result.mode in ("drafter", "retrieval")
            np.testing.assert_allclose(result.action, policy.tokens_to_action(result.tokens))


def test_store_problems_are_clear(policy: Policy, kin: ArmKinematics, tmp_path, observations: Observations) -> None:
    obs = observations(2, seed=13)
    with pytest.raises(ValueError, match="build-store"):
        make_decoder("heisd").decode(policy, policy.prefill(obs[0]), moving_context(kin))
    with pytest.raises(ValueError, match="no boundary calibration"):
        make_decoder("heisd", store=make_store(policy, obs, calibration=False))
    make_decoder("heisd", preset="published", store=make_store(policy, obs, calibration=False))  # needs none
    with pytest.raises(ValueError, match="horizon"):
        make_decoder("heisd", store=make_store(policy, obs), skip_steps=4)
    with pytest.raises(ValueError, match="preset"):
        make_decoder("heisd", preset="fancy")
    with pytest.raises(ValueError, match="r_seq"):
        make_decoder("heisd", r_seq=-1)
    small = RetrievalStore.build(np.ones((2, 16), np.float32), np.zeros((2, 4, 7), np.int64),
                                 meta={"calibration": PUBLISHED_BOUNDARY.to_dict()})
    with pytest.raises(ValueError, match="dim 16"):
        make_decoder("heisd").attach_store(small, policy)
    path = make_store(policy, obs).save(tmp_path / "store")
    loaded = make_decoder("heisd", store=str(path))  # a directory works too
    assert loaded.store is not None and loaded.boundary.threshold == 0.0
    with pytest.raises(FileNotFoundError, match="vla-accel build-store"):
        make_decoder("heisd").attach_checkpoint_store(tmp_path / "ckpt", policy)


def test_policy_runner_loads_the_checkpoints_store(tmp_path, tiny_checkpoint, kin: ArmKinematics) -> None:
    """The node's runner attaches CHECKPOINT/retrieval_store at load, and refuses to start without one."""
    from vla_accel_ros.models import load_checkpoint
    from vla_accel_ros.runtime.runner import PolicyRunner

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="vla-accel build-store"):
        PolicyRunner.load(ckpt, "heisd", kin, action_dt_s=0.05, period_s=0.05)
    tiny = load_checkpoint(ckpt)
    obs = [Observation(image=np.zeros((64, 64, 3), np.uint8), instruction="pick up the red cube",
                       joint_pos=Q_HOME + JOINT_STEP * i, gripper=0.04, stamp=0.05 * i) for i in range(6)]
    make_store(tiny, obs, threshold=0.0).save(ckpt / "retrieval_store")
    runner = PolicyRunner.load(ckpt, "heisd", kin, action_dt_s=0.05, period_s=0.05)
    assert runner.decoder.store is not None and len(runner.decoder.store) == 6
    results = [runner(o) for o in obs]
    assert [r.mode for r in results[:4]] == ["drafter"] * 4 and results[4].mode == "retrieval"
    assert all(r.tokens.shape == (7,) and np.all(np.isfinite(r.action)) for r in results)


# --- the compact store on disk and the one the checkpoint ships -----------------------------------
def test_float16_keys_halve_the_file_and_find_the_same_neighbours(policy: Policy, tmp_path,
                                                                   observations: Observations) -> None:
    store = make_store(policy, observations(8, seed=14))
    full, half = store.save(tmp_path / "f32"), store.save(tmp_path / "f16", key_dtype="float16")
    loaded = RetrievalStore.load(half, expect_dim=policy.config.d_model)
    assert (loaded.key_dtype, RetrievalStore.load(full).key_dtype) == ("float16", "float32")
    assert (half / "store.safetensors").stat().st_size < (full / "store.safetensors").stat().st_size
    for key in store.keys:
        assert loaded.query(key).indices[0] == store.query(key).indices[0]
    np.testing.assert_array_equal(loaded.values, store.values)
    assert loaded.save(tmp_path / "again").joinpath("store.json").read_text().count('"key_dtype": "float16"') == 1
    with pytest.raises(ValueError, match="key_dtype"):
        store.save(tmp_path / "bad", key_dtype="int8")


def test_the_shipped_store_loads_and_matches_the_checkpoint() -> None:
    from vla_accel_ros.core.resources import default_checkpoint
    from vla_accel_ros.decoding.retrieval import default_store_dir, store_mismatch
    from vla_accel_ros.models import load_checkpoint

    ckpt = default_checkpoint()
    directory = default_store_dir(ckpt)
    assert sum(f.stat().st_size for f in directory.iterdir()) <= 3_000_000  # the compact store's budget
    target = load_checkpoint(ckpt)
    store = RetrievalStore.load(directory, expect_dim=target.config.d_model)
    assert store.key_dtype == "float16" and store.horizon >= 3 and len(store) > 1000
    assert store_mismatch(store, ckpt) is None  # built for these very weights
    decoder = make_decoder("heisd")
    decoder.attach_checkpoint_store(ckpt, target)
    assert decoder.store is not None and decoder.boundary is not None  # calibrated from the demonstrations
