"""Relaxed acceptance and the decoders' accepted-prefix logic, on hand-made logits.

``TablePolicy`` implements the decoders' policy API with hand-made logits: the target's next token
is a fixed function of the tokens before it (a one-hot logit row), and the draft proposes that
token plus a per-position offset chosen by the test, so the accepted length under a threshold r is
known exactly (the first position whose |offset| > r).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.decoding import DecodeContext, make_decoder
from vla_accel_ros.decoding.acceptor import accepted_length, relaxed_accept_mask
from vla_accel_ros.decoding.kerv_released import token_filter_prediction
from vla_accel_ros.models.api import PolicyCapabilities
from vla_accel_ros.models.tokenizer import ActionTokenizer

torch.set_num_threads(1)
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


@dataclass(frozen=True)
class TablePrefix:
    tokens: tuple[int, ...] = ()
    base: int = 0

    def truncate(self, m: int) -> TablePrefix:
        assert 0 <= m <= len(self.tokens) - self.base
        return TablePrefix(self.tokens[: self.base + m], self.base)


class TablePolicy:
    flow = None  # no continuous action head
    parallel_draft = None  # no parallel draft head

    def __init__(self, offsets: tuple[int, ...] = (0,) * 7, contact: float = 0.0) -> None:
        self.offsets = offsets
        self.contact = contact
        self.tokenizer = ActionTokenizer(-np.full(7, 0.02), np.full(7, 0.02))
        self.n_action_tokens = 7
        self.score_ks: list[int] = []

    @staticmethod
    def capabilities() -> PolicyCapabilities:
        return PolicyCapabilities(token_scoring=True, draft_head=True, contact_head=True)

    @staticmethod
    def next_token(seq: tuple[int, ...]) -> int:
        return (37 * sum((i + 1) * t for i, t in enumerate(seq)) + 11 * len(seq) + 5) % 200 + 20

    def prefill(self, obs: object) -> TablePrefix:
        return TablePrefix()

    def score(self, prefix: TablePrefix, tokens: torch.Tensor) -> SimpleNamespace:
        new = tuple(int(t) for t in tokens[0])
        self.score_ks.append(len(new))
        logits = torch.zeros(1, len(new) + 1, 256)
        for i in range(len(new) + 1):
            logits[0, i, self.next_token(prefix.tokens + new[:i])] = 1.0
        return SimpleNamespace(logits=logits, prefix=TablePrefix(prefix.tokens + new, len(prefix.tokens)))

    def draft_tokens(self, prefix: TablePrefix, n: int, last_token: torch.Tensor | None = None,
                     noise: torch.Tensor | None = None):
        if last_token is None:
            assert prefix.tokens == (), "last_token=None only at the start of the action"
        else:
            assert int(last_token[0]) == prefix.tokens[-1], "last_token must be the prefix's last token"
        seq = prefix.tokens
        out = []
        for j in range(n):
            pos = len(seq)
            # Like the real policy, a proposal right after consumed tokens is the target's own token.
            offset = self.offsets[pos] if (j > 0 or pos == 0) else 0
            out.append(int(np.clip(self.next_token(seq) + offset, 0, 254)))
            seq = seq + (out[-1],)
        return torch.tensor([out]), torch.zeros(1, n, 256)

    def contact_probability(self, prefix: TablePrefix) -> float:
        return self.contact

    def tokens_to_action(self, tokens: np.ndarray) -> np.ndarray:
        return self.tokenizer.decode(np.asarray(tokens))


def ar_tokens(policy: TablePolicy) -> list[int]:
    seq: tuple[int, ...] = ()
    while len(seq) < 7:
        seq += (policy.next_token(seq),)
    return list(seq)


def consistent(tokens: np.ndarray, policy: TablePolicy, kept_offsets: dict[int, int]) -> bool:
    """Every token is the target's token after the ones before it, plus the offset kept there."""
    return all(
        int(tokens[i]) == policy.next_token(tuple(int(t) for t in tokens[:i])) + kept_offsets.get(i, 0)
        for i in range(7)
    )


