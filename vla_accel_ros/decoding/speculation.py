"""Speculative decoding's shared machinery: the pass ledger that asks for a step's passes and counts
and times them, and the draft/verify rounds (relaxed acceptance and the bonus: :mod:`.acceptor`).

The ledger's pass methods are generators, used with ``yield from`` inside a decoder's
:meth:`~vla_accel_ros.decoding.protocol.Decoder.step`: each yields its
:class:`~vla_accel_ros.decoding.protocol.TargetPass` and returns what the decoder reads of the
result (the target's picks, the extended prefix).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from vla_accel_ros.decoding.acceptor import accept
from vla_accel_ros.decoding.protocol import (
    MAX_TOKEN_ID,
    N_ACTION_TOKENS,
    DecodeContext,
    DecodeResult,
    PassResult,
    TargetPass,
)
from vla_accel_ros.models.api import (
    ParallelDrafting,
    PolicyLike,
    Prefix,
    SequentialDrafting,
    TokenScoring,
    as_parallel_drafting,
    as_sequential_drafting,
    as_token_scoring,
)
from vla_accel_ros.models.sampling import pick_tokens

Passes = Generator[TargetPass, PassResult, PassResult]


class PassLedger:
    """One step's passes: asks for them, counts them, and times the step on the context clock from
    its start (``decode`` excludes the wait for the prefill). The policy's capabilities a step uses
    (its action tokens, its draft heads) are asked for once, when the step first uses them: a flow
    or chunk policy's step, which only prefills, asks for none."""

    def __init__(self, policy: PolicyLike, context: DecodeContext) -> None:
        self.policy = policy
        self.clock = context.clock
        self.noise = context.token_noise  # the step's sampling noise: every token picked, drafted or verified, reads it
        self.started = self.clock()
        self.prefill_s = 0.0
        self.target_passes = 0
        self.draft_passes = 0
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.last_draft_s = 0.0
        self.last_verify_s = 0.0

    @cached_property
    def scoring(self) -> TokenScoring:
        return as_token_scoring(self.policy)

    @cached_property
    def sequential_drafting(self) -> SequentialDrafting:
        return as_sequential_drafting(self.policy)

    @cached_property
    def parallel_drafting(self) -> ParallelDrafting:
        return as_parallel_drafting(self.policy)

    # --- target passes ------------------------------------------------------------------------
    def prefill(self, given: Prefix | None = None) -> Passes:
        """The step's prefill (none when its caller gave the prefix, ``given``)."""
        if given is not None:
            return PassResult.alone(self.policy, given, None, 0.0)
        return (yield from self._prefill(TargetPass(())))

    def verify_in_prefill(self, tokens: Sequence[int] | np.ndarray) -> Generator[TargetPass, PassResult,
                                                                                  tuple[np.ndarray, PassResult]]:
        """The prefill with ``tokens`` riding along, which verifies them: one target pass; the
        target's pick (k+1,) at each position, and the pass."""
        result = yield from self._prefill(TargetPass.of(tokens))
        self.target_passes += 1
        return self.picks(result, 0), result

    def _prefill(self, request: TargetPass) -> Passes:
        asked = self.clock()
        result = yield request
        self.prefill_s += self.clock() - asked
        return result

    def score(self, prefix: Prefix, tokens: Sequence[int] | np.ndarray) -> Generator[TargetPass, PassResult,
                                                                                      tuple[np.ndarray, Prefix]]:
        """One target pass over ``tokens`` after ``prefix``: the target's pick (k+1,) at each
        position, and the extended prefix."""
        result = yield TargetPass.of(tokens, prefix)
        self.last_verify_s = result.seconds
        self.verify_s += result.seconds
        self.target_passes += 1
        return self.picks(result, prefix.n_tokens if self.noise is not None else 0), result.prefix

    def picks(self, result: PassResult, first: int) -> np.ndarray:
        """The target's pick (argmax, or sample) at each position of ``result``, the noise of its
        positions starting at action position ``first``."""
        if result.logits is None:
            raise RuntimeError("a prefill without tokens has no positions to pick from")
        return pick_tokens(result.logits[0], self.noise, first).cpu().numpy()

    # --- the draft head -----------------------------------------------------------------------
    def draft(
        self,
        prefix: Prefix,
        n: int,
        last_consumed: int | None = None,
        pending: int | None = None,
        parallel: bool = False,
    ) -> np.ndarray:
        """n draft tokens continuing ``prefix``, or continuing ``pending`` when a decided token is
        not in the prefix's cache yet.

        ``last_consumed`` is the last action token the prefix holds (None at the start of the
        action). The policy's first proposal is the target's own token at the prefix end, which
        is ``pending`` when there is one; the draft head then continues from it, so one more token
        is requested and the first dropped. ``parallel``: from the policy's parallel draft head
        (``draft_tokens_parallel``: one light call for all tokens); ``draft_passes`` still counts
        the tokens requested.
        """
        extra = 0 if pending is None else 1
        last = None if last_consumed is None else torch.tensor([int(last_consumed)], dtype=torch.long)
        propose = (self.parallel_drafting.draft_tokens_parallel if parallel
                   else self.sequential_drafting.draft_tokens)
        t0 = self.clock()
        tokens, _ = propose(prefix, n + extra, last, noise=self.noise)
        self.last_draft_s = self.clock() - t0
        self.draft_s += self.last_draft_s
        self.draft_passes += n + extra
        return tokens[0, extra:].detach().cpu().numpy()

    # --- the result ---------------------------------------------------------------------------
    def decode_ms(self) -> float:
        """The step's own time so far (ms): since its start, without the wait for the prefill."""
        return (self.clock() - self.started - self.prefill_s) * 1e3

    def result(
        self,
        name: str,
        tokens: Sequence[int] | np.ndarray,
        *,
        accepted_len: int,
        drafted: int,
        rounds: int,
        kf_filled: int,
        threshold: float | None,
        mode: str = "",
    ) -> DecodeResult:
        scoring = self.scoring
        toks = np.clip(np.asarray(tokens, dtype=np.int64), 0, MAX_TOKEN_ID)
        if toks.shape != (scoring.n_action_tokens,):
            raise RuntimeError(f"decoder {name} produced {toks.shape} tokens, expected ({scoring.n_action_tokens},)")
        action = scoring.tokenizer.decode_checked(toks)
        timings = {"draft": self.draft_s * 1e3, "verify": self.verify_s * 1e3, "decode": self.decode_ms()}
        return DecodeResult(
            action=action,
            tokens=toks,
            accepted_len=accepted_len,
            drafted=drafted,
            target_passes=self.target_passes,
            draft_passes=self.draft_passes,
            rounds=rounds,
            kf_filled=kf_filled,
            threshold=threshold,
            timings=timings,
            decoder=name,
            mode=mode,
        )

    def state_result(self, name: str, state: SpecState, *, kf_filled: int, threshold: float | None,
                     mode: str = "") -> DecodeResult:
        """:meth:`result` of speculative decoding: the tokens and counts ``state`` holds."""
        return self.result(name, state.tokens, accepted_len=state.accepted, drafted=state.drafted, rounds=state.rounds,
                           kf_filled=kf_filled, threshold=threshold, mode=mode)


