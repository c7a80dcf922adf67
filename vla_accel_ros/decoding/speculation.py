"""Speculative decoding's shared machinery: relaxed acceptance, the pass ledger that calls and counts the
policy's passes, and the draft/verify rounds.

Relaxed acceptance: draft token d_i is accepted when ``|d_i - target_i| <= r``, prefix-wise (the
accepted length is the first failure's index), and the draft token is kept. At the first rejection
the target's own token there comes free with the same verify pass (the bonus token). With sampling
(``DecodeContext.token_noise``) the target's token is its sample under the step's shared noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vla_accel_ros.decoding.protocol import (
    MAX_TOKEN_ID,
    N_ACTION_TOKENS,
    DecodeContext,
    DecodeResult,
)
from vla_accel_ros.models.api import PolicyLike
from vla_accel_ros.models.sampling import pick_tokens


# --- relaxed acceptance -----------------------------------------------------------------------
def relaxed_accept_mask(
    draft: Sequence[int] | np.ndarray, target_argmax: Sequence[int] | np.ndarray, r: float
) -> np.ndarray:
    """Prefix-wise acceptance: True up to (not including) the first |d - a| > r."""
    d = np.asarray(draft, dtype=np.int64)
    a = np.asarray(target_argmax, dtype=np.int64)
    if d.shape != a.shape:
        raise ValueError(f"draft {d.shape} and target argmax {a.shape} differ in shape")
    if not r >= 0:
        raise ValueError(f"acceptance threshold r must be >= 0, got {r}")
    return np.cumprod(np.abs(d - a) <= r).astype(bool)


def accepted_length(
    draft: Sequence[int] | np.ndarray, target_argmax: Sequence[int] | np.ndarray, r: float
) -> int:
    """Number of leading draft tokens accepted under threshold r: the length of
    :func:`relaxed_accept_mask`'s run of True, counted on plain ints (it runs on every verify pass)."""
    d, a = token_list(draft), token_list(target_argmax)
    if len(d) != len(a):
        raise ValueError(f"draft ({len(d)},) and target argmax ({len(a)},) differ in shape")
    if not r >= 0:
        raise ValueError(f"acceptance threshold r must be >= 0, got {r}")
    n = 0
    for proposed, target in zip(d, a):
        if abs(proposed - target) > r:
            break
        n += 1
    return n


def token_list(tokens: Sequence[int] | np.ndarray) -> list[int]:
    """Tokens (any sequence of ints, or an int array of any shape) as a flat list of Python ints."""
    return tokens.ravel().tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


# --- pass accounting --------------------------------------------------------------------------
class PassLedger:
    """Calls the policy, counts its passes and times them on the context clock."""

    def __init__(self, policy: PolicyLike, clock: Callable[[], float], noise: torch.Tensor | None = None) -> None:
        self.policy = policy
        self.clock = clock
        self.noise = noise  # the step's sampling noise: every token picked, drafted or verified, reads it
        self.target_passes = 0
        self.draft_passes = 0
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.last_draft_s = 0.0
        self.last_verify_s = 0.0

    def draft(
        self,
        prefix: Any,
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
        propose = self.policy.draft_tokens_parallel if parallel else self.policy.draft_tokens
        t0 = self.clock()
        tokens, _ = propose(prefix, n + extra, last, noise=self.noise)
        self.last_draft_s = self.clock() - t0
        self.draft_s += self.last_draft_s
        self.draft_passes += n + extra
        return tokens[0, extra:].detach().cpu().numpy()

    def score(self, prefix: Any, tokens: Sequence[int]) -> tuple[np.ndarray, Any]:
        """One target pass: the picked (argmax, or sampled) token (k+1,) at each position, and the
        extended prefix."""
        feed = torch.tensor([[int(t) for t in tokens]], dtype=torch.long)  # (1, k), k = 0 too
        t0 = self.clock()
        out = self.policy.score(prefix, feed)
        return self.record_pass(prefix, out, self.clock() - t0), out.prefix

    def record_pass(self, prefix: Any, scored: Any, seconds: float) -> np.ndarray:
        """Count one target pass over ``prefix`` that took ``seconds`` (made here, or by a caller
        that batched it with others) and pick its token (k+1,) at each position from ``scored``,
        a batch of one: the noise of its positions starts at the prefix's end."""
        self.last_verify_s = seconds
        self.verify_s += seconds
        self.target_passes += 1
        first = prefix.n_tokens if self.noise is not None else 0
        return pick_tokens(scored.logits[0], self.noise, first).cpu().numpy()

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
        started: float,
        mode: str = "",
    ) -> DecodeResult:
        toks = np.clip(np.asarray(tokens, dtype=np.int64), 0, MAX_TOKEN_ID)
        if toks.shape != (N_ACTION_TOKENS,):
            raise RuntimeError(f"decoder {name} produced {toks.shape} tokens, expected ({N_ACTION_TOKENS},)")
        action = self.policy.tokenizer.decode_checked(toks)
        timings = {"draft": self.draft_s * 1e3, "verify": self.verify_s * 1e3, "decode": (self.clock() - started) * 1e3}
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

    def state_result(
        self, name: str, state: SpecState, *, kf_filled: int, threshold: float | None, started: float
    ) -> DecodeResult:
        """:meth:`result` of speculative decoding: the tokens and counts ``state`` holds."""
        return self.result(
            name,
            state.tokens,
            accepted_len=state.accepted,
            drafted=state.drafted,
            rounds=state.rounds,
            kf_filled=kf_filled,
            threshold=threshold,
            started=started,
        )


