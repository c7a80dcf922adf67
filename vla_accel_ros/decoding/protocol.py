"""The decoder contract: a step proposes, the runner makes the target's passes.

A decoder turns one observation into the 7 action tokens of one control step. Its
:meth:`Decoder.step` is a generator: it yields each target forward pass it needs
(:class:`TargetPass`), receives what the pass gave (:class:`PassResult`), and returns the
:class:`DecodeResult`. The first pass it yields is the prefill of the step's observation, with
any tokens it wants verified riding along (k >= 0; ``world_aware`` in free space); every later
one scores k tokens after a prefix. A step served without any model pass (``heisd``'s
verify-skip) returns before yielding. Whoever drives the step makes the passes: the runtime
(:mod:`vla_accel_ros.runtime.steps`) batches them over robots where the policy can, and
:meth:`Decoder.decode` makes them one by one after a prefill its caller made. The draft head, the
contact head and the Kalman filter are the decoder's own: they are not target passes.

What a step does with a verify pass's picks (relaxed acceptance, the bonus token, the Kalman fill)
is :mod:`.acceptor`'s; counting and timing its passes is :class:`.speculation.PassLedger`'s.
With sampling (``DecodeContext.token_noise``, :mod:`vla_accel_ros.models.sampling`) the target's
pick is its sample under the step's shared noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeAlias

import numpy as np
import torch

from vla_accel_ros.models.api import PolicyLike, Prefix, as_contact_sensing, as_token_scoring
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS

if TYPE_CHECKING:
    from vla_accel_ros.core.kalman import JointKalmanFilter
    from vla_accel_ros.decoding.specs import DecoderSpec

N_ACTION_TOKENS = ACTION_DIM  # the tokens of one action: one per action dimension
PREFILL_VERIFIED = "prefill_verified"  # DecodeResult.mode of an action whose proposal the prefill verified
MAX_TOKEN_ID = 254  # 256 bin edges give 255 bins: ids 0..254 (255 is never emitted)


@dataclass(frozen=True, eq=False)
class DecodeContext:
    """Everything besides the observation that a decoder may use at one control step.

    joint_positions: (H, n) recent measured arm joint positions, oldest first (may be empty).
    joint_stamps: (H,) their times in seconds (or empty).
    kalman: the joint-space filter, already fed with the measurements (or None).
    step / max_steps: control step index in the episode and the episode step limit.
    control_period_s: the node's fixed control period; the action is the TCP delta over it.
    time_left_s: seconds left in the control period when the step starts (None = no deadline).
    gripper_history: previous gripper action values (policy action space, 1 = open), oldest first.
    target_clearance: gripper-to-target distance (m) from the scene, None on a real robot.
    token_history: (S, 7) action tokens of the episode's previous steps (its last max_steps), oldest first.
    clock: seconds, monotonic; every timing and deadline decision reads it.
    token_noise: (7, 256) this step's sampling noise (:mod:`vla_accel_ros.models.sampling`); None = greedy.
    """

    joint_positions: np.ndarray = field(default_factory=lambda: np.zeros((0, 7)))
    joint_stamps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    kalman: JointKalmanFilter | None = None
    step: int = 0
    max_steps: int = 120
    control_period_s: float = 0.05
    time_left_s: float | None = None
    gripper_history: Sequence[float] = ()
    target_clearance: float | None = None
    token_history: np.ndarray = field(default_factory=lambda: np.zeros((0, N_ACTION_TOKENS), dtype=np.int64))
    clock: Callable[[], float] = time.perf_counter
    token_noise: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.token_noise is not None and tuple(self.token_noise.shape) != (N_ACTION_TOKENS, N_BINS):
            raise ValueError(f"DecodeContext.token_noise must be ({N_ACTION_TOKENS}, {N_BINS}), "
                             f"got {tuple(self.token_noise.shape)}")
        q = np.asarray(self.joint_positions, dtype=float)
        if q.ndim != 2:
            raise ValueError(f"DecodeContext.joint_positions must be (H, n), got shape {q.shape}")
        stamps = np.asarray(self.joint_stamps, dtype=float).reshape(-1)
        if stamps.shape not in ((len(q),), (0,)):
            raise ValueError(f"DecodeContext.joint_stamps has shape {stamps.shape}, expected ({len(q)},) or (0,)")
        tokens = np.asarray(self.token_history, dtype=np.int64)
        if tokens.size % N_ACTION_TOKENS:
            raise ValueError(f"DecodeContext.token_history must be (S, {N_ACTION_TOKENS}), got shape {tokens.shape}")
        if self.step < 0:
            raise ValueError(f"DecodeContext.step must be >= 0, got {self.step}")
        if self.max_steps <= 0:
            raise ValueError(f"DecodeContext.max_steps must be > 0, got {self.max_steps}")
        if not (np.isfinite(self.control_period_s) and self.control_period_s > 0):
            raise ValueError(f"DecodeContext.control_period_s must be > 0, got {self.control_period_s}")
        if self.time_left_s is not None and np.isnan(self.time_left_s):
            raise ValueError("DecodeContext.time_left_s is NaN; pass None for 'no deadline'")
        if self.target_clearance is not None and np.isnan(self.target_clearance):
            raise ValueError("DecodeContext.target_clearance is NaN; pass None when unknown")
        object.__setattr__(self, "joint_positions", q)
        object.__setattr__(self, "joint_stamps", stamps)
        object.__setattr__(self, "token_history", tokens.reshape(-1, N_ACTION_TOKENS))
        object.__setattr__(self, "gripper_history", tuple(float(g) for g in self.gripper_history))


@dataclass(frozen=True, eq=False)
class DecodeResult:
    """One control step's decoding.

    action / tokens: (7,) action at the tokens' bin centres, and the tokens.
    accepted_len: draft tokens accepted, summed over verify rounds.
    drafted: draft tokens proposed for verification (accepted_len / drafted = acceptance rate).
    target_passes: target forward passes after the prefill, and the prefill's when it verified a proposal.
    draft_passes: tokens requested from the draft head (each at most one light draft-layer step).
    rounds: draft/verify rounds (AR: 0).
    kf_filled: positions filled by a Kalman completion (joint-space or token-space).
    threshold: the acceptance threshold r used (None for AR).
    timings: milliseconds; draft, verify, decode (the decoder's own time before and after the
        prefill, its later passes included) and, from the runtime, prefill (the prefill pass) and
        total (the whole step).
    """

    action: np.ndarray
    tokens: np.ndarray
    accepted_len: int
    drafted: int
    target_passes: int
    draft_passes: int
    rounds: int
    kf_filled: int
    threshold: float | None
    timings: dict[str, float]
    decoder: str = ""
    vision_fraction: float = 1.0  # share of image patches the local vision encoder recomputed
    mode: str = ""  # which path produced the action, for decoders with several (heisd: drafter/retrieval/skip)
    chunk: np.ndarray | None = None  # (H, 7) a chunked head's actions for H steps, ``action`` the first


def model_free_result(
    name: str, action: np.ndarray, tokens: np.ndarray, timings: dict[str, float], mode: str = ""
) -> DecodeResult:
    """The result of decoder ``name`` for an action made without any target or draft pass (a flow
    head's sample, a queued retrieved action): every pass and acceptance counter 0 and no threshold,
    so these steps add nothing to acceptance statistics; draft and verify time 0, then ``timings``."""
    return DecodeResult(action=action, tokens=tokens, accepted_len=0, drafted=0, target_passes=0, draft_passes=0,
                        rounds=0, kf_filled=0, threshold=None, timings={"draft": 0.0, "verify": 0.0, **timings},
                        decoder=name, mode=mode)


# --- passes -----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TargetPass:
    """One target forward pass a step asks for: the action ``tokens`` (k >= 0) after ``prefix``, or,
    with ``prefix`` None, the prefill of the step's observation with the tokens riding along."""

    tokens: tuple[int, ...]
    prefix: Prefix | None = None

    @classmethod
    def of(cls, tokens: Sequence[int] | np.ndarray, prefix: Prefix | None = None) -> TargetPass:
        return cls(tuple(int(t) for t in tokens), prefix)


@dataclass(eq=False)
class PassResult:
    """What a :class:`TargetPass` gave, as a batch of one.

    prefix: the pass's prefix extended by its tokens. logits: (1, k+1, n_bins), ``logits[:, i]``
    the next-token distribution after the first i tokens; None for a prefill without tokens (no
    decoder reads its end: the first token is a pass of its own). seconds: the pass's time (a
    batched pass's time is each robot's). ``contact_probability()`` reads the contact head on the
    prefix once; after a batched prefill the first row to ask reads it for every row at once.
    """

    prefix: Prefix
    logits: torch.Tensor | None
    seconds: float
    read_contact: Callable[[], float]
    _contact: float | None = field(default=None, init=False, repr=False)

    @classmethod
    def alone(cls, policy: PolicyLike, prefix: Prefix, logits: torch.Tensor | None, seconds: float) -> PassResult:
        """A pass of this robot's alone: the contact head, when the policy declares one, reads its
        own prefix."""
        if not policy.capabilities().contact_head:
            return cls(prefix, logits, seconds, no_contact_head)
        return cls(prefix, logits, seconds, partial(as_contact_sensing(policy).contact_probability, prefix))

    def contact_probability(self) -> float:
        if self._contact is None:
            self._contact = self.read_contact()
        return self._contact


def no_contact_head() -> float:
    """The contact reading of a policy that declares no contact head: there is none to read."""
    raise ValueError("this policy has no contact head")


Step: TypeAlias = Generator[TargetPass, PassResult, DecodeResult]


def advance(steps: Step, reply: PassResult | None) -> TargetPass | DecodeResult:
    """The next pass ``steps`` asks for once given ``reply`` (None: start it), or its result when done."""
    try:
        return next(steps) if reply is None else steps.send(reply)
    except StopIteration as done:
        result: DecodeResult = done.value
        return result


def score_alone(policy: PolicyLike, request: TargetPass, clock: Callable[[], float]) -> PassResult:
    """``request`` (a pass after a prefix) as one pass of its own, timed on ``clock``."""
    if request.prefix is None:
        raise RuntimeError("a step asked for a prefill after its first pass (or after the prefill it was given)")
    scoring = as_token_scoring(policy)
    feed = torch.tensor([list(request.tokens)], dtype=torch.long)  # (1, k), k = 0 too
    t0 = clock()
    out = scoring.score(request.prefix, feed)
    return PassResult.alone(policy, out.prefix, out.logits, clock() - t0)


def finish_alone(steps: Step, pending: TargetPass | DecodeResult, policy: PolicyLike,
                 clock: Callable[[], float]) -> DecodeResult:
    """Run ``steps`` to its result from ``pending`` (what it asked for last), making each pass alone."""
    while isinstance(pending, TargetPass):
        pending = advance(steps, score_alone(policy, pending, clock))
    return pending


# --- the contract -----------------------------------------------------------------------------
class Decoder:
    """A decoder: :meth:`step` (the module docstring). ``spec`` (:mod:`vla_accel_ros.decoding.specs`)
    names it and declares what it needs; :meth:`reset` forgets the episode (with ``episode_state``),
    :meth:`attach_checkpoint_store` loads what it needs beside the checkpoint (``retrieval_store``)."""

    spec: ClassVar[type[DecoderSpec]]

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def capabilities(cls) -> type[DecoderSpec]:
        """What the decoder declares: its spec's capabilities."""
        return cls.spec

    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        """One control step (the module docstring). With ``prefix``, the step's observation is
        prefilled already: the step yields no prefill, has nothing ride along with one, and decodes
        after it (never a step without the model)."""
        raise NotImplementedError

    def decode(self, policy: PolicyLike, prefix: Prefix, context: DecodeContext) -> DecodeResult:
        """:meth:`step` after the prefill ``prefix`` its caller made, every pass made alone on ``policy``."""
        with torch.inference_mode():
            steps = self.step(policy, context, prefix)
            return finish_alone(steps, advance(steps, None), policy, context.clock)

    def check_policy(self, policy: PolicyLike) -> list[str]:
        """Raise ValueError, naming what is missing, when ``policy`` cannot serve this decoder;
        else the fallbacks it will take for what the policy lacks (warnings to report)."""
        offered = policy.capabilities()
        refusal = self.spec.refusal(offered)
        if refusal:
            raise ValueError(refusal)
        return self.spec.fallbacks(offered)

    def attach_checkpoint_store(self, checkpoint: Path | str, policy: PolicyLike | None = None) -> None:
        """With ``retrieval_store``: load the store that belongs to ``checkpoint``."""

    def reset(self) -> None:
        """With ``episode_state``: forget the previous episode."""
