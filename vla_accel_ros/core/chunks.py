"""Chunk execution: a chunked policy's H actions turned into a joint-space plan the control tick
follows, and the schedule that asks for the next chunk. ROS-free; the controller holds one plan.

- **Alignment.** Action k of a chunk is for the action step that starts k action steps after its
  observation (``obs_stamp + k * action_dt_s``). When the chunk reaches the tick, the steps whose
  time has passed (they ran, from the previous chunk or the fallback, during inference) are
  dropped; the last action is never dropped, so a single action is always executed once. With
  ``chunk_execution`` ``wait`` nothing is dropped: the arm held still during inference, so the
  chunk runs from its first action at the tick it arrives (LeRobot's synchronous loop, and what a
  policy trained without latency saw).
- **Re-anchoring.** The kept end-effector deltas are integrated through differential IK from the
  Kalman filter's estimate of the arm at the chunk's first executed step, not from the observed
  position: a late chunk continues from where the arm is, it does not pull it back to where it was.
  A single action (H = 1), and a chunk in ``wait``, is anchored at the measured position at its tick.
  With ``chunk_anchor`` ``step`` the plan is only the reference of the verification: each step's
  delta is applied from the arm's measured position at the tick it runs, as the sim and ``eval``
  apply a policy's actions (a servo that lags shortens every step instead of the plan running ahead
  of the arm). Absolute joint actions need no anchor.
- **Blending.** Steps the previous plan still holds for the same times are blended with the new
  plan's (``chunk_blend``): ``latest_only`` (the new plan), ``weighted_average`` (0.3 old, 0.7
  new, LeRobot's aggregation) or ``crossfade`` (the new plan's weight rises linearly over the
  overlap, from 1/(n+1) to n/(n+1)). Blending is in joint space, so it blends positions that were
  each anchored, and the gripper command alike; the actions themselves are blended with the same
  weights, for ``chunk_anchor`` ``step``.
- **Schedule.** ``sync`` and ``wait``: the next inference starts when the plan is used up (in
  ``sync`` the Kalman fallback carries the arm on meanwhile, in ``wait`` it holds the last command).
  ``async``: when at most ``chunk_refill_threshold`` of a chunk is left, so the next chunk arrives
  while this one still runs.
- **Kinematic verification.** While a plan runs, the Kalman filter's estimate of the arm is
  compared with where the plan put it one step earlier; beyond ``chunk_verify_threshold_rad`` on
  any joint the plan asks for an early re-plan (once per plan, counted).

Whatever a plan says, the controller's guard still bounds every command (position limits, reach
from the measured position, at most velocity limit x period from the previous command).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vla_accel_ros.core.settings import check_fields, setting

CHUNK_EXECUTIONS = ("sync", "wait", "async")
WAITING_EXECUTIONS = ("sync", "wait")  # the next inference starts when the plan is used up
CHUNK_BLENDS = ("latest_only", "weighted_average", "crossfade")
CHUNK_ANCHORS = ("plan", "step")
# execution[:blend] as runs compare them; "rtc": async, the new chunk alone, sampled by real-time chunking
CHUNK_MODES = ("sync", "wait", *(f"async:{blend}" for blend in CHUNK_BLENDS), "rtc")
WEIGHTED_AVERAGE_NEW = 0.7  # LeRobot's weighted_average: 0.3 of the old chunk, 0.7 of the new one
SLOT_EPS = 1e-6  # round-off slack when a tick falls exactly on a step boundary

# (joint position, action) -> (joint target one action step later, gripper command)
ActionStep = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, float]]


@dataclass(frozen=True)
class ChunkSettings:
    """How a chunked policy's chunks are executed (flat node parameters ``chunk_*``)."""

    chunk_execution: str = setting("async", "sync: the next inference starts when a chunk is used up (the arm "
                                   "goes on on the Kalman fallback meanwhile, and the actions due during "
                                   "inference are dropped); wait: likewise, but the arm holds its last command "
                                   "meanwhile and the chunk runs from its first action; async: the next "
                                   "inference starts when at most chunk_refill_threshold of a chunk is left",
                                   choices=CHUNK_EXECUTIONS)
    chunk_refill_threshold: float = setting(0.5, "async: start the next inference when the queue holds at most this "
                                            "fraction of a chunk", range=(0.0, 1.0))
    chunk_blend: str = setting("weighted_average", "How the steps two chunks both plan are combined: latest_only "
                               "(the new chunk), weighted_average (0.3 old, 0.7 new) or crossfade (linear from the old "
                               "to the new over the overlap)", choices=CHUNK_BLENDS)
    chunk_verify_threshold_rad: float = setting(0.15, "Kinematic chunk verification: request an early re-plan when the "
                                                "Kalman filter's estimate of a joint parts from the chunk's plan by "
                                                "more than this (rad); 0 = off", range=(0.0, 10.0))
    chunk_anchor: str = setting("plan", "End-effector delta chunks: plan = a chunk's deltas integrated from one anchor "
                                "(the arm's estimate at its first step); step = each step's delta applied from the "
                                "measured position at its tick, as the sim and eval apply actions",
                                choices=CHUNK_ANCHORS)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def holds_between_chunks(self) -> bool:
        """``wait``: the arm holds still while a chunk is computed, which then runs from its first action."""
        return self.chunk_execution == "wait"