@dataclass
class SpecState:
    """Progress of speculative decoding within one action.

    tokens: decided tokens so far. prefix: the target cache, holding all decided tokens except
    ``pending``, the last decided token (a bonus) that has not been fed to the target yet.
    consumed_last: the last token the cache holds (None while it holds none).
    """

    prefix: Prefix
    tokens: list[int] = field(default_factory=list)
    pending: int | None = None
    consumed_last: int | None = None
    accepted: int = 0
    drafted: int = 0
    rounds: int = 0

    @property
    def remaining(self) -> int:
        return N_ACTION_TOKENS - len(self.tokens)

    def take(self, draft: np.ndarray, accepted: int, bonus: int | None, prefix: Prefix) -> None:
        """Keep ``accepted`` draft tokens and the ``bonus`` after them (not in ``prefix``, the cache
        holding the decided tokens before it)."""
        self.tokens.extend(int(t) for t in draft[:accepted])
        self.prefix = prefix
        if accepted > 0:
            self.consumed_last = int(draft[accepted - 1])
        elif self.pending is not None:
            self.consumed_last = self.pending
        self.pending = bonus
        if bonus is not None:
            self.tokens.append(bonus)


Round = Generator[TargetPass, PassResult, None]


def speculate_to_end(ledger: PassLedger, state: SpecState, r: float) -> Round:
    """Relaxed speculative rounds, each drafting every remaining token, until all tokens exist."""
    while state.remaining > 0:
        yield from speculative_round(ledger, state, r)


def speculative_round(ledger: PassLedger, state: SpecState, r: float, n_draft: int | None = None,
                      parallel: bool = False) -> Round:
    """One draft/verify round with relaxed acceptance, advancing ``state`` in place.

    Drafts ``n_draft`` (default: all remaining) tokens (with the parallel head when ``parallel``),
    verifies them in one target pass (the pending bonus, if any, is fed first), keeps the accepted
    prefix, then appends the target's pick at the first rejection, or after the last draft token
    when all were accepted and tokens are still missing.
    """
    n = state.remaining if n_draft is None else max(1, min(n_draft, state.remaining))
    draft = ledger.draft(state.prefix, n, state.consumed_last, state.pending, parallel=parallel)
    offset = 0 if state.pending is None else 1
    feed = ([state.pending] if state.pending is not None else []) + [int(t) for t in draft]
    if n == state.remaining:  # the draft ends the action: its last token's output would predict an 8th
        feed = feed[:-1]
    picks, extended = yield from ledger.score(state.prefix, feed)
    verdict = accept(draft, picks[offset:], r, state.remaining)
    state.take(draft, verdict.accepted, verdict.bonus, extended.truncate(min(offset + verdict.accepted, len(feed))))
    state.accepted += verdict.accepted
    state.drafted += n
    state.rounds += 1
