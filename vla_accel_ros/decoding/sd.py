"""Speculative decoding with relaxed acceptance (the SpecVLA-style peer).

Each round drafts every remaining token, verifies them in one target pass and keeps the accepted
prefix plus the target's token at the first rejection; the rest gets another round, drafted from
the prefix truncated to what was accepted. With r = 0 this is exact speculative decoding and gives
the AR tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vla_accel_ros.decoding.base import (
    DecodeContext,
    DecodeResult,
    PassLedger,
    PolicyLike,
    SpecState,
    speculative_round,
)


@dataclass(frozen=True)
class SDConfig:
    r: float = 9

    def __post_init__(self) -> None:
        if not self.r >= 0:
            raise ValueError(f"SDConfig.r (acceptance threshold in bins) must be >= 0, got {self.r}")


class SDDecoder:
    name = "sd"

    def __init__(self, r: float = 9) -> None:
        self.config = SDConfig(r=r)

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult:
        started = context.clock()
        ledger = PassLedger(policy, context.clock)
        state = SpecState(prefix=prefix)
        with torch.inference_mode():
            while state.remaining > 0:
                speculative_round(ledger, state, self.config.r)
        return ledger.result(
            self.name,
            state.tokens,
            accepted_len=state.accepted,
            drafted=state.drafted,
            rounds=state.rounds,
            kf_filled=0,
            threshold=self.config.r,
            started=started,
        )