@dataclass
class SpecState:
    """Progress of speculative decoding within one action.

    tokens: decided tokens so far. prefix: the target cache, holding all decided tokens except
    ``pending``, the last decided token (a bonus) that has not been fed to the target yet.
    consumed_last: the last token the cache holds (None while it holds none).
    """

    prefix: Any
    tokens: list[int] = field(default_factory=list)
    pending: int | None = None
    consumed_last: int | None = None
    accepted: int = 0
    drafted: int = 0
    rounds: int = 0

    @property
    def remaining(self) -> int:
        return N_ACTION_TOKENS - len(self.tokens)


def start_speculation(policy: PolicyLike, prefix: Any, context: DecodeContext) -> tuple[float, PassLedger, SpecState]:
    """The start of speculative decoding: the time on ``context.clock``, a ledger and a fresh state."""
    started = context.clock()
    return started, PassLedger(policy, context.clock, context.token_noise), SpecState(prefix=prefix)


def speculate_to_end(ledger: PassLedger, state: SpecState, r: float) -> None:
    """Relaxed speculative rounds, each drafting every remaining token, until all tokens exist."""
    while state.remaining > 0:
        speculative_round(ledger, state, r)


def speculative_round(
    ledger: PassLedger, state: SpecState, r: float, n_draft: int | None = None, parallel: bool = False
) -> tuple[np.ndarray, int]:
    """One draft/verify round with relaxed acceptance, advancing ``state`` in place.

    Drafts ``n_draft`` (default: all remaining) tokens (with the parallel head when ``parallel``),
    verifies them in one target pass (the pending bonus, if any, is fed first), keeps the accepted
    prefix, then appends the target's argmax at the first rejection, or after the last draft token
    when all were accepted and tokens are still missing. Returns (draft tokens, accepted count).
    """
    n = state.remaining if n_draft is None else max(1, min(n_draft, state.remaining))
    draft = ledger.draft(state.prefix, n, state.consumed_last, state.pending, parallel=parallel)
    offset = 0 if state.pending is None else 1
    feed = ([state.pending] if state.pending is not None else []) + [int(t) for t in draft]
    if n == state.remaining:  # the draft ends the action: its last token's output would predict an 8th
        feed = feed[:-1]
    argmax, extended = ledger.score(state.prefix, feed)
    n_acc = accepted_length(draft, argmax[offset : offset + n], r)
    state.tokens.extend(int(t) for t in draft[:n_acc])
    state.prefix = extended.truncate(min(offset + n_acc, len(feed)))
    if n_acc > 0:
        state.consumed_last = int(draft[n_acc - 1])
    elif state.pending is not None:
        state.consumed_last = state.pending
    state.accepted += n_acc
    state.drafted += n
    state.rounds += 1
    state.pending = None
    if state.remaining > 0:
        state.pending = int(argmax[offset + n_acc])
        state.tokens.append(state.pending)
    return draft, n_acc