# --- the rule itself ----------------------------------------------------------------------------
def test_relaxed_mask_is_prefix_wise() -> None:
    draft = [10, 20, 30, 40, 50]
    target = [12, 20, 45, 40, 50]
    np.testing.assert_array_equal(relaxed_accept_mask(draft, target, 2), [True, True, False, False, False])
    assert accepted_length(draft, target, 2) == 2
    assert accepted_length(draft, target, 15) == 5
    # position 0 fails at r=1, so the exact matches after it do not count
    np.testing.assert_array_equal(relaxed_accept_mask(draft, target, 1), [False] * 5)
    assert accepted_length(draft, target, 0) == 0
    assert accepted_length([5], [5], 0) == 1


def test_relaxed_mask_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="shape"):
        relaxed_accept_mask([1, 2], [1], 1)
    with pytest.raises(ValueError, match=">= 0"):
        relaxed_accept_mask([1], [1], -1)


# --- decoders on hand-made logits ---------------------------------------------------------------
def test_ar_feeds_one_token_per_pass() -> None:
    policy = TablePolicy()
    result = make_decoder("ar").decode(policy, policy.prefill(None), DecodeContext())
    assert result.tokens.tolist() == ar_tokens(policy)
    assert policy.score_ks == [0, 1, 1, 1, 1, 1, 1] and result.target_passes == 7


@pytest.mark.parametrize("name", ["sd", "kerv"])
def test_exact_and_all_accepted_gives_ar_tokens_in_one_pass(name: str) -> None:
    policy = TablePolicy(offsets=(0,) * 7)
    cfg = {"r": 0} if name == "sd" else {"r_min": 0, "r_max": 0}
    result = make_decoder(name, **cfg).decode(policy, policy.prefill(None), DecodeContext())
    assert result.tokens.tolist() == ar_tokens(policy)
    assert result.accepted_len == 7 and result.target_passes == 1 and result.rounds == 1


def test_sd_keeps_draft_tokens_within_r_and_adds_the_bonus() -> None:
    offsets = (0, 1, -2, 5, 0, 3, 0)
    policy = TablePolicy(offsets=offsets)
    result = make_decoder("sd", r=2).decode(policy, policy.prefill(None), DecodeContext())
    # Round 1 accepts positions 0..2 (|offset| <= 2, drafts kept), rejects 3 -> bonus = target's token.
    # Round 2 drafts 4..6 after the bonus: position 5's offset 3 is rejected -> bonus; round 3 drafts 6.
    assert consistent(result.tokens, policy, {1: 1, 2: -2})
    assert result.accepted_len == 3 + 1 + 1
    assert result.rounds == 3 and result.target_passes == 3
    assert policy.score_ks == [6, 3, 1]  # 6 of the 7 drafts (the 7th has no next), then bonus + 2, then the bonus
    assert result.tokens.tolist() != ar_tokens(policy)


def test_sd_exact_always_gives_ar_tokens() -> None:
    for offsets in [(0, 1, 0, 0, 0, 0, 0), (3, 3, 3, 3, 3, 3, 3), (0, 0, 0, 0, 0, 0, 9)]:
        policy = TablePolicy(offsets=offsets)
        result = make_decoder("sd", r=0).decode(policy, policy.prefill(None), DecodeContext())
        assert result.tokens.tolist() == ar_tokens(policy)


def converged_filter(kin: ArmKinematics, velocity: float = 0.0) -> JointKalmanFilter:
    kf = JointKalmanFilter(kin, dt=0.05)
    for i in range(6):
        kf.update(Q_HOME + velocity * 0.05 * i, 0.05 * i)
    return kf