def blend_weights(blend: str, n_overlap: int) -> np.ndarray:
    """The new plan's weight at each of ``n_overlap`` steps both plans hold (the old one's: 1 - w)."""
    if blend == "latest_only":
        return np.ones(n_overlap)
    if blend == "weighted_average":
        return np.full(n_overlap, WEIGHTED_AVERAGE_NEW)
    if blend == "crossfade":
        return np.arange(1, n_overlap + 1) / (n_overlap + 1.0)
    raise ValueError(f"chunk_blend must be one of {', '.join(CHUNK_BLENDS)}, got {blend!r}")


@dataclass
class ChunkPlan:
    """Joint targets for consecutive action steps: step k runs from ``start + k * dt``."""

    q: np.ndarray  # (S, n) joint targets
    gripper: np.ndarray  # (S,) gripper commands
    actions: np.ndarray  # (S, width) the actions behind them (blended as they are)
    start: float  # time of step 0
    obs_stamp: float  # the observation the chunk was computed from
    first_slot: int  # index of step 0 in its chunk (the steps before it were dropped)
    horizon: int  # H of the chunk
    next: int = 0  # the first step not yet executed or skipped
    replan_requested: bool = False
    blended: int = 0  # steps blended with the previous plan's

    @property
    def remaining(self) -> int:
        return len(self.q) - self.next

    def step_at(self, now: float, dt: float) -> int:
        """The step due at ``now`` (the last one past the end; -1 before the start)."""
        return min(int(math.floor((now - self.start) / dt + SLOT_EPS)), len(self.q) - 1)

    def wants_refill(self, settings: ChunkSettings) -> bool:
        """Whether the next inference should start now (a single action: always, as soon as
        there is an observation)."""
        if self.horizon <= 1 or self.replan_requested:
            return True
        if settings.chunk_execution in WAITING_EXECUTIONS:
            return self.remaining <= 0
        return self.remaining <= settings.chunk_refill_threshold * self.horizon


def first_kept_slot(obs_stamp: float, now: float, horizon: int, dt: float) -> int:
    """Alignment: the index of the chunk's action due at ``now`` (those before it already ran)."""
    return max(0, min(int(math.floor((now - obs_stamp) / dt + SLOT_EPS)), horizon - 1))


def plan_chunk(actions: np.ndarray, obs_stamp: float, now: float, dt: float, anchor_q: np.ndarray,
               step: ActionStep, previous: ChunkPlan | None = None, blend: str = "latest_only",
               aligned: bool = True) -> ChunkPlan:
    """The plan of a chunk (H, 7) reaching the tick at ``now``: aligned (else from its first action,
    due at this tick), its deltas integrated from ``anchor_q`` with ``step``, and blended with the steps
    ``previous`` still holds for the same times."""
    horizon = len(actions)
    first = first_kept_slot(obs_stamp, now, horizon, dt) if aligned else 0
    targets, grippers = [], []
    q = np.asarray(anchor_q, dtype=float)
    for action in actions[first:]:
        q, gripper = step(q, action)
        targets.append(q)
        grippers.append(gripper)
    # Unaligned, the tick it arrived at falls mid-way through the first step's window, so that a
    # tick a little early or late neither waits a period for a step nor skips one.
    start = obs_stamp + first * dt if aligned else now - 0.5 * dt
    plan = ChunkPlan(np.array(targets), np.array(grippers), np.array(actions[first:], dtype=float), start, obs_stamp,
                     first, horizon)
    if previous is not None and horizon > 1:
        plan.blended = blend_into(plan, previous, blend, dt)
    return plan


