"""Autoregressive decoding, the baseline: 7 sequential target passes, each picking its token greedily or,
with the step's sampling noise, as a sample (:mod:`vla_accel_ros.models.sampling`)."""

from __future__ import annotations

from typing import Any

import torch

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.protocol import (
    N_ACTION_TOKENS,
    DecodeContext,
    Decoder,
    DecodeResult,
)
from vla_accel_ros.decoding.speculation import PassLedger
from vla_accel_ros.models.api import PolicyLike


class ARDecoder(Decoder):
    """The first pass scores the bare prefix (k=0: the prefill's last hidden state, so only the LM
    head runs), each later one feeds the previous token (k=1) on the prefix extended so far."""

    spec = specs.AR

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult:
        started = context.clock()
        ledger = PassLedger(policy, context.clock, context.token_noise)
        with torch.inference_mode():
            argmax, _ = ledger.score(prefix, [])
            tokens = [int(argmax[0])]
            while len(tokens) < N_ACTION_TOKENS:
                argmax, prefix = ledger.score(prefix, [tokens[-1]])
                tokens.append(int(argmax[1]))
        return ledger.result(
            self.name, tokens, accepted_len=0, drafted=0, rounds=0, kf_filled=0, threshold=None, started=started
        )
