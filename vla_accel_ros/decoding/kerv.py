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
cheap sources need no image, so their tokens are known before the prefill starts. The step asks for
the prefill with them riding along after the observation prefix, so they are verified by 6 more
rows of that pass instead of a pass of their own, and the decoding after the prefill is only the
acceptance test and the KF fill. The price: no draft head (it reads the prefix), and position 0 is a
cheap token too, which the target may reject; the bonus and the KF fill then take over as usual.
Still exactly one verify pass per action, never a second round.

Otherwise the step asks for a plain prefill, proposes after it (the draft head included) and asks
for the one verify pass; a fleet makes that pass for all its robots that ask for it at once.

The KF prediction is the TCP delta between the filtered joint configuration and its
constant-acceleration extrapolation one control period ahead (clamped to URDF limits); the gripper
is its last commanded value. Before the filter has converged (fewer than 3 measurements) or when
there is no filter, the suffix keeps the draft tokens — still one verify pass — and r is r_min,
since without a motion model nothing supports a loose threshold.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.acceptor import Completed, Completion, complete, token_list
from vla_accel_ros.decoding.ar import autoregressive
from vla_accel_ros.decoding.protocol import (
    N_ACTION_TOKENS,
    PREFILL_VERIFIED,
    DecodeContext,
    Decoder,
    DecodeResult,
    PassResult,
    Step,
)
from vla_accel_ros.decoding.specs import DecoderSpec, KervConfig
from vla_accel_ros.decoding.speculation import PassLedger
from vla_accel_ros.decoding.thresholds import (
    N_CURVATURE_POINTS,
    KinematicSignals,
    fit_circle_radius,
    kinematic_threshold,
)
from vla_accel_ros.models.api import PolicyLike, Prefix, as_token_scoring

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


def kf_completion_tokens(policy: PolicyLike, context: DecodeContext) -> Completion | None:
    """Tokens of the KF-predicted next action and a mask of positions the filter actually knows
    (the gripper only when there is gripper history); None without a converged filter."""
    kf = context.kalman
    if kf is None or not kf.converged:
        return None
    action = kf.predict_action(context.control_period_s, context.gripper_history)
    if not np.isfinite(action).all():  # a filter fed absurd (finite but huge) joints: no prediction
        return None
    tokens = as_token_scoring(policy).tokenizer.encode_one(action)
    known = np.ones(N_ACTION_TOKENS, dtype=bool)
    known[GRIPPER_INDEX] = len(context.gripper_history) > 0
    return Completion(tokens, known)


def requested_length(kf_mask: np.ndarray | list[bool]) -> int:
    """Draft tokens to request when the KF proposes the positions in ``kf_mask`` (7,): up to the
    last position it does not (position 0 never is, so at least 1)."""
    flags = kf_mask.tolist() if isinstance(kf_mask, np.ndarray) else list(kf_mask)
    for i in range(len(flags) - 1, -1, -1):
        if not flags[i]:
            return i + 1
    raise ValueError("a cheap source proposes every position; position 0 is always the target's own")