def overlap(plan: ChunkPlan, previous: ChunkPlan, dt: float) -> list[tuple[int, int]]:
    """(step of ``plan``, step of ``previous``) pairs for the same time, ``previous``'s not yet executed."""
    pairs = []
    for k in range(len(plan.q)):
        j = int(round((plan.start + k * dt - previous.start) / dt))
        if previous.next <= j < len(previous.q):
            pairs.append((k, j))
    return pairs


def blend_into(plan: ChunkPlan, previous: ChunkPlan, blend: str, dt: float) -> int:
    """Blend the overlapping steps of ``previous`` into ``plan`` in place; returns how many."""
    pairs = overlap(plan, previous, dt)
    for (k, j), w in zip(pairs, blend_weights(blend, len(pairs)), strict=True):
        plan.q[k] = w * plan.q[k] + (1.0 - w) * previous.q[j]
        plan.gripper[k] = w * plan.gripper[k] + (1.0 - w) * previous.gripper[j]
        plan.actions[k] = w * plan.actions[k] + (1.0 - w) * previous.actions[j]
    return len(pairs)


def plan_deviation(plan: ChunkPlan, step: int, q_estimate: np.ndarray) -> float:
    """Largest joint distance (rad) between the estimated arm and where the plan put it one step
    before ``step`` (0 before the plan's second step: nothing planned has had time to happen)."""
    if step < 1 or step > len(plan.q):
        return 0.0
    return float(np.max(np.abs(np.asarray(q_estimate, dtype=float) - plan.q[step - 1])))


class ChunkQueue:
    """The controller's chunks: the one that arrived and waits for its tick, and the plan that
    runs. Not locked: the controller calls it under its own lock."""

    def __init__(self, settings: ChunkSettings, dt: float, window: int) -> None:
        self.settings = settings
        self.dt = dt
        self.pending: tuple[np.ndarray, float] | None = None  # (actions (H, 7), obs_stamp)
        self.plan: ChunkPlan | None = None
        self.latency_s: deque[float] = deque(maxlen=window)  # observation -> first executed step
        self.started = False  # a plan ran since the task began: ticks without a step wait between chunks

    def receive(self, actions: np.ndarray, obs_stamp: float) -> bool:
        """Queue a checked chunk for the next tick; True when it replaces an unused single action."""
        replaced = self.pending is not None or (
            self.plan is not None and self.plan.horizon <= 1 and self.plan.remaining > 0 and len(actions) <= 1)
        self.pending = (actions, float(obs_stamp))
        return replaced

    def forget(self, task_over: bool = True) -> None:
        """Drop what is pending and planned; ``task_over``: the task (instruction, episode) ended too."""
        self.pending = None
        self.plan = None
        self.started = self.started and not task_over

    def wants_inference(self) -> bool:
        """Whether an inference should start now: no chunk waits for its tick, and the plan's
        schedule asks for the next one (a single action's: always)."""
        if self.pending is not None:
            return len(self.pending[0]) <= 1  # single actions: the newest one replaces it
        return self.plan is None or self.plan.wants_refill(self.settings)

    def start_pending(self, now: float, anchor: Callable[[int], np.ndarray], step: ActionStep) -> ChunkPlan | None:
        """Plan the pending chunk at this tick (its start); ``anchor(H)`` gives the position its
        deltas are integrated from. Returns the new plan (None: nothing was pending)."""
        if self.pending is None:
            return None
        actions, obs_stamp = self.pending
        self.pending = None
        previous = self.plan if self.plan is not None and self.plan.remaining else None
        self.plan = plan_chunk(actions, obs_stamp, now, self.dt, anchor(len(actions)), step, previous,
                               self.settings.chunk_blend, aligned=not self.settings.holds_between_chunks)
        self.latency_s.append(now - obs_stamp)
        self.started = True
        return self.plan
