"""Shared pieces of every decoder: context in, result out, relaxed acceptance, pass accounting.

A decoder turns a prefilled prefix into the 7 action tokens of one control step. It talks to the
policy only through ``score`` (one target forward pass per call, whatever the number of tokens)
and ``draft_tokens`` (the light draft head), so the counts in :class:`DecodeResult` are exact.

Relaxed acceptance (all speculative decoders): draft token d_i is accepted when
``|d_i - argmax target_i| <= r``, prefix-wise (the accepted length is the first failure's index);
the draft token is kept, not the argmax. At the first rejection the target's argmax there comes
free with the same verify pass (the "bonus" token). With sampling (``DecodeContext.token_noise``,
see :mod:`vla_accel_ros.models.sampling`) "argmax" reads "the target's sampled token" throughout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from vla_accel_ros.models.api import PolicyLike
from vla_accel_ros.models.tokenizer import N_BINS

if TYPE_CHECKING:
    from vla_accel_ros.core.kalman import JointKalmanFilter
    from vla_accel_ros.decoding.specs import DecoderSpec

N_ACTION_TOKENS = 7
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
    time_left_s: seconds left in the control period when decoding starts (None = no deadline).
    gripper_history: previous gripper action values (policy action space, 1 = open), oldest first.
    target_clearance: gripper-to-target distance (m) from the scene, None on a real robot.
    token_history: (S, 7) action tokens of the episode's previous steps, oldest first.
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


@dataclass(frozen=True)
class DecoderCapabilities:
    """What a decoder needs from the policy and from the runner, declared, never probed.

    flow_head: decodes with the policy's continuous action head (``vla-accel train-flow``).
    retrieval_store: needs a retrieval store (``vla-accel build-store``), attached at start-up.
    verifies_in_prefill: may propose the action before the prefill (``prefill_proposal``), for the
        prefill to verify in its own pass (``decode_scored`` finishes it).
    skips_steps: may serve a step with no model pass at all (``skip_step``).
    episode_state: keeps state across steps that a new episode clears (``reset``).
    parallel_draft: drafts with the policy's parallel draft head when the policy has one.
    draft_head: needs the policy's draft head (``draft_tokens``); refused at start-up without one.
    contact_head: reads the policy's contact head where the scene gives no clearance; without
        one, the kinematics alone set the threshold (a warning says so).
    split_verify: ``decode`` is ``propose_after_prefill``, ONE target pass over the tokens it
        returns, then ``finish_verified``; a runner may make that pass itself (a fleet: one batched
        ``score`` for the verify passes of several robots).
    fill_check: fills a rejected suffix with the Kalman filter's tokens and can check that fill
        against the target's own picks from the same verify pass (its ``fill_check`` setting; the
        node's ``kf_fill_check``).
    """

    flow_head: bool = False
    retrieval_store: bool = False
    verifies_in_prefill: bool = False
    skips_steps: bool = False
    episode_state: bool = False
    parallel_draft: bool = False
    draft_head: bool = False
    contact_head: bool = False
    split_verify: bool = False
    fill_check: bool = False


@dataclass(frozen=True, eq=False)
class PendingVerify:
    """A step decoded up to its one verify pass (``Decoder.propose_after_prefill``).

    tokens: (N_ACTION_TOKENS - 1,) int64, to score after the prefix the step was given (the
        proposal's first 6: the last one's output would predict an 8th token).
    state: the decoder's own record of the step, for its ``finish_verified``.
    """

    tokens: np.ndarray
    state: Any = None


class Decoder:
    """The decoder contract: ``decode`` one action after the prefill, and declare in
    :meth:`capabilities` which of the optional steps below the runner must call. Each optional
    step has a neutral default here, so a decoder overrides only the ones it declares. ``spec``
    (:mod:`vla_accel_ros.decoding.specs`) names the decoder and declares what it needs."""

    spec: ClassVar[type[DecoderSpec]]

    @property
    def name(self) -> str:
        return self.spec.name

    def capabilities(self) -> DecoderCapabilities:
        return DecoderCapabilities()

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult:
        raise NotImplementedError

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

    def skip_step(self, context: DecodeContext) -> DecodeResult | None:
        """With ``skips_steps``: this step's action without any model pass, or None."""
        return None

    def prefill_proposal(self, policy: PolicyLike, context: DecodeContext) -> np.ndarray | None:
        """With ``verifies_in_prefill``: the 7 tokens for the prefill to verify, or None."""
        return None

    def decode_scored(self, policy: PolicyLike, scored: Any, proposal: np.ndarray, context: DecodeContext) -> DecodeResult:
        """With ``verifies_in_prefill``: finish the action the prefill verified."""
        raise NotImplementedError(f"decoder '{self.name}' does not verify inside the prefill")

    def propose_after_prefill(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> PendingVerify | DecodeResult:
        """With ``split_verify``: ``decode`` up to its verify pass, or the finished result of a step
        that needs no such pass (then nothing is left to verify)."""
        raise NotImplementedError(f"decoder '{self.name}' does not split its verify pass")

    def finish_verified(self, policy: PolicyLike, pending: PendingVerify, scored: Any, context: DecodeContext,
                        verify_s: float = 0.0) -> DecodeResult:
        """With ``split_verify``: the action of ``pending`` from its verify pass, ``scored`` (a
        batch of one: ``Policy.score`` of ``pending.tokens`` after the step's prefix), which took
        ``verify_s`` seconds."""
        raise NotImplementedError(f"decoder '{self.name}' does not split its verify pass")





















