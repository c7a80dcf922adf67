"""What a step does with the target's picks of a verify pass: relaxed acceptance, the bonus token,
and the Kalman fill of a rejected suffix. Every decoder that accepts or fills applies them here.

Relaxed acceptance: draft token d_i is accepted when ``|d_i - target_i| <= r``, prefix-wise (the
accepted length is the first failure's index), and the draft token is kept. At the first rejection
the target's own pick there comes free with the same pass (the bonus token), and so does its pick
after the last proposed token when every one was accepted and tokens are still missing.

The fill: a filter's prediction of the whole action (:class:`Completion`: the joint-space Kalman
filter's, or the token-space filter of ``kerv_released``) completes the positions after the
accepted prefix (and the bonus) where it knows them. Checked (``fill_check``), a filled token more
than r from the target's pick at its position, which the same pass gave conditioned on the
proposal before it, gives way to that pick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from vla_accel_ros.models.tokenizer import ACTION_DIM as N_ACTION_TOKENS


class Completion(NamedTuple):
    """A filter's prediction of the action: its tokens (7,) and the positions it knows (7,) bool."""

    tokens: np.ndarray
    known: np.ndarray


def relaxed_accept_mask(
    draft: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray, r: float
) -> np.ndarray:
    """Prefix-wise acceptance: True up to (not including) the first |d - t| > r."""
    d = np.asarray(draft, dtype=np.int64)
    a = np.asarray(target, dtype=np.int64)
    if d.shape != a.shape:
        raise ValueError(f"draft {d.shape} and target argmax {a.shape} differ in shape")
    if not r >= 0:
        raise ValueError(f"acceptance threshold r must be >= 0, got {r}")
    return np.cumprod(np.abs(d - a) <= r).astype(bool)


def accepted_length(draft: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray, r: float) -> int:
    """Number of leading draft tokens accepted under threshold r: the length of
    :func:`relaxed_accept_mask`'s run of True, counted on plain ints (it runs on every verify pass)."""
    d, a = token_list(draft), token_list(target)
    if len(d) != len(a):
        raise ValueError(f"draft ({len(d)},) and target argmax ({len(a)},) differ in shape")
    if not r >= 0:
        raise ValueError(f"acceptance threshold r must be >= 0, got {r}")
    n = 0
    for proposed, picked in zip(d, a):
        if abs(proposed - picked) > r:
            break
        n += 1
    return n


def token_list(tokens: Sequence[int] | np.ndarray) -> list[int]:
    """Tokens (any sequence of ints, or an int array of any shape) as a flat list of Python ints."""
    return tokens.ravel().tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


@dataclass(frozen=True)
class Acceptance:
    """The verdict on a proposal: its ``accepted`` leading tokens, then ``bonus``, the target's pick
    at the first position not accepted (None when the accepted tokens leave nothing missing)."""

    accepted: int
    bonus: int | None


def accept(proposal: Sequence[int] | np.ndarray, picks: Sequence[int] | np.ndarray, r: float,
           missing: int) -> Acceptance:
    """Relaxed acceptance of ``proposal`` (n,) against ``picks`` (the target's pick at each proposal
    position and after the last) when ``missing`` tokens of the action are still to be decided."""
    n = len(proposal)
    accepted = accepted_length(proposal, picks[:n], r)
    return Acceptance(accepted, int(picks[accepted]) if accepted < missing else None)


def fill_suffix(tokens: Sequence[int] | np.ndarray, start: int,
                completion: Completion | None) -> tuple[np.ndarray, int]:
    """``tokens`` with the positions from ``start`` on that ``completion`` knows taken from it, and
    how many those are (0 without a completion: tokens unchanged)."""
    out = np.array(tokens, dtype=np.int64)
    if completion is None or start >= N_ACTION_TOKENS:
        return out, 0
    fill, known = completion
    positions = np.arange(start, N_ACTION_TOKENS)
    positions = positions[known[positions]]
    out[positions] = fill[positions]
    return out, len(positions)


def checked_fill(tokens: np.ndarray, target: np.ndarray, start: int, r: float) -> tuple[np.ndarray, int]:
    """``tokens`` with each position from ``start`` on that lies more than ``r`` from the target's
    pick there replaced by that pick; returns them and the number of positions kept."""
    out = np.array(tokens, dtype=np.int64)
    suffix = slice(start, N_ACTION_TOKENS)
    far = np.abs(out[suffix] - target[suffix]) > r
    out[suffix] = np.where(far, target[suffix], out[suffix])
    return out, int((~far).sum())


@dataclass(frozen=True)
class Completed:
    """A whole action from one verify pass: its ``tokens`` (7,), the proposal tokens ``accepted``,
    and the positions ``filled`` from the completion."""

    tokens: np.ndarray
    accepted: int
    filled: int


def complete(proposal: np.ndarray, picks: np.ndarray, r: float, completion: Completion | None, *,
             bonus: bool = True, check: bool = False) -> Completed:
    """The action from a proposal of all 7 tokens and the target's ``picks`` (7,) of its one pass:
    the accepted prefix, the bonus (unless ``bonus`` is False: the completion fills from the first
    rejection), the completion after them, checked against the picks with ``check``."""
    verdict = accept(proposal, picks, r, N_ACTION_TOKENS)
    tokens = np.array(proposal, dtype=np.int64)
    if verdict.bonus is None:
        return Completed(tokens, verdict.accepted, 0)
    start = verdict.accepted
    if bonus:
        tokens[start] = verdict.bonus
        start += 1
    tokens, filled = fill_suffix(tokens, start, completion)
    if check:
        tokens, kept = checked_fill(tokens, picks, start, r)
        filled = min(filled, kept)
    return Completed(tokens, verdict.accepted, filled)
