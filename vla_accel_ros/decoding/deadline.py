"""Deadline-aware decoding: as many draft/verify rounds as the control period still affords.

Policy, re-evaluated before every round on ``context.clock``:
1. budget = time left until the deadline (``context.time_left_s`` after the step started, so the
   prefill's time counts) minus a safety margin;
2. a round drafting n tokens costs ``n * draft_step + verify`` by running averages (exponential,
   weight ``ema``) of this decoder's own measured pass costs (optimistic 0 until first measured,
   unless priors are configured); with the policy's parallel draft head (``parallel_draft``, as in
   ``kerv``) one draft call proposes all n, so a round costs ``draft_call + verify`` whatever n;
3. if a round with at least one draft token fits, draft the largest affordable n (at most the
   tokens still missing), verify once with the kinematic threshold (as in ``kerv``), keep the
   accepted prefix and the target's bonus token, and go back to 1;
4. otherwise (out of time, or ``max_rounds`` used) the joint-space KF fills the missing positions;
   positions it cannot fill (no converged filter; the gripper without history) take draft tokens,
   the cheapest model output.
Without a deadline (``time_left_s`` None) this is relaxed speculative decoding with the kinematic r.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.acceptor import fill_suffix
from vla_accel_ros.decoding.kerv import KervDecoder, kf_completion_tokens
from vla_accel_ros.decoding.protocol import DecodeContext, Step
from vla_accel_ros.decoding.specs import DeadlineConfig, DecoderSpec, KervConfig
from vla_accel_ros.decoding.speculation import PassLedger, SpecState, speculative_round
from vla_accel_ros.models.api import PolicyLike, Prefix


class DeadlineDecoder(KervDecoder):
    spec: ClassVar[type[DecoderSpec]] = specs.Deadline
    config_type: ClassVar[type[KervConfig]] = DeadlineConfig
    config: DeadlineConfig

    def __init__(self, **cfg: Any) -> None:
        super().__init__(**cfg)
        self.draft_step_s: float | None = self.config.draft_step_s
        self.verify_s: float | None = self.config.verify_s
        self.draft_call_s: float | None = None  # one parallel draft call (any length), measured
        self.parallel = False  # whether the current policy drafts with its parallel head

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.config.ema) * old + self.config.ema * new

    def round_cost(self, n_draft: int) -> float:
        """Expected seconds of one round drafting n tokens (0 for costs not yet measured)."""
        draft = (self.draft_call_s or 0.0) if self.parallel else n_draft * (self.draft_step_s or 0.0)
        return draft + (self.verify_s or 0.0)

    def affordable_draft(self, budget_s: float, missing: int) -> int:
        """Largest draft length in 1..missing whose round fits the budget; 0 if none does."""
        for n in range(missing, 0, -1):
            if self.round_cost(n) <= budget_s:
                return n
        return 0

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        cfg = self.config
        clock = context.clock
        ledger = PassLedger(policy, context)
        deadline = math.inf if context.time_left_s is None else ledger.started + context.time_left_s
        prefill = yield from ledger.prefill(prefix)
        state = SpecState(prefill.prefix)
        kf_filled = 0
        self.parallel = self.uses_parallel_draft(policy)
        r = self.threshold(policy, prefill, context)
        while state.remaining > 0 and state.rounds < cfg.max_rounds:
            n = self.affordable_draft(deadline - clock() - cfg.margin_s, state.remaining)
            if n == 0:
                break
            yield from speculative_round(ledger, state, r, n, parallel=self.parallel)
            if self.parallel:
                self.draft_call_s = self._average(self.draft_call_s, ledger.last_draft_s)
            else:
                self.draft_step_s = self._average(self.draft_step_s, ledger.last_draft_s / n)
            self.verify_s = self._average(self.verify_s, ledger.last_verify_s)
        if state.remaining > 0:
            kf_filled = self._complete(ledger, state, policy, context)
        return ledger.state_result(self.name, state, kf_filled=kf_filled, threshold=r)

    def _complete(self, ledger: PassLedger, state: SpecState, policy: PolicyLike, context: DecodeContext) -> int:
        """Fill the missing positions: KF tokens where known, draft tokens elsewhere."""
        start = len(state.tokens)
        completion = kf_completion_tokens(policy, context)
        tokens = np.zeros(start + state.remaining, dtype=np.int64)
        tokens[:start] = state.tokens
        if completion is None or not completion.known[start:].all():
            tokens[start:] = ledger.draft(state.prefix, state.remaining, state.consumed_last, state.pending,
                                          parallel=self.parallel)
        tokens, filled = fill_suffix(tokens, start, completion)
        state.tokens = [int(t) for t in tokens]
        return filled
