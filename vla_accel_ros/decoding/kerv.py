"""Kinematic KERV: joint-space KF completion and a kinematics-driven threshold, one verify pass.

Per action: propose 7 tokens, verify them in ONE target pass, keep the relaxed-accepted prefix
(threshold r from :mod:`thresholds`), take the target's argmax at the first rejection (free from
the same pass) and fill every later position with the tokens of the action the joint-space Kalman
filter predicts for the next control period. There is never a second round.

Checked fill (``fill_check``): the same pass also gave the target's own pick at every later
position, conditioned on the proposal before it (the rejected token included). A KF token more
than r from that pick gives way to it; where they agree the KF's token stays. The fill then costs
nothing more and never strays more than r from what the target picks, which matters where the KF's
extrapolation is least right: at a grasp, at a change of direction, and on a model whose tokens the
KF predicts poorly. Off, the fill is the KF's alone, unverified.

Drafting: with a parallel draft head on the policy (``parallel_draft``, the default when the
policy has one) the proposal comes from ONE light call that proposes every position at once;
otherwise from the sequential EAGLE-style head, one step per token (``draft_tokens``).

Cheap drafting: two sources propose positions without the draft head, each only where its
tokens have lately agreed with the target (a running acceptance rate, measured for free on every
verify pass):
- the KF, where its rate is at least ``kf_trust``;
- the hold, the previous action's token, where its rate is at least ``hold_trust``. At the control
  rate the command stream is smooth, so the last token is often the next one: always on the axes
  the policy never moves, and on most steps on the others.
Where both qualify, the one with the higher rate proposes (the KF on a tie). The same single pass verifies every
proposal, so a cheap source costs acceptance, never correctness. When the cheap sources cover
every position, the draft head does not run at all, and the proposal costs only the target's own
first token. With the sequential head only the trailing run of cheap positions can go to them: a
later draft step reads the token proposed before it, so a cheap token in the middle would leave
the steps after it conditioned on a token that is not in the proposal. The parallel head's
proposals read nothing but the prefix end, so ANY trusted position (>= 1) can take a cheap token.

Verification inside the prefill (``prefill_verify``, on for ``world_aware`` in free space): the
cheap sources need no image, so their tokens are known before the prefill starts. Fed after the
observation prefix in the prefill's own pass (the policy's ``prefill_batch`` with the tokens), they are verified for 6
more rows of that pass instead of a pass of their own, and the decoding after the prefill is only
the acceptance test and the KF fill. The price: no draft head (it reads the prefix), and position
0 is a cheap token too, which the target may reject; the bonus and the KF fill then take over as
usual. Still exactly one verify pass per action, never a second round.

Decoding after the prefill is split around its one verify pass (``split_verify``):
:meth:`KervDecoder.propose_after_prefill` does everything before it (the proposal, the draft head
included), :meth:`KervDecoder.finish_verified` everything after it (acceptance, the running rates,
the KF fill), and ``decode`` runs the pass in between. A fleet makes that pass itself: one batched
``score`` verifies the proposals of all its robots that decode after the prefill.

The KF prediction is the TCP delta between the filtered joint configuration and its
constant-acceleration extrapolation one control period ahead (clamped to URDF limits); the gripper
is its last commanded value. Before the filter has converged (fewer than 3 measurements) or when
there is no filter, the suffix keeps the draft tokens — still one verify pass — and r is r_min,
since without a motion model nothing supports a loose threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.ar import ARDecoder
from vla_accel_ros.decoding.protocol import (
    N_ACTION_TOKENS,
    PREFILL_VERIFIED,
    DecodeContext,
    Decoder,
    DecoderCapabilities,
    DecodeResult,
    PendingVerify,
)
from vla_accel_ros.decoding.specs import KervConfig
from vla_accel_ros.decoding.speculation import PassLedger, accepted_length, token_list
from vla_accel_ros.decoding.thresholds import (
    N_CURVATURE_POINTS,
    KinematicSignals,
    fit_circle_radius,
    kinematic_threshold,
)
from vla_accel_ros.models.api import PolicyLike
from vla_accel_ros.models.sampling import pick_tokens

GRIPPER_INDEX = N_ACTION_TOKENS - 1


class TcpPositions:
    """TCP positions of measured joint configurations, each computed once: the curvature fit reads
    the last 5 at every step, 4 of which the step before already had (exact: a measurement's FK
    never changes). Keeps only the configurations of the latest call."""

    def __init__(self) -> None:
        self._kin: Any = None
        self._known: dict[bytes, np.ndarray] = {}

    def __call__(self, kin: Any, joint_positions: np.ndarray) -> np.ndarray:
        """(k, 3) TCP positions of ``joint_positions`` (k, n) under ``kin``."""
        if kin is not self._kin:
            self._kin, self._known = kin, {}
        keys = [q.tobytes() for q in joint_positions]
        points = [self._known[key] if key in self._known else kin.fk(q).position
                  for key, q in zip(keys, joint_positions)]
        self._known = dict(zip(keys, points))
        return np.array(points)


def kinematic_signals(context: DecodeContext, tcp_positions: TcpPositions | None = None) -> KinematicSignals | None:
    """Threshold inputs from the context's filter and joint history; None without a converged KF.
    ``tcp_positions`` keeps the FK of measurements across steps (a caller decoding a stream)."""
    kf = context.kalman
    if kf is None or not kf.converged:
        return None
    recent = context.joint_positions[-N_CURVATURE_POINTS:]
    if len(recent) and not np.isfinite(recent).all():
        recent = recent[np.isfinite(recent).all(axis=1)]
    radius = math.inf
    if len(recent) >= 3 and recent.shape[1] == kf.kin.n:
        radius = fit_circle_radius((tcp_positions or TcpPositions())(kf.kin, recent))
    return KinematicSignals(
        innovation=kf.innovation(),
        ee_acceleration=kf.ee_acceleration(),
        path_radius=radius,
        min_limit_margin=kf.kin.min_limit_margin(kf.q),
    )


def kf_completion_tokens(policy: PolicyLike, context: DecodeContext) -> tuple[np.ndarray, np.ndarray] | None:
    """Tokens of the KF-predicted next action and a mask of positions the filter actually knows
    (the gripper only when there is gripper history); None without a converged filter."""
    kf = context.kalman
    if kf is None or not kf.converged:
        return None
    action = kf.predict_action(context.control_period_s, context.gripper_history)
    if not np.isfinite(action).all():  # a filter fed absurd (finite but huge) joints: no prediction
        return None
    tokens = policy.tokenizer.encode_one(action)
    known = np.ones(N_ACTION_TOKENS, dtype=bool)
    known[GRIPPER_INDEX] = len(context.gripper_history) > 0
    return tokens, known


def complete_suffix(
    tokens: np.ndarray,
    start: int,
    policy: PolicyLike,
    context: DecodeContext,
    completion: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, int]:
    """Overwrite ``tokens[start:]`` with KF tokens where the filter knows them; returns the new
    tokens and the number of positions filled (0 when the filter cannot help: tokens unchanged).
    ``completion`` is :func:`kf_completion_tokens`'s result when the caller already has it."""
    out = np.array(tokens, dtype=np.int64)
    if completion is None:
        completion = kf_completion_tokens(policy, context)
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


