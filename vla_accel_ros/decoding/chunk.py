"""``chunk``: the chunk a policy's own prefill predicted, for a policy that has no action tokens
(OpenVLA-OFT's parallel decoding, ``capabilities().action_chunk``). The prefill is the one pass;
the step reads its chunk and hands every action of it to the controller's queue, as a chunked flow
head's step does (``DecodeResult.chunk``, ``action`` its first). The tokens reported are the first
action's bins, for bookkeeping only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.protocol import N_ACTION_TOKENS, DecodeContext, Decoder, Step, model_free_result
from vla_accel_ros.decoding.specs import DecoderSpec
from vla_accel_ros.decoding.speculation import PassLedger
from vla_accel_ros.models.api import PolicyLike, Prefix, as_chunk_predicting


class ChunkDecoder(Decoder):
    spec: ClassVar[type[DecoderSpec]] = specs.Chunk

    def check_policy(self, policy: PolicyLike) -> list[str]:
        warnings = super().check_policy(policy)
        width = int(policy.config.n_action_tokens)
        if width != N_ACTION_TOKENS:
            raise ValueError(f"decoder '{self.name}': the controller executes {N_ACTION_TOKENS}-D actions, this "
                             f"policy's are {width}-D (vla-accel predict runs it)")
        return warnings

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        self.check_policy(policy)
        ledger = PassLedger(policy, context)
        predicting = as_chunk_predicting(policy)
        prefill = yield from ledger.prefill(prefix)
        chunk = predicting.action_chunk(prefill.prefix)
        tokens = predicting.chunk_tokens(prefill.prefix)
        result = model_free_result(self.name, chunk[0], tokens, {"decode": ledger.decode_ms()})
        return replace(result, chunk=chunk) if len(chunk) > 1 else result
