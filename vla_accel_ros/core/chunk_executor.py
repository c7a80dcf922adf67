"""The controller's chunk executor: at each tick, a chunk that arrived becomes the plan (anchored to
the arm), the plan's due step becomes the command, and the Kalman filter verifies the plan while it
runs. The plan itself (alignment, blending, schedule) is :mod:`vla_accel_ros.core.chunks`.
ROS-free; not thread-safe (the controller calls it under its lock).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_accel_ros.core.actions import EE_DELTA, action_to_joint_targets, validate_action
from vla_accel_ros.core.chunks import ChunkPlan, ChunkQueue, ChunkSettings, plan_deviation
from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.ticks import Counters


def checked_chunk(actions: np.ndarray, width: int) -> np.ndarray:
    """``actions`` as an (H >= 1, ``width``) float array of valid actions; a ValueError says why not."""
    chunk = np.asarray(actions, dtype=float)
    if chunk.ndim != 2 or len(chunk) == 0:
        raise ValueError(f"an action chunk must be (H >= 1, {width}), got shape {chunk.shape}")
    for k, action in enumerate(chunk):
        try:
            validate_action(action, width)
        except ValueError as err:
            raise ValueError(f"step {k} of {len(chunk)}: {err}") from None
    return chunk


def obs_to_action_report(latency_ms: np.ndarray) -> dict[str, float]:
    """Observation to the first executed step of each plan (ms): p50, p99."""
    if latency_ms.size == 0:
        return {"obs_to_action_ms_p50": 0.0, "obs_to_action_ms_p99": 0.0}
    return {"obs_to_action_ms_p50": float(np.percentile(latency_ms, 50)),
            "obs_to_action_ms_p99": float(np.percentile(latency_ms, 99))}


@dataclass(frozen=True)
class PolicyStep:
    """The plan's step due at a tick, as the command to send."""

    q: np.ndarray  # arm joint targets
    gripper: float
    reason: str


class ChunkExecutor:
    """Runs the chunks of :class:`ChunkQueue` (``queue``) tick by tick; counts into the controller's counters."""

    def __init__(self, kin: ArmKinematics, kf: JointKalmanFilter, counters: Counters, settings: ChunkSettings, *,
                 action_dt_s: float, action_space: str, action_timeout_s: float, window: int) -> None:
        self.kin = kin
        self.kf = kf  # the controller's filter: read here, updated there
        self.counters = counters
        self.settings = settings
        self.dt = action_dt_s
        self.space = action_space
        self.timeout_s = action_timeout_s
        self.queue = ChunkQueue(settings, action_dt_s, window)

    def receive(self, chunk: np.ndarray, obs_stamp: float) -> None:
        """Queue a checked chunk for the next tick (counted; a replaced unused action too)."""
        self.counters.add("actions_received")
        if self.queue.receive(chunk, obs_stamp):
            self.counters.add("actions_replaced")

    def start_pending(self, now: float, q_measured: np.ndarray) -> bool:
        """A chunk that arrived becomes the plan at this tick, its start: a chunk's deltas from the
        filter's estimate of the arm now, a single action's from the measured position, as the
        policy saw it. True when a plan started."""
        kin, kf, dt, space = self.kin, self.kf, self.dt, self.space
        held = self.settings.holds_between_chunks  # the arm held still: from where it is

        def anchor(horizon: int) -> np.ndarray:
            if horizon > 1 and not held and kf.initialized and kf.stamp is not None:
                return np.clip(kf.predict_q(max(now - kf.stamp, 0.0)), kin.limits.lower, kin.limits.upper)
            return q_measured

        def step(q0: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, float]:
            return action_to_joint_targets(kin, q0, action, dt, space)

        plan = self.queue.start_pending(now, anchor, step)
        if plan is None:
            return False
        self.counters.add("chunks_planned")
        self.counters.add("chunk_steps_dropped", plan.first_slot)
        self.counters.add("chunk_steps_blended", plan.blended)
        return True

    def due_step(self, now: float, q_measured: np.ndarray) -> PolicyStep | str:
        """The plan's step due at ``now``, not used before and no later for its step than
        ``action_timeout_s`` after its observation; else why there is none. A tick that comes
        after several steps skips the ones it missed: a step is never executed late."""
        plan = self.queue.plan
        due = -1 if plan is None else plan.step_at(now, self.dt)
        if plan is None or due < plan.next:
            return "no fresh action"
        if due > plan.next:
            self.counters.add("actions_expired", due - plan.next)
        plan.next = due + 1
        slot = plan.first_slot + due
        age = now - plan.obs_stamp - slot * self.dt  # how late the action is for its step
        if age <= self.timeout_s:
            self.counters.add("actions_used")
            self._verify(plan, due)
            gripper = float(plan.gripper[due])
            reason = f"action from observation {age * 1e3:.1f} ms old"
            reason += f", step {slot + 1} of {plan.horizon}" if plan.horizon > 1 else ""
            if plan.horizon > 1 and self.settings.chunk_anchor == "step" and self.space == EE_DELTA:
                # the step's delta from where the arm is now, as the policy's actions are applied in training
                q_step, _ = action_to_joint_targets(self.kin, q_measured, plan.actions[due], self.dt, self.space)
                return PolicyStep(q_step, gripper, reason + ", from the arm")
            return PolicyStep(plan.q[due].copy(), gripper, reason)
        self.counters.add("actions_expired")
        return f"newest action expired ({age:.3f} s > {self.timeout_s} s)"

    def _verify(self, plan: ChunkPlan, step: int) -> None:
        """Kinematic chunk verification: the filter's estimate against the plan; an early re-plan
        (once per plan) when they part by more than ``chunk_verify_threshold_rad``."""
        threshold = self.settings.chunk_verify_threshold_rad
        if threshold <= 0.0 or plan.horizon <= 1 or plan.replan_requested or not self.kf.initialized:
            return
        if plan_deviation(plan, step, self.kf.q) > threshold:
            plan.replan_requested = True
            self.counters.add("chunk_replans")