def requested_length(kf_mask: np.ndarray | list[bool]) -> int:
    """Draft tokens to request when the KF proposes the positions in ``kf_mask`` (7,): up to the
    last position it does not (position 0 never is, so at least 1)."""
    flags = kf_mask.tolist() if isinstance(kf_mask, np.ndarray) else list(kf_mask)
    for i in range(len(flags) - 1, -1, -1):
        if not flags[i]:
            return i + 1
    raise ValueError("a cheap source proposes every position; position 0 is always the target's own")


class KervDecoder(Decoder):
    spec = specs.Kerv
    config_type: type[KervConfig] = KervConfig

    def __init__(self, **cfg: Any) -> None:
        self.config = self.config_type(**cfg)
        self.kf_acceptance = np.zeros(N_ACTION_TOKENS)  # running rate at which each KF token passes
        self.hold_acceptance = np.zeros(N_ACTION_TOKENS)  # the same for the previous action's tokens
        self.tcp_positions = TcpPositions()
        # what ``prefill_proposal`` computed for ``decode_scored`` of the same step: the KF
        # completion and the threshold
        self._proposed: tuple[tuple[np.ndarray, np.ndarray] | None, float] | None = None

    def capabilities(self) -> DecoderCapabilities:
        return DecoderCapabilities(verifies_in_prefill=self.config.prefill_verify, parallel_draft=self.config.parallel_draft,
                                   split_verify=True, fill_check=True)

    def uses_parallel_draft(self, policy: PolicyLike) -> bool:
        """Whether this decoder drafts with ``policy``'s parallel draft head."""
        return self.config.parallel_draft and policy.parallel_draft is not None

    def kf_draft_mask(self, completion: tuple[np.ndarray, np.ndarray] | None, parallel: bool = False) -> np.ndarray:
        """(7,) bool: the positions whose proposal is the KF's token, those it knows and has been
        reliable on (never position 0, the target's own token). With the sequential head only the
        trailing run of them (see the module docstring); with the parallel head (``parallel``) all."""
        return self.cheap_proposal(completion, None, parallel)[1]

    def cheap_proposal(
        self, completion: tuple[np.ndarray, np.ndarray] | None, hold: np.ndarray | None, parallel: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(tokens (7,), mask (7,) bool): the positions the cheap sources propose (the KF's
        ``completion``, the previous action's tokens ``hold``) and their tokens; at each position
        the source with the higher running rate (the KF on a tie), if that rate reaches its trust (never position 0,
        the target's own token). Sequential head: only the trailing run (the module docstring).
        Seven positions, once per step: plain Python lists, which cost less than NumPy's calls here."""
        cfg = self.config
        tokens = [0] * N_ACTION_TOKENS
        best = [-1.0] * N_ACTION_TOKENS  # the winning source's rate; -1 = no source
        sources = []
        if cfg.kf_draft and completion is not None:
            rates = self.kf_acceptance.tolist()
            known = completion[1].tolist()
            sources.append((completion[0].tolist(), [k and rate >= cfg.kf_trust for k, rate in zip(known, rates)], rates))
        if cfg.hold_draft and hold is not None:
            rates = self.hold_acceptance.tolist()
            sources.append((hold.tolist(), [rate >= cfg.hold_trust for rate in rates], rates))
        for source_tokens, trusted, rates in sources:
            for i in range(1, N_ACTION_TOKENS):
                if trusted[i] and rates[i] > best[i]:
                    tokens[i], best[i] = source_tokens[i], rates[i]
        mask = [rate >= 0.0 for rate in best]
        if not parallel:  # the trailing run only: nothing up to the last uncovered position
            uncovered = requested_length(mask)
            mask[:uncovered] = [False] * uncovered
        return np.array(tokens, dtype=np.int64), np.array(mask)

    def draft_length(self, completion: tuple[np.ndarray, np.ndarray] | None, parallel: bool = False,
                     hold: np.ndarray | None = None) -> int:
        """Tokens requested from the draft head (>= 1: the first is the target's own, free)."""
        return requested_length(self.cheap_proposal(completion, hold, parallel)[1])

    def update_kf_acceptance(self, kf_tokens: np.ndarray, argmax: np.ndarray, n_valid: int, r: float) -> None:
        """Score the KF's tokens against the target's argmax at positions 0..n_valid-1, whose
        argmax is conditioned on the prefix and accepted tokens alone."""
        update_rate(self.kf_acceptance, kf_tokens, argmax, n_valid, r, self.config.kf_rate_weight)

    def hold_allowed(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> bool:
        """Whether the previous action may draft at this step (always, for kerv)."""
        return True

    def prefill_allowed(self, policy: PolicyLike, context: DecodeContext) -> bool:
        """Whether this step's proposal may be verified inside the prefill (with ``prefill_verify``:
        always, for kerv). Decided before the prefill, so from the context alone."""
        return True

    def prefill_proposal(self, policy: PolicyLike, context: DecodeContext) -> np.ndarray | None:
        """With ``prefill_verify``, the 7 tokens for the prefill to verify (:func:`run_policy_step`),
        or None to decode after the prefill as usual. Every position, the first included, comes from
        a cheap source: the KF where its running rate is the higher, else the previous action
        (which the step needs, so never at an episode's first step)."""
        if not (self.config.prefill_verify and context.step > 0 and len(context.token_history)):
            return None
        if not self.prefill_allowed(policy, context):
            return None
        completion = kf_completion_tokens(policy, context)
        proposal = self.model_free_proposal(completion, context)
        # The threshold too, while the kinematics' code is warm: it needs no image either.
        self._proposed = (completion, self.threshold(policy, None, context))
        return proposal

    def model_free_proposal(self, completion: tuple[np.ndarray, np.ndarray] | None,
                            context: DecodeContext) -> np.ndarray:
        """All 7 tokens from the cheap sources: the KF's where its running rate is the higher, else
        the previous action's (so the step needs one: never an episode's first)."""
        proposal = np.array(context.token_history[-1], dtype=np.int64)
        if self.config.kf_draft and completion is not None:
            kf_leads = completion[1] & (self.kf_acceptance > self.hold_acceptance)
            proposal[kf_leads] = completion[0][kf_leads]
        return proposal

    def decode_scored(self, policy: PolicyLike, scored: Any, proposal: np.ndarray, context: DecodeContext) -> DecodeResult:
        """Finish an action whose ``proposal`` the prefill verified (``scored``: the prefix extended
        by it, and the target's logits at every position): keep the accepted prefix, the target's
        token at the first rejection and the KF's tokens after it. No target pass of its own; the
        prefill's counts as this action's one verify pass."""
        started = context.clock()
        ledger = PassLedger(policy, context.clock, context.token_noise)
        ledger.target_passes = 1  # the prefill's pass verified the proposal
        if self._proposed is None:
            raise RuntimeError("decode_scored needs this step's prefill_proposal first")
        (completion, r), self._proposed = self._proposed, None
        hold = context.token_history[-1]
        argmax = pick_tokens(scored.logits[0], context.token_noise, 0).cpu().numpy()
        n_acc = accepted_length(proposal, argmax, r)
        if completion is not None:
            self.update_kf_acceptance(completion[0], argmax, n_acc + 1, r)
        update_rate(self.hold_acceptance, hold, argmax, n_acc + 1, r, self.config.kf_rate_weight)
        self.after_prefill_verified(policy, scored.prefix, context)
        return self._finish(ledger, proposal, argmax, n_acc, r, policy, context, completion, started,
                            mode=PREFILL_VERIFIED)

    def after_prefill_verified(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> None:
        """What a prefill-verified step still reads from the prefix for later steps (kerv: nothing)."""

    def _finish(self, ledger: PassLedger, proposal: np.ndarray, argmax: np.ndarray, n_acc: int, r: float,
                policy: PolicyLike, context: DecodeContext, completion: tuple[np.ndarray, np.ndarray] | None,
                started: float, mode: str = "") -> DecodeResult:
        """The action from a verified proposal: its accepted prefix, the target's token at the first
        rejection (the bonus, free from the same pass) and the KF's tokens after it."""
        tokens, kf_filled = proposal.copy(), 0
        if n_acc < N_ACTION_TOKENS:
            tokens[n_acc] = argmax[n_acc]
            tokens, kf_filled = complete_suffix(tokens, n_acc + 1, policy, context, completion)
            if self.config.fill_check:
                tokens, kept = checked_fill(tokens, argmax, n_acc + 1, r)
                kf_filled = min(kf_filled, kept)
        return ledger.result(
            self.name,
            tokens,
            accepted_len=n_acc,
            drafted=N_ACTION_TOKENS,
            rounds=1,
            kf_filled=kf_filled,
            threshold=r,
            started=started,
            mode=mode,
        )

    def threshold(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> float:
        signals = kinematic_signals(context, self.tcp_positions)
        if signals is None:
            return float(self.config.r_min)
        return float(kinematic_threshold(signals, self.config.r_min, self.config.r_max))

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult:
        """:meth:`propose_after_prefill`, its verify pass, :meth:`finish_verified`."""
        pending = self.propose_after_prefill(policy, prefix, context)
        if isinstance(pending, DecodeResult):
            return pending
        with torch.inference_mode():
            t0 = context.clock()
            scored = policy.score(prefix, torch.tensor([pending.tokens.tolist()], dtype=torch.long))
            verify_s = context.clock() - t0
        return self.finish_verified(policy, pending, scored, context, verify_s)

    def propose_after_prefill(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> PendingVerify | DecodeResult:
        """The step up to its verify pass: the cheap sources' record cleared at an episode's start,
        the KF completion, the hold, the threshold and the proposal (the draft head's call
        included). A policy without a draft head at an episode's first step decodes token by token
        (``ar``): that step comes back finished."""
        started = context.clock()
        ledger = PassLedger(policy, context.clock, context.token_noise)
        if context.step == 0:  # a new episode: the cheap sources' record starts over
            self.kf_acceptance[:] = 0.0
            self.hold_acceptance[:] = 0.0
        completion = kf_completion_tokens(policy, context)
        hold = context.token_history[-1] if len(context.token_history) else None
        if not policy.capabilities().draft_head:
            if hold is None:
                return replace(ARDecoder().decode(policy, prefix, context), decoder=self.name, mode="first_step_ar")
            proposal = self.model_free_proposal(completion, context)
            with torch.inference_mode():
                r = self.threshold(policy, prefix, context)
        else:
            if hold is not None and not self.hold_allowed(policy, prefix, context):
                hold = None
            parallel = self.uses_parallel_draft(policy)
            cheap_tokens, cheap_mask = self.cheap_proposal(completion, hold, parallel)
            n_draft = requested_length(cheap_mask)
            with torch.inference_mode():
                r = self.threshold(policy, prefix, context)
                drafted = ledger.draft(prefix, n_draft, parallel=parallel)
            proposal = np.where(cheap_mask, cheap_tokens, np.concatenate([drafted, cheap_tokens[n_draft:]]))
        step = _KervStep(started, ledger, prefix, completion, hold, proposal, r)
        return PendingVerify(np.ascontiguousarray(proposal[: N_ACTION_TOKENS - 1], dtype=np.int64), step)

    def finish_verified(self, policy: PolicyLike, pending: PendingVerify, scored: Any, context: DecodeContext,
                        verify_s: float = 0.0) -> DecodeResult:
        """The action from the verify pass ``scored`` of :meth:`propose_after_prefill`'s proposal:
        the accepted prefix, the target's token at the first rejection and the KF's tokens after
        it; the cheap sources' running rates measured on it. One target pass, ``verify_s`` long."""
        step: _KervStep = pending.state
        ledger = step.ledger
        argmax = ledger.record_pass(step.prefix, scored, verify_s)
        n_acc = accepted_length(step.proposal, argmax, step.r)
        if step.completion is not None:
            self.update_kf_acceptance(step.completion[0], argmax, n_acc + 1, step.r)
        if step.hold is not None:
            update_rate(self.hold_acceptance, step.hold, argmax, n_acc + 1, step.r, self.config.kf_rate_weight)
        return self._finish(ledger, step.proposal, argmax, n_acc, step.r, policy, context, step.completion,
                            step.started)


@dataclass(frozen=True, eq=False)
class _KervStep:
    """What :meth:`KervDecoder.propose_after_prefill` leaves for ``finish_verified``."""

    started: float  # on the context clock
    ledger: PassLedger
    prefix: Any  # the prefix the proposal is verified after
    completion: tuple[np.ndarray, np.ndarray] | None
    hold: np.ndarray | None  # the previous action's tokens, where they may draft
    proposal: np.ndarray  # (7,)
    r: float


def update_rate(rate: np.ndarray, proposed: np.ndarray, argmax: np.ndarray, n_valid: int, r: float,
                weight: float) -> None:
    """Update a source's running acceptance ``rate`` (7,) in place with its ``proposed`` tokens
    against the target's at positions 0..n_valid-1 (exponential average, newest weight ``weight``)."""
    values, proposed_list, target_list = rate.tolist(), token_list(proposed), token_list(argmax)
    for i in range(min(n_valid, N_ACTION_TOKENS)):
        hit = float(abs(proposed_list[i] - target_list[i]) <= r)
        values[i] = (1 - weight) * values[i] + weight * hit
    rate[:] = values

