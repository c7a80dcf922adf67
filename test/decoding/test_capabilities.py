"""What a policy lacks, each decoder either works around (saying so) or refuses at start-up: the
contract a Hugging Face VLA (no draft, contact or flow head) meets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.decoding import make_decoder, names
from vla_accel_ros.decoding.history import EpisodeHistory
from vla_accel_ros.models.api import PolicyCapabilities
from vla_accel_ros.runtime.runner import run_policy_step


class HeadlessPolicy:
    """The tiny VLA with its draft, contact and flow heads hidden: prefill and scoring only."""

    flow = None
    parallel_draft = None

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.scores = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    @staticmethod
    def capabilities() -> PolicyCapabilities:
        return PolicyCapabilities(token_scoring=True)

    def score(self, prefix: Any, tokens: torch.Tensor) -> Any:
        self.scores += 1
        return self.policy.score(prefix, tokens)

    def draft_tokens(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a decoder drafted with a head the policy does not have")

    draft_tokens_parallel = draft_tokens

    def contact_probability(self, prefix: Any) -> float:
        raise AssertionError("a decoder read a contact head the policy does not have")


REFUSED = {"sd": "draft head", "kerv_released": "draft head", "deadline": "draft head", "heisd": "draft head",
           "flow10": "continuous action head", "flow2": "continuous action head",
           "chunk": "predicts its chunk in one pass"}
WARNED = {"world_aware": "no contact head"}


@pytest.mark.parametrize("name", names())
def test_each_decoder_refuses_or_works_around_a_headless_policy(policy, name):
    decoder = make_decoder(name)
    headless = HeadlessPolicy(policy)
    if name in REFUSED:
        with pytest.raises(ValueError, match=REFUSED[name]):
            decoder.check_policy(headless)
        return
    warnings = decoder.check_policy(headless)
    assert (WARNED[name] in " ".join(warnings)) if name in WARNED else warnings == []
    assert decoder.check_policy(policy) == []  # the full policy needs no fallback


@pytest.mark.parametrize("name", ["kerv", "world_aware"])
def test_kerv_without_a_draft_head_proposes_from_the_kalman_filter_and_the_previous_action(
        policy, kin, observations, name):
    headless = HeadlessPolicy(policy)
    decoder = make_decoder(name)
    history = EpisodeHistory(JointKalmanFilter(kin, dt=0.05), max_steps=20, control_period_s=0.05)
    results = []
    for obs in observations(6, colours=("red",)):
        history.observe_joints(np.asarray(obs.joint_pos), obs.stamp)
        before = headless.scores
        result = run_policy_step(headless, obs, decoder, history.context())
        history.record(result)
        results.append((result, headless.scores - before))
    first, first_passes = results[0]
    assert first.mode == "first_step_ar" and first_passes == 7  # nothing to propose from yet
    for result, passes in results[1:]:
        # one pass verifies the proposal (in the prefill, or after it)
        assert passes <= 1 and result.target_passes == 1 and result.draft_passes == 0
        assert result.tokens.shape == (7,) and np.all((0 <= result.tokens) & (result.tokens < 255))


def test_kerv_at_r0_without_a_draft_head_keeps_the_targets_tokens(policy, kin, observations):
    """Exact acceptance: the accepted tokens and the one at the first rejection are ar's; only the
    Kalman fill after it may differ (as with a draft head)."""
    headless = HeadlessPolicy(policy)
    histories = {n: EpisodeHistory(JointKalmanFilter(kin, dt=0.05), max_steps=20, control_period_s=0.05)
                 for n in ("ar", "kerv")}
    decoders = {"ar": make_decoder("ar"), "kerv": make_decoder("kerv", r_min=0, r_max=0)}
    for obs in observations(5, colours=("red",)):
        results = {}
        for name, decoder in decoders.items():
            histories[name].observe_joints(np.asarray(obs.joint_pos), obs.stamp)
            results[name] = run_policy_step(headless, obs, decoder, histories[name].context())
            histories[name].record(results[name])
        kept = min(results["kerv"].accepted_len + 1, 7)
        np.testing.assert_array_equal(results["kerv"].tokens[:kept], results["ar"].tokens[:kept])


class TokenlessPolicy(HeadlessPolicy):
    """The tiny VLA declaring no action tokens either: only a chunk decoder could serve it."""

    @staticmethod
    def capabilities() -> PolicyCapabilities:
        return PolicyCapabilities()


@pytest.mark.parametrize("name", names())
def test_a_policy_without_action_tokens_is_refused_by_every_token_decoder(policy, name):
    decoder = make_decoder(name)
    expected = REFUSED[name] if name in ("flow10", "flow2", "chunk") else "action tokens"
    with pytest.raises(ValueError, match=expected):
        decoder.check_policy(TokenlessPolicy(policy))


def test_a_pass_of_a_policy_without_a_contact_head_reads_none(policy, observations):
    """The contact reading asks the declaration, never the policy's method (the headless one's raises)."""
    from vla_accel_ros.decoding.protocol import PassResult

    headless = HeadlessPolicy(policy)
    reading = PassResult.alone(headless, policy.prefill(observations(1)[0]), None, 0.0)
    with pytest.raises(ValueError, match="no contact head"):
        reading.contact_probability()