class KervDecoder(Decoder):
    spec: ClassVar[type[DecoderSpec]] = specs.Kerv
    config_type: ClassVar[type[KervConfig]] = KervConfig

    def __init__(self, **cfg: Any) -> None:
        self.config = self.config_type(**cfg)
        self.kf_acceptance = np.zeros(N_ACTION_TOKENS)  # running rate at which each KF token passes
        self.hold_acceptance = np.zeros(N_ACTION_TOKENS)  # the same for the previous action's tokens
        self.tcp_positions = TcpPositions()

    def uses_parallel_draft(self, policy: PolicyLike) -> bool:
        """Whether this decoder drafts with ``policy``'s parallel draft head."""
        return self.config.parallel_draft and policy.capabilities().parallel_draft_head

    def kf_draft_mask(self, completion: Completion | None, parallel: bool = False) -> np.ndarray:
        """(7,) bool: the positions whose proposal is the KF's token, those it knows and has been
        reliable on (never position 0, the target's own token). With the sequential head only the
        trailing run of them (see the module docstring); with the parallel head (``parallel``) all."""
        return self.cheap_proposal(completion, None, parallel)[1]

    def cheap_proposal(
        self, completion: Completion | None, hold: np.ndarray | None, parallel: bool = False
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
            trusted = [k and rate >= cfg.kf_trust for k, rate in zip(known, rates)]
            sources.append((completion[0].tolist(), trusted, rates))
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

    def draft_length(self, completion: Completion | None, parallel: bool = False,
                     hold: np.ndarray | None = None) -> int:
        """Tokens requested from the draft head (>= 1: the first is the target's own, free)."""
        return requested_length(self.cheap_proposal(completion, hold, parallel)[1])

    def update_kf_acceptance(self, kf_tokens: np.ndarray, argmax: np.ndarray, n_valid: int, r: float) -> None:
        """Score the KF's tokens against the target's argmax at positions 0..n_valid-1, whose
        argmax is conditioned on the prefix and accepted tokens alone."""
        update_rate(self.kf_acceptance, kf_tokens, argmax, n_valid, r, self.config.kf_rate_weight)

    def hold_allowed(self, policy: PolicyLike, prefill: PassResult, context: DecodeContext) -> bool:
        """Whether the previous action may draft at this step (always, for kerv)."""
        return True

    def prefill_allowed(self, policy: PolicyLike, context: DecodeContext) -> bool:
        """Whether this step's proposal may be verified inside the prefill (with ``prefill_verify``:
        always, for kerv). Decided before the prefill, so from the context alone."""
        return True

    def model_free_proposal(self, completion: Completion | None, context: DecodeContext) -> np.ndarray:
        """All 7 tokens from the cheap sources: the KF's where its running rate is the higher, else
        the previous action's (so the step needs one: never an episode's first)."""
        proposal = np.array(context.token_history[-1], dtype=np.int64)
        if self.config.kf_draft and completion is not None:
            kf_leads = completion[1] & (self.kf_acceptance > self.hold_acceptance)
            proposal[kf_leads] = completion[0][kf_leads]
        return proposal

    def threshold(self, policy: PolicyLike, prefill: PassResult | None, context: DecodeContext) -> float:
        """The acceptance threshold r of this step; ``prefill`` None: decided before the prefill."""
        signals = kinematic_signals(context, self.tcp_positions)
        if signals is None:
            return float(self.config.r_min)
        return float(kinematic_threshold(signals, self.config.r_min, self.config.r_max))

    def after_prefill_verified(self, policy: PolicyLike, prefill: PassResult, context: DecodeContext) -> None:
        """What a prefill-verified step still reads from its prefill for later steps (kerv: nothing)."""

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        """The cheap sources' record cleared at an episode's start; then, with ``prefill_verify`` and
        a previous action (and where :meth:`prefill_allowed`), the cheap sources' 7 tokens verified
        inside the prefill; otherwise a proposal after a plain prefill and its one verify pass."""
        ledger = PassLedger(policy, context)
        if context.step == 0:  # a new episode: the cheap sources' record starts over
            self.kf_acceptance[:] = 0.0
            self.hold_acceptance[:] = 0.0
        if (prefix is None and self.config.prefill_verify and context.step > 0 and len(context.token_history)
                and self.prefill_allowed(policy, context)):
            return (yield from self._verify_in_prefill(ledger, policy, context))
        prefill = yield from ledger.prefill(prefix)
        return (yield from self._verify_after_prefill(ledger, policy, context, prefill))

    def _verify_in_prefill(self, ledger: PassLedger, policy: PolicyLike, context: DecodeContext) -> Step:
        """Every position, the first included, from a cheap source (the KF where its running rate is
        the higher, else the previous action), verified by the prefill: no target pass of its own."""
        completion = kf_completion_tokens(policy, context)
        proposal = self.model_free_proposal(completion, context)
        r = self.threshold(policy, None, context)  # needs no image either
        # The last proposed token is not fed: its output would predict an 8th token.
        picks, prefill = yield from ledger.verify_in_prefill(proposal[: N_ACTION_TOKENS - 1])
        done = self._judge(proposal, picks, r, completion, context.token_history[-1])
        self.after_prefill_verified(policy, prefill, context)
        return self._result(ledger, done, r, PREFILL_VERIFIED)

    def _verify_after_prefill(self, ledger: PassLedger, policy: PolicyLike, context: DecodeContext,
                              prefill: PassResult) -> Step:
        """The KF completion, the hold, the threshold and the proposal (the draft head's call
        included), then its verify pass. A policy without a draft head at an episode's first step
        decodes token by token (``ar``)."""
        prefix = prefill.prefix
        completion = kf_completion_tokens(policy, context)
        hold = context.token_history[-1] if len(context.token_history) else None
        if not policy.capabilities().draft_head:
            if hold is None:
                tokens = yield from autoregressive(ledger, prefix)
                return ledger.result(self.name, tokens, accepted_len=0, drafted=0, rounds=0, kf_filled=0,
                                     threshold=None, mode="first_step_ar")
            proposal = self.model_free_proposal(completion, context)
            r = self.threshold(policy, prefill, context)
        else:
            if hold is not None and not self.hold_allowed(policy, prefill, context):
                hold = None
            parallel = self.uses_parallel_draft(policy)
            cheap_tokens, cheap_mask = self.cheap_proposal(completion, hold, parallel)
            n_draft = requested_length(cheap_mask)
            r = self.threshold(policy, prefill, context)
            drafted = ledger.draft(prefix, n_draft, parallel=parallel)
            proposal = np.where(cheap_mask, cheap_tokens, np.concatenate([drafted, cheap_tokens[n_draft:]]))
        picks, _ = yield from ledger.score(prefix, proposal[: N_ACTION_TOKENS - 1])
        return self._result(ledger, self._judge(proposal, picks, r, completion, hold), r)

    def _judge(self, proposal: np.ndarray, picks: np.ndarray, r: float, completion: Completion | None,
               hold: np.ndarray | None) -> Completed:
        """The action from the verify pass's ``picks`` (the acceptor: accepted prefix, bonus, KF
        fill, checked with ``fill_check``), and the cheap sources' running rates measured on it."""
        done = complete(proposal, picks, r, completion, check=self.config.fill_check)
        if completion is not None:
            self.update_kf_acceptance(completion[0], picks, done.accepted + 1, r)
        if hold is not None:
            update_rate(self.hold_acceptance, hold, picks, done.accepted + 1, r, self.config.kf_rate_weight)
        return done

    def _result(self, ledger: PassLedger, done: Completed, r: float, mode: str = "") -> DecodeResult:
        return ledger.result(self.name, done.tokens, accepted_len=done.accepted, drafted=N_ACTION_TOKENS, rounds=1,
                             kf_filled=done.filled, threshold=r, mode=mode)


def update_rate(rate: np.ndarray, proposed: np.ndarray, argmax: np.ndarray, n_valid: int, r: float,
                weight: float) -> None:
    """Update a source's running acceptance ``rate`` (7,) in place with its ``proposed`` tokens
    against the target's at positions 0..n_valid-1 (exponential average, newest weight ``weight``)."""
    values, proposed_list, target_list = rate.tolist(), token_list(proposed), token_list(argmax)
    for i in range(min(n_valid, N_ACTION_TOKENS)):
        hit = float(abs(proposed_list[i] - target_list[i]) <= r)
        values[i] = (1 - weight) * values[i] + weight * hit
    rate[:] = values
