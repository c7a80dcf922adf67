"""Kinematic KERV: joint-space KF completion and a kinematics-driven threshold, one verify pass.

Per action: draft all 7 tokens, verify them in ONE target pass, keep the relaxed-accepted prefix
(threshold r from :mod:`thresholds`), take the target's argmax at the first rejection (free from
the same pass) and fill every later position with the tokens of the action the joint-space Kalman
filter predicts for the next control period. There is never a second round.

The KF prediction is the TCP delta between the filtered joint configuration and its
constant-acceleration extrapolation one control period ahead (clamped to URDF limits); the gripper
is its last commanded value. Before the filter has converged (fewer than 3 measurements) or when
there is no filter, the suffix keeps the draft tokens — still one verify pass — and r is r_min,
since without a motion model nothing supports a loose threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vla_accel_ros.decoding.base import (
    N_ACTION_TOKENS,
    DecodeContext,
    DecodeResult,
    PassLedger,
    PolicyLike,
    accepted_length,
)
from vla_accel_ros.decoding.thresholds import (
    N_CURVATURE_POINTS,
    KinematicSignals,
    fit_circle_radius,
    kinematic_threshold,
)

GRIPPER_INDEX = N_ACTION_TOKENS - 1


@dataclass(frozen=True)
class KervConfig:
    r_min: int = 5
    r_max: int = 15

    def __post_init__(self) -> None:
        if not 0 <= self.r_min <= self.r_max:
            raise ValueError(
                f"{type(self).__name__} needs 0 <= r_min <= r_max, got r_min={self.r_min}, r_max={self.r_max}"
            )


def kinematic_signals(context: DecodeContext) -> KinematicSignals | None:
    """Threshold inputs from the context's filter and joint history; None without a converged KF."""
    kf = context.kalman
    if kf is None or not kf.converged:
        return None
    recent = context.joint_positions[-N_CURVATURE_POINTS:]
    recent = recent[np.all(np.isfinite(recent), axis=1)] if len(recent) else recent
    radius = math.inf
    if len(recent) >= 3 and recent.shape[1] == kf.kin.n:
        radius = fit_circle_radius(np.array([kf.kin.fk(q).position for q in recent]))
    return KinematicSignals(
        innovation=kf.innovation(),
        ee_acceleration=kf.ee_acceleration(),
        path_radius=radius,
        min_limit_margin=float(np.min(kf.kin.limit_margin(kf.q))),
    )


def kf_completion_tokens(policy: PolicyLike, context: DecodeContext) -> tuple[np.ndarray, np.ndarray] | None:
    """Tokens of the KF-predicted next action and a mask of positions the filter actually knows
    (the gripper only when there is gripper history); None without a converged filter."""
    kf = context.kalman
    if kf is None or not kf.converged:
        return None
    action = kf.predict_action(context.control_period_s, context.gripper_history)
    tokens = np.asarray(policy.tokenizer.encode(action), dtype=np.int64).reshape(N_ACTION_TOKENS)
    known = np.ones(N_ACTION_TOKENS, dtype=bool)
    known[GRIPPER_INDEX] = len(context.gripper_history) > 0
    return tokens, known


def complete_suffix(
    tokens: np.ndarray, start: int, policy: PolicyLike, context: DecodeContext
) -> tuple[np.ndarray, int]:
    """Overwrite ``tokens[start:]`` with KF tokens where the filter knows them; returns the new
    tokens and the number of positions filled (0 when the filter cannot help: tokens unchanged)."""
    out = np.array(tokens, dtype=np.int64)
    completion = kf_completion_tokens(policy, context)
    if completion is None or start >= N_ACTION_TOKENS:
        return out, 0
    fill, known = completion
    positions = np.arange(start, N_ACTION_TOKENS)
    positions = positions[known[positions]]
    out[positions] = fill[positions]
    return out, int(len(positions))


class KervDecoder:
    name = "kerv"
    config_type: type[KervConfig] = KervConfig

    def __init__(self, **cfg: Any) -> None:
        self.config = self.config_type(**cfg)

    def threshold(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> float:
        signals = kinematic_signals(context)
        if signals is None:
            return float(self.config.r_min)
        return float(kinematic_threshold(signals, self.config.r_min, self.config.r_max))

    def decode(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> DecodeResult:
        started = context.clock()
        ledger = PassLedger(policy, context.clock)
        with torch.inference_mode():
            r = self.threshold(policy, prefix, context)
            draft = ledger.draft(prefix, N_ACTION_TOKENS)
            argmax, _ = ledger.score(prefix, draft.tolist())
        n_acc = accepted_length(draft, argmax[:N_ACTION_TOKENS], r)
        tokens, kf_filled = draft.copy(), 0
        if n_acc < N_ACTION_TOKENS:
            tokens[n_acc] = argmax[n_acc]  # bonus: the target's own token, free from this pass
            tokens, kf_filled = complete_suffix(tokens, n_acc + 1, policy, context)
        return ledger.result(
            self.name,
            tokens,
            accepted_len=n_acc,
            drafted=N_ACTION_TOKENS,
            rounds=1,
            kf_filled=kf_filled,
            threshold=r,
            started=started,
        )
