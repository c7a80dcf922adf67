"""Shared pieces of every decoder: context in, result out, relaxed acceptance, pass accounting.

A decoder turns a prefilled prefix into the 7 action tokens of one control step. It talks to the
policy only through ``score`` (one target forward pass per call, whatever the number of tokens)
and ``draft_tokens`` (the light draft head), so the counts in :class:`DecodeResult` are exact.

Relaxed acceptance (all speculative decoders): draft token d_i is accepted when
``|d_i - argmax target_i| <= r``, prefix-wise (the accepted length is the first failure's index);
the draft token is kept, not the argmax. At the first rejection the target's argmax there comes
free with the same verify pass (the "bonus" token). With sampling (``DecodeContext.token_noise``,
see :mod:`vla_accel_ros.sampling`) "argmax" reads "the target's sampled token" throughout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from vla_accel_ros.sampling import SamplingConfig, pick_tokens
from vla_accel_ros.tokenizer import N_BINS

if TYPE_CHECKING:
    from vla_accel_ros.kalman import JointKalmanFilter
    from vla_accel_ros.observation import Observation
    from vla_accel_ros.vision_reuse import IncrementalVisionEncoder

N_ACTION_TOKENS = 7
PREFILL_VERIFIED = "prefill_verified"  # DecodeResult.mode of an action whose proposal the prefill verified
MAX_TOKEN_ID = 254  # 256 bin edges give 255 bins: ids 0..254 (255 is never emitted)


@runtime_checkable
class PolicyLike(Protocol):
    """The part of ``vla_accel_ros.models.Policy`` the decoders use."""

    tokenizer: Any

    @property
    def n_action_tokens(self) -> int: ...

    def prefill(self, obs: Observation) -> Any: ...

    def prefill_scored(self, obs: Observation, tokens: torch.Tensor) -> Any: ...

    def score(self, prefix: Any, tokens: torch.Tensor) -> Any: ...

    def draft_tokens(
        self, prefix: Any, n: int, last_token: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def contact_probability(self, prefix: Any) -> float: ...

    def tokens_to_action(self, tokens: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, eq=False)
class DecodeContext:
    """Everything besides the observation that a decoder may use at one control step.

    joint_positions: (H, n) recent measured arm joint positions, oldest first (may be empty).
    joint_stamps: (H,) their times in seconds (or empty).
    kalman: the joint-space filter, already fed with the measurements (or None).
    step / max_steps: control step index in the episode and the episode step limit.
    control_period_s: the node's fixed control period; the action is the TCP delta over it.
    time_left_s: seconds left in the control period when decoding starts (None = no deadline).
    gripper_history: previous gripper action values (policy action space, 1 = open), oldest first.
    target_clearance: gripper-to-target distance (m) from the scene, None on a real robot.
    token_history: (S, 7) action tokens of the episode's previous steps, oldest first.
    clock: seconds, monotonic; every timing and deadline decision reads it.
    token_noise: (7, 256) this step's sampling noise (:mod:`vla_accel_ros.sampling`); None = greedy.
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

    def with_time_left(self, time_left_s: float | None) -> DecodeContext:
        """This context with another ``time_left_s`` (the rest already validated: no second check)."""
        if time_left_s is not None and np.isnan(time_left_s):
            raise ValueError("DecodeContext.time_left_s is NaN; pass None for 'no deadline'")
        context = object.__new__(DecodeContext)
        context.__dict__.update(self.__dict__, time_left_s=time_left_s)
        return context


