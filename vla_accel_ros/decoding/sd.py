"""Speculative decoding with relaxed acceptance (the SpecVLA-style peer).

Each round drafts every remaining token, verifies them in one target pass and keeps the accepted
prefix plus the target's token at the first rejection; the rest gets another round, drafted from
the prefix truncated to what was accepted. With r = 0 this is exact speculative decoding and gives
the AR tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.protocol import DecodeContext, Decoder, DecodeResult
from vla_accel_ros.decoding.specs import SDConfig
from vla_accel_ros.decoding.speculation import speculate_to_end, start_speculation
from vla_accel_ros.models.api import PolicyLike


class SDDecoder(Decoder):
    spec = specs.SD

    def __init__(self, r: float = 9) -> None:
        self.config = SDConfig(r=r)

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult:
        started, ledger, state = start_speculation(policy, prefix, context)
        with torch.inference_mode():
            speculate_to_end(ledger, state, self.config.r)
        return ledger.state_result(self.name, state, kf_filled=0, threshold=self.config.r, started=started)
