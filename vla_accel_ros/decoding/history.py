"""Per-episode history of one robot (measured joints, tokens and gripper values of earlier steps, the
step's sampling noise) that builds each step's :class:`DecodeContext`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from vla_accel_ros.decoding.protocol import N_ACTION_TOKENS, DecodeContext, DecodeResult
from vla_accel_ros.models.sampling import SamplingConfig

if TYPE_CHECKING:
    from vla_accel_ros.core.kalman import JointKalmanFilter


class EpisodeHistory:
    """Per-episode bookkeeping that builds each step's :class:`DecodeContext`.

    Feed it measured joints (``observe_joints``, which also updates the filter) and each step's
    result (``record``); ``context()`` returns the context of the next step. What it keeps is
    bounded however long an episode runs: the last ``keep_joints`` measurements, the last
    ``max_steps`` steps' tokens and 16 gripper values.
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
        """Remember this step's tokens (the last ``max_steps`` steps' are kept) and gripper command;
        advances the step index."""
        self._tokens.append(np.asarray(result.tokens, dtype=np.int64))
        # A stream without episode boundaries (the node) never resets: an episode's worth of tokens,
        # not the whole run's, each step's context copying them all.
        del self._tokens[: -max(self.max_steps, 1)]
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