@dataclass(frozen=True, eq=False)
class DecodeResult:
    """One control step's decoding.

    action / tokens: (7,) action at the tokens' bin centres, and the tokens.
    accepted_len: draft tokens accepted, summed over verify rounds.
    drafted: draft tokens proposed for verification (accepted_len / drafted = acceptance rate).
    target_passes: target forward passes (``score`` calls).
    draft_passes: tokens requested from the draft head (each at most one light draft-layer step).
    rounds: draft/verify rounds (AR: 0).
    kf_filled: positions filled by a Kalman completion (joint-space or token-space).
    threshold: the acceptance threshold r used (None for AR).
    timings: milliseconds; draft, verify, decode (the decoder itself) and, after
        :func:`run_policy_step`, prefill and total (prefill + decode).
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


def model_free_result(
    name: str, action: np.ndarray, tokens: np.ndarray, timings: dict[str, float], mode: str = ""
) -> DecodeResult:
    """The result of decoder ``name`` for an action made without any target or draft pass (a flow
    head's sample, a queued retrieved action): every pass and acceptance counter 0 and no threshold,
    so these steps add nothing to acceptance statistics; draft and verify time 0, then ``timings``."""
    return DecodeResult(action=action, tokens=tokens, accepted_len=0, drafted=0, target_passes=0, draft_passes=0,
                        rounds=0, kf_filled=0, threshold=None, timings={"draft": 0.0, "verify": 0.0, **timings},
                        decoder=name, mode=mode)


class Decoder(Protocol):
    name: str

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult: ...


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
        self.last_verify_s = self.clock() - t0
        self.verify_s += self.last_verify_s
        self.target_passes += 1
        first = prefix.n_tokens if self.noise is not None else 0
        return pick_tokens(out.logits[0], self.noise, first).cpu().numpy(), out.prefix

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


# --- running one policy step ------------------------------------------------------------------
def run_policy_step(
    policy: PolicyLike,
    obs: Observation,
    decoder: Decoder,
    context: DecodeContext,
    vision: IncrementalVisionEncoder | None = None,
) -> DecodeResult:
    """Prefill ``obs`` and decode one action, timing both on ``context.clock``.

    ``context.time_left_s`` counts from the start of this call; the decoder sees what is left
    after the prefill. With ``vision``, the prefill re-encodes only the image patches that changed
    (:mod:`vla_accel_ros.vision_reuse`).

    A decoder with a ``skip_step(context)`` method may serve the step without the model (HeiSD's
    verify-skip executes queued retrieved actions): when it returns a result, that result is
    returned at once, with no prefill (prefill time 0, nothing re-encoded) and no target pass.

    A decoder with ``prefill_proposal(policy, context)`` may propose the 7 tokens before the
    prefill (from what it knows without the image: the previous action, the Kalman filter). When
    it does, the prefill verifies them in the same pass (``Policy.prefill_scored``: its first 6
    ride along with the prefix) and ``decode_scored(policy, scored, proposal, context)`` finishes
    the action, with no target pass of its own. The proposal's time counts as decoding; the one
    pass counts as the prefill (incremental too: ``vision.prefill_scored``).
    """
    clock = context.clock
    t0 = clock()
    skip = getattr(decoder, "skip_step", None)
    if callable(skip):
        skipped = skip(context)
        if skipped is not None:
            elapsed = (clock() - t0) * 1e3
            return replace(skipped, timings=dict(skipped.timings, prefill=0.0, total=elapsed), vision_fraction=0.0)
    fraction = 1.0
    propose = getattr(decoder, "prefill_proposal", None)
    with torch.inference_mode():
        proposal = propose(policy, context) if callable(propose) else None
        t_proposed = clock()
        if proposal is not None:
            # The last proposed token is not fed: its output would predict an 8th token.
            feed = torch.tensor([proposal[: N_ACTION_TOKENS - 1].tolist()], dtype=torch.long)
            scored = policy.prefill_scored(obs, feed) if vision is None else vision.prefill_scored(obs, feed)
        elif vision is None:
            prefix = policy.prefill(obs)
        else:
            prefix = vision.prefill(obs)
        if vision is not None:
            fraction = vision.last.fraction
        t1 = clock()
        if context.time_left_s is not None:
            context = context.with_time_left(context.time_left_s - (t1 - t0))
        if proposal is not None:
            result = decoder.decode_scored(policy, scored, proposal, context)
        else:
            result = decoder.decode(policy, prefix, context)
    t2 = clock()
    # Choosing a proposal for the prefill to verify (or deciding not to) is decoding work.
    decode_ms = result.timings["decode"] + (t_proposed - t0) * 1e3
    timings = dict(result.timings, decode=decode_ms, prefill=(t1 - t_proposed) * 1e3, total=(t2 - t0) * 1e3)
    return replace(result, timings=timings, vision_fraction=fraction)


class EpisodeHistory:
    """Per-episode bookkeeping that builds each step's :class:`DecodeContext`.

    Feed it measured joints (``observe_joints``, which also updates the filter) and each step's
    result (``record``); ``context()`` returns the context of the next step.
    """

    def __init__(
        self,
        kalman: JointKalmanFilter | None = None,
        *,
        max_steps: int = 120,
        control_period_s: float = 0.05,
        keep_joints: int = 16,
        clock: Callable[[], float] = time.perf_counter,
        sampling: SamplingConfig | None = None,
    ) -> None:
        if keep_joints < 5:
            raise ValueError(f"keep_joints must be >= 5 (the curvature fit uses 5 points), got {keep_joints}")
        self.kalman = kalman
        self.max_steps = max_steps
        self.control_period_s = control_period_s
        self.keep_joints = keep_joints
        self.clock = clock
        self.sampling = sampling or SamplingConfig()
        self.episode = -1
        self.reset()

    def reset(self, episode: int | None = None) -> None:
        """Start a new episode (also resets the filter). ``episode`` keys the sampling noise
        (e.g. the episode's seed); by default the episodes are counted."""
        self.episode = self.episode + 1 if episode is None else int(episode)
        self.step = 0
        self._q: list[np.ndarray] = []
        self._stamps: list[float] = []
        self._gripper: list[float] = []
        self._tokens: list[np.ndarray] = []
        if self.kalman is not None:
            self.kalman.reset()

    def observe_joints(self, q: np.ndarray, stamp: float) -> bool:
        """Record a measurement; False when it was skipped (non-finite, or time not moving on)."""
        q = np.asarray(q, dtype=float)
        fused = self.kalman.update(q, stamp) if self.kalman is not None else True
        if not np.all(np.isfinite(q)) or not np.isfinite(stamp) or (self._stamps and stamp <= self._stamps[-1]):
            return False
        self._q.append(q.copy())
        self._stamps.append(float(stamp))
        del self._q[: -self.keep_joints], self._stamps[: -self.keep_joints]
        return fused

    def record(self, result: DecodeResult) -> None:
        """Remember this step's tokens and gripper command; advances the step index."""
        self._tokens.append(np.asarray(result.tokens, dtype=np.int64))
        self._gripper.append(float(result.action[-1]))
        del self._gripper[:-16]
        self.step += 1

    def context(self, *, time_left_s: float | None = None, target_clearance: float | None = None) -> DecodeContext:
        n = self.kalman.kin.n if self.kalman is not None else (len(self._q[0]) if self._q else 7)
        return DecodeContext(
            joint_positions=np.array(self._q, dtype=float).reshape(-1, n),
            joint_stamps=np.array(self._stamps, dtype=float),
            kalman=self.kalman,
            step=self.step,
            max_steps=self.max_steps,
            control_period_s=self.control_period_s,
            time_left_s=time_left_s,
            gripper_history=tuple(self._gripper),
            target_clearance=target_clearance,
            token_history=np.array(self._tokens, dtype=np.int64).reshape(-1, N_ACTION_TOKENS),
            clock=self.clock,
            token_noise=self.sampling.token_noise(self.episode, self.step),
        )
