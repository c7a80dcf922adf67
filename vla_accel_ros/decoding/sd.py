"""Speculative decoding with relaxed acceptance (the SpecVLA-style peer).

Each round drafts every remaining token, verifies them in one target pass and keeps the accepted
prefix plus the target's token at the first rejection; the rest gets another round, drafted from
the prefix truncated to what was accepted. With r = 0 this is exact speculative decoding and gives
the AR tokens.
"""

from __future__ import annotations

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.protocol import DecodeContext, Decoder, Step
from vla_accel_ros.decoding.specs import SDConfig
from vla_accel_ros.decoding.speculation import PassLedger, SpecState, speculate_to_end
from vla_accel_ros.models.api import PolicyLike, Prefix


class SDDecoder(Decoder):
    spec = specs.SD

    def __init__(self, r: float = 9) -> None:
        self.config = SDConfig(r=r)

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        ledger = PassLedger(policy, context)
        prefill = yield from ledger.prefill(prefix)
        state = SpecState(prefill.prefix)
        yield from speculate_to_end(ledger, state, self.config.r)
        return ledger.state_result(self.name, state, kf_filled=0, threshold=self.config.r)