def test_kerv_fills_after_the_bonus_from_the_kalman_filter() -> None:
    kin = ArmKinematics(default_urdf())
    kf = converged_filter(kin, velocity=0.05)
    policy = TablePolicy(offsets=(0, 0, 40, 0, 0, 0, 0))
    context = DecodeContext(kalman=kf, gripper_history=(0.0,))
    result = make_decoder("kerv").decode(policy, policy.prefill(None), context)
    kf_tokens = policy.tokenizer.encode(kf.predict_action(0.05, [0.0]))
    assert result.target_passes == 1 and result.rounds == 1 and policy.score_ks == [6]
    assert result.accepted_len == 2
    assert result.tokens[:2].tolist() == ar_tokens(policy)[:2]
    assert result.tokens[2] == policy.next_token(tuple(result.tokens[:2].tolist()))  # bonus
    np.testing.assert_array_equal(result.tokens[3:], kf_tokens[3:])
    assert result.kf_filled == 4


def test_kerv_without_a_converged_filter_keeps_draft_suffix() -> None:
    policy = TablePolicy(offsets=(0, 0, 40, 7, 7, 7, 7))
    result = make_decoder("kerv").decode(policy, policy.prefill(None), DecodeContext())
    drafted, _ = policy.draft_tokens(TablePrefix(), 7)
    assert result.threshold == 5.0  # r_min without a motion model
    assert result.kf_filled == 0 and result.target_passes == 1
    np.testing.assert_array_equal(result.tokens[3:], drafted[0, 3:].numpy())


def test_kerv_keeps_draft_gripper_without_gripper_history() -> None:
    kin = ArmKinematics(default_urdf())
    policy = TablePolicy(offsets=(60, 0, 0, 0, 0, 0, 0))
    context = DecodeContext(kalman=converged_filter(kin))
    result = make_decoder("kerv").decode(policy, policy.prefill(None), context)
    drafted, _ = policy.draft_tokens(TablePrefix(), 7)
    assert result.accepted_len == 0 and result.kf_filled == 5
    assert result.tokens[6] == drafted[0, 6]


def test_kerv_released_forced_step_fills_from_token_filter() -> None:
    history = np.array([[100, 101, 102, 103, 104, 105, 106], [110, 111, 112, 113, 114, 115, 116]])
    policy = TablePolicy(offsets=(0, 0, 0, 40, 0, 0, 0))
    decoder = make_decoder("kerv_released")
    forced = DecodeContext(step=3, max_steps=120, token_history=history)
    result = decoder.decode(policy, policy.prefill(None), forced)
    assert policy.score_ks == [6] and result.rounds == 1
    assert result.accepted_len == 3
    np.testing.assert_array_equal(result.tokens[3:], token_filter_prediction(history)[3:])
    assert result.kf_filled == 4
    np.testing.assert_array_equal(token_filter_prediction(history), history[-1])  # R << Q: last step

    policy = TablePolicy(offsets=(0, 0, 0, 40, 0, 0, 0))
    ordinary = decoder.decode(policy, policy.prefill(None), DecodeContext(step=4, token_history=history))
    assert ordinary.rounds == 2 and ordinary.kf_filled == 0
    assert consistent(ordinary.tokens, policy, {})


def test_world_aware_uses_scene_clearance_then_contact_head() -> None:
    kin = ArmKinematics(default_urdf())
    kf = converged_filter(kin)
    decoder = make_decoder("world_aware")
    near = DecodeContext(kalman=kf, target_clearance=0.005)
    free = DecodeContext(kalman=kf, target_clearance=0.5)
    policy = TablePolicy(contact=1.0)
    r_near = decoder.decode(policy, policy.prefill(None), near).threshold
    r_free = decoder.decode(policy, policy.prefill(None), free).threshold
    r_kerv = make_decoder("kerv").decode(policy, policy.prefill(None), free).threshold
    assert r_near < r_kerv < r_free
    unknown = DecodeContext(kalman=kf)
    r_head_contact = decoder.decode(TablePolicy(contact=0.95), TablePrefix(), unknown).threshold
    r_head_free = decoder.decode(TablePolicy(contact=0.05), TablePrefix(), unknown).threshold
    assert r_head_contact == r_near and r_head_free == r_free
