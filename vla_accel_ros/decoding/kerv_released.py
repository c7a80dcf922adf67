"""KERV as its public code behaves: a token-space random-walk Kalman filter and a time-decayed r.

Per action dimension, a random-walk KF runs over the token ids of every previous step of the
episode (x0 = the first step's token, Q = 1, R = 1e-3, P0 = 10); its rounded, clamped state
predicts the next token. With R much smaller than Q this is in effect "repeat the last token".

On every 4th step, ``(step + 1) % 4 == 0``, completion is forced: one draft/verify round, the
relaxed-accepted prefix is kept and the filter fills the rest, with no second pass. Every other
step runs ordinary relaxed speculative decoding until all 7 tokens exist. r decays with the step
index (see :func:`thresholds.released_schedule_threshold`); nothing here looks at kinematics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.acceptor import Completion, complete
from vla_accel_ros.decoding.protocol import (
    MAX_TOKEN_ID,
    N_ACTION_TOKENS,
    DecodeContext,
    Decoder,
    Step,
)
from vla_accel_ros.decoding.specs import KervReleasedConfig
from vla_accel_ros.decoding.speculation import PassLedger, SpecState, speculate_to_end
from vla_accel_ros.decoding.thresholds import released_schedule_threshold
from vla_accel_ros.models.api import PolicyLike, Prefix


def token_filter_prediction(history: np.ndarray, q: float = 1.0, r: float = 1e-3, p0: float = 10.0) -> np.ndarray:
    """Random-walk KF over a (S, 7) token history; returns the predicted next tokens (7,)."""
    hist = np.asarray(history, dtype=float).reshape(-1, N_ACTION_TOKENS)
    if len(hist) == 0:
        raise ValueError("token_filter_prediction needs at least one step of token history")
    x = hist[0].copy()
    p = np.full(N_ACTION_TOKENS, p0)
    for z in hist:
        p_prior = p + q
        gain = p_prior / (p_prior + r)
        x = x + gain * (z - x)
        p = (1.0 - gain) * p_prior
    return np.clip(np.rint(x), 0, MAX_TOKEN_ID).astype(np.int64)


class KervReleasedDecoder(Decoder):
    spec = specs.KervReleased

    def __init__(self, **cfg: Any) -> None:
        self.config = KervReleasedConfig(**cfg)

    def forced(self, step: int) -> bool:
        return (step + 1) % self.config.period == 0

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        ledger = PassLedger(policy, context)
        prefill = yield from ledger.prefill(prefix)
        state = SpecState(prefill.prefix)
        cfg = self.config
        r = released_schedule_threshold(context.step, context.max_steps, cfg.r_start, cfg.r_min)
        kf_filled = 0
        if self.forced(context.step) and len(context.token_history) > 0:
            draft = ledger.draft(state.prefix, N_ACTION_TOKENS)
            picks, _ = yield from ledger.score(state.prefix, draft[: N_ACTION_TOKENS - 1])  # no 8th token
            fill = token_filter_prediction(context.token_history, cfg.q, cfg.r_noise, cfg.p0)
            # the filter fills from the first rejection on: the peer keeps no bonus token
            done = complete(draft, picks, r, Completion(fill, np.ones(N_ACTION_TOKENS, dtype=bool)), bonus=False)
            state.tokens = done.tokens.tolist()
            state.accepted, state.drafted, state.rounds = done.accepted, N_ACTION_TOKENS, 1
            kf_filled = done.filled
        else:
            yield from speculate_to_end(ledger, state, r)
        return ledger.state_result(self.name, state, kf_filled=kf_filled, threshold=r)
