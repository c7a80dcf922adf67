"""Autoregressive decoding, the baseline: 7 sequential target passes, each picking its token greedily or,
with the step's sampling noise, as a sample (:mod:`vla_accel_ros.models.sampling`)."""

from __future__ import annotations

from collections.abc import Generator

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.protocol import (
    DecodeContext,
    Decoder,
    PassResult,
    Step,
    TargetPass,
)
from vla_accel_ros.decoding.speculation import PassLedger
from vla_accel_ros.models.api import PolicyLike, Prefix


def autoregressive(ledger: PassLedger, prefix: Prefix) -> Generator[TargetPass, PassResult, list[int]]:
    """The action token by token after ``prefix``: the first pass scores the bare prefix (k=0: the
    prefill's last hidden state, so only the LM head runs), each later one feeds the previous token
    (k=1) on the prefix extended so far."""
    width = ledger.scoring.n_action_tokens
    picks, _ = yield from ledger.score(prefix, [])
    tokens = [int(picks[0])]
    while len(tokens) < width:
        picks, prefix = yield from ledger.score(prefix, [tokens[-1]])
        tokens.append(int(picks[1]))
    return tokens


class ARDecoder(Decoder):
    spec = specs.AR

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        ledger = PassLedger(policy, context)
        prefill = yield from ledger.prefill(prefix)
        tokens = yield from autoregressive(ledger, prefill.prefix)
        return ledger.result(self.name, tokens, accepted_len=0, drafted=0, rounds=0, kf_filled=0, threshold=None)
