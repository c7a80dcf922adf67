"""The ROS-free control core: one safe joint command per tick, whatever inference does.

It keeps the latest stamped inputs (joint state, image, instruction) and the newest verified
policy actions: one action, or a chunked policy's H actions for H consecutive action steps
(``on_action_chunk``), which the next tick turns into a joint-space plan whose schedule tells the
inference worker when to start the next one (``wait_observation``). At every tick it chooses:

- ``policy``: the plan's due step (:mod:`vla_accel_ros.core.chunk_executor`), as joint targets
  (``actions.action_to_joint_targets``, the sim's path too, per ``action_space``);
- ``fallback``: no fresh action, so the Kalman filter stands in for it, slowing to a stop over
  ``fallback_max_s`` (:mod:`vla_accel_ros.core.fallback`); then the core holds and reports how long
  no action came (``action_starved_s``). Between chunks in ``chunk_execution`` ``wait`` the last
  command is held instead; without a policy (``expect_actions`` false) it tracks the measured position;
- ``hold`` (:mod:`vla_accel_ros.core.hold`): disabled, no instruction, an input stale past its
  watchdog, a fault set from outside, or the fallback used up: the measured position at the moment
  the hold began (latched, so a sagging arm does not drift the hold target).

Every command then passes the same guard (:mod:`vla_accel_ros.core.command_guard`): within reach
of the measured position, within v*T of the previous command and within the position limits, the
fingers alike; a hold after a jump ramps to its target at the velocity limits.

Joint states are gated (:mod:`vla_accel_ros.core.joint_gate`): an outlier changes nothing and is
counted (``TickStats.outliers_rejected``, ``last_outlier``); a confirmed jump (an episode reset, an
arm moved by hand) restarts the filter, pending action and hold target there, the command ramping to
it. Beyond the URDF limits by more than ``joint_limit_tolerance``, the last valid position is held.
An image the node refused keeps the camera's freshness where the last usable frame left it; the
camera's stale reason then names the refusal.

Times are seconds on one clock chosen by the caller (ROS time in the node, so use_sim_time works);
inputs are stamped with their arrival time on that clock, which keeps the watchdog independent of
the senders' clocks. Thread-safe: the node's callbacks, its timer and the inference worker call
in from different threads.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from vla_accel_ros.core.actions import ACTION_SPACES, EE_DELTA, action_width
from vla_accel_ros.core.cameras import CameraSet
from vla_accel_ros.core.chunk_executor import ChunkExecutor, PolicyStep, checked_chunk, obs_to_action_report
from vla_accel_ros.core.chunks import ChunkSettings
from vla_accel_ros.core.command_guard import CommandGuard
from vla_accel_ros.core.fallback import FallbackWindow
from vla_accel_ros.core.hold import Hold
from vla_accel_ros.core.joint_gate import JUMP, OUTLIER, JointGate
from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.settings import check_fields, nested, setting
from vla_accel_ros.core.ticks import Counters, TickPeriods, TickResult, TickStats, period_report

SOURCES = ("policy", "fallback", "hold")


@dataclass(frozen=True)
class ControllerConfig:
    """The ROS-free control core's settings (derived from :class:`NodeConfig`)."""

    period_s: float = setting(0.05, "Control period", range=(0.001, 1.0))
    camera_timeout_s: float = setting(0.5, "Image watchdog (each camera's, and the matched observation's)",
                                      range=(0.001, 60.0))
    camera_names: tuple[str, ...] = setting(("camera",), "The cameras in image-slot order (named in hold reasons)")
    camera_sync_tolerance_s: float = setting(0.025, "Largest stamp difference of the images of one observation",
                                             range=(0.0, 10.0))
    joint_state_timeout_s: float = setting(0.25, "Joint-state watchdog", range=(0.001, 60.0))
    action_timeout_s: float = setting(0.5, "Maximum observation age of a usable action", range=(0.0, 60.0))
    action_dt_s: float = setting(0.05, "Duration of one policy action step", range=(0.001, 1.0))
    action_space: str = setting(EE_DELTA, "What the policy's actions are (its robot record's action_space): "
                                "end-effector deltas or absolute joint positions, each with the gripper",
                                choices=ACTION_SPACES)
    deadline_tolerance: float = setting(0.5, "Late-tick threshold as a fraction of the period", range=(0.0, 10.0))
    gripper_initial: float = setting(1.0, "Gripper command before the first action", range=(0.0, 1.0))
    jitter_window: int = setting(4096, "Ticks kept for the jitter percentiles", range=(16, 1_000_000))
    fallback_max_s: float = setting(0.25, "Longest Kalman fallback after the last fresh action (its velocity "
                                    "decays to 0 over it); then hold", range=(0.0, 10.0))
    expect_actions: bool = setting(True, "A policy supplies actions; false = none (bring-up): the fallback "
                                   "tracks the measured position and extrapolates nothing")
    # chunk_execution, chunk_refill_threshold, chunk_blend, chunk_verify_threshold_rad
    chunks: ChunkSettings = nested(ChunkSettings())
    gripper_velocity: float = setting(0.1, "Speed limit (m/s) of a finger joint whose URDF gives none",
                                      range=(1e-4, 10.0))
    jump_confirm_s: float = setting(0.05, "How long agreeing joint-state outliers must persist to be a real "
                                    "jump", range=(0.0, 10.0))
    joint_limit_tolerance: float = setting(0.1, "How far past a URDF position limit a measured arm joint may "
                                           "be; further is a fault (hold)", range=(0.0, 1.0))
    max_instruction_chars: int = setting(1000, "Longest instruction accepted", range=(1, 1_000_000))

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.camera_names:
            raise ValueError("ControllerConfig.camera_names must name at least one camera")


class Controller:
    """Decides each tick's command from the latest inputs; see the module docstring."""

    def __init__(self, kin: ArmKinematics, config: ControllerConfig | None = None) -> None:
        self.kin = kin
        self.config = cfg = config or ControllerConfig()
        self._action_width = action_width(cfg.action_space, kin.n)
        self._lock = threading.Lock()
        self._new_obs = threading.Condition(self._lock)
        self._kf = JointKalmanFilter(kin, cfg.period_s)
        self._counters = Counters()
        self._enabled = False
        self._instruction = ""
        # latest inputs: (value, arrival time)
        self._q: np.ndarray | None = None
        self._gripper_opening: float | None = None  # measured (mean finger position), once known
        self._q_rx = -math.inf
        self._cameras = CameraSet(cfg.camera_names, cfg.camera_sync_tolerance_s)
        self._beyond_limits = ""  # why the newest joint state was beyond the limits ('' = it was not)
        self._obs_seq = 0
        self._chunks = ChunkExecutor(kin, self._kf, self._counters, cfg.chunks, action_dt_s=cfg.action_dt_s,
                                     action_space=cfg.action_space, action_timeout_s=cfg.action_timeout_s,
                                     window=cfg.jitter_window)
        self._chunk_start = False  # the current tick started a plan
        # outputs
        self._gripper_cmd = cfg.gripper_initial
        self._hold = Hold(kin, joint_state_timeout_s=cfg.joint_state_timeout_s,
                          camera_timeout_s=cfg.camera_timeout_s, period_s=cfg.period_s)
        self._ticks = TickPeriods(cfg.period_s, cfg.deadline_tolerance, cfg.jitter_window)
        self._max_opening = float(kin.gripper_limits.upper.max()) if kin.gripper_joint_names else 0.0
        self._guard = CommandGuard(kin, period_s=cfg.period_s, action_dt_s=cfg.action_dt_s,
                                   gripper_velocity=cfg.gripper_velocity)
        self._gate = JointGate(kin, jump_confirm_s=cfg.jump_confirm_s, joint_limit_tolerance=cfg.joint_limit_tolerance)
        self._fallback = FallbackWindow(kin, self._kf, action_dt_s=cfg.action_dt_s, fallback_max_s=cfg.fallback_max_s)

    # --- inputs (any thread) ------------------------------------------------------------------
    def on_joint_state(self, q: np.ndarray, gripper_opening: float | None, now: float) -> str | None:
        """Store a measurement (arm order). Returns an error message if it was rejected, or a notice
        when the clock went back by more than a period (then the sample is taken, see
        ``_clock_went_back_locked``)."""
        q = np.array(q, dtype=float)  # a copy: the caller's array is no input history of ours
        notice = None
        with self._lock:
            if q.shape != (self.kin.n,) or not np.all(np.isfinite(q)):
                self._counters.add("inputs_rejected")
                return f"joint state rejected: expected {self.kin.n} finite positions, got {q}"
            if beyond := self._gate.beyond_limits(q):
                self._counters.add("inputs_rejected")
                self._counters.add("beyond_limits_rejected")
                self._beyond_limits = beyond
                return f"joint state rejected: {beyond}"
            self._beyond_limits = ""
            if now < self._q_rx:
                if self._q_rx - now <= self.config.period_s:
                    self._counters.add("inputs_rejected")
                    return f"joint state rejected: time went backwards ({now:.6f} < {self._q_rx:.6f})"
                notice = self._clock_went_back_locked("joint state", now, self._q_rx)
            if notice is not None:
                self._restart_locked()  # a new timeline: elapsed time to the last sample means nothing
            elif self._q is not None:
                verdict = self._gate.check(q, now, self._q, self._q_rx)
                if verdict == OUTLIER:  # counted and reported in the stats, nothing else changes
                    self._counters.add("outliers_rejected")
                    self._counters.last_outlier = self._gate.last_outlier
                    return None
                if verdict == JUMP:
                    self._counters.add("jumps_accepted")
                    self._restart_locked()
            self._kf.update(q, now)  # equal stamps are skipped by the filter
            self._q, self._q_rx = q, now
            if gripper_opening is not None and math.isfinite(gripper_opening):
                self._gripper_opening = float(gripper_opening)
        return notice

    def on_image(self, image: np.ndarray, now: float, camera: int = 0, stamp: float | None = None) -> str | None:
        """Store an RGB uint8 image (already at the model's input size) of camera ``camera`` (its
        image slot), stamped ``stamp`` by its sender (default: ``now``). A new observation exists
        once every camera has an image stamped within ``camera_sync_tolerance_s`` of the first's."""
        with self._lock:
            cameras = self._cameras
            what = "image" if len(cameras) == 1 else f"image of camera '{cameras.names[cameras.index(camera)]}'"
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                self._counters.add("inputs_rejected")
                return f"{what} rejected: expected uint8 HxWx3 RGB, got {image.dtype} {image.shape}"
            notice = None
            before = cameras.last_received(camera)
            if now < before:
                if before - now <= self.config.period_s:
                    self._counters.add("inputs_rejected")
                    return f"{what} rejected: time went backwards ({now:.6f} < {before:.6f})"
                notice = self._clock_went_back_locked(what, now, before)
            cameras.refused[camera] = ""
            if cameras.add(camera, image, now if stamp is None else float(stamp), now):
                self._obs_seq += 1
                self._new_obs.notify_all()
        return notice

    def on_image_refused(self, reason: str, camera: int = 0) -> None:
        """The node refused an image of camera ``camera`` (too large, undecodable, ...): nothing of
        it is used, and the camera stays as fresh as the last usable frame made it; once that is
        stale, the hold names ``reason``."""
        with self._lock:
            self._cameras.refused[self._cameras.index(camera)] = reason.strip()

    def _clock_went_back_locked(self, what: str, now: float, before: float) -> str:
        """The clock itself went back (sim reset, bag played again): arrival times are on that
        clock, so the sample is current. Motion history and pending actions belong to the old
        timeline; the other input keeps its old, now future, stamp and counts as stale until it
        arrives again (the watchdog holds meanwhile)."""
        self._kf.reset()
        self._chunks.queue.forget()
        self._ticks.last = None
        return (f"{what}: time went backwards by {before - now:.3f} s ({now:.6f} < {before:.6f}): clock reset, "
                f"filter and pending action dropped, holding until every input is current")

    def set_instruction(self, text: str) -> str | None:
        """Take ``text`` as the task (an action computed for another is never executed); returns why
        it was rejected instead (empty, or longer than ``max_instruction_chars``)."""
        text = text.strip()
        with self._lock:
            if not text:
                self._counters.add("inputs_rejected")
                return "instruction rejected: it is empty"
            if len(text) > self.config.max_instruction_chars:
                self._counters.add("inputs_rejected")
                return (f"instruction rejected: {len(text)} characters, more than max_instruction_chars = "
                        f"{self.config.max_instruction_chars}")
            if text != self._instruction:
                self._instruction = text
                self._chunks.queue.forget()  # an action for the old task must not be executed
        return None

    def set_enabled(self, enabled: bool) -> None:
        with self._lock:
            if enabled and not self._enabled:
                self._chunks.queue.forget()  # nothing decided while disabled is executed later
            self._enabled = bool(enabled)

    def set_inference_fault(self, reason: str) -> None:
        """The inference worker is down (its process died, ...): hold the measured position and report
        ``reason`` until it is cleared with ''. Extrapolating with the filter for the seconds a
        restart takes would carry the arm's last motion on."""
        with self._lock:
            self._hold.inference_fault = reason.strip()
            if self._hold.inference_fault:
                self._chunks.queue.forget()

    def set_config_fault(self, reason: str) -> None:
        """Hold the measured position with ``reason`` until cleared with '' (the node's set-up no
        longer matches the robot, e.g. a late robot description that differs)."""
        with self._lock:
            self._hold.config_fault = reason.strip()
            if self._hold.config_fault:
                self._chunks.queue.forget()

    def set_clock_fault(self, reason: str) -> None:
        """Hold the measured position with ``reason`` until cleared with '': the clock the core's
        times come from stopped (sim time without ``/clock``), so its watchdogs cannot judge
        freshness and no action can be timed."""
        with self._lock:
            self._hold.clock_fault = reason.strip()

    @property
    def clock_fault(self) -> str:
        return self._hold.clock_fault

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def instruction(self) -> str:
        return self._instruction

    # --- inference side -----------------------------------------------------------------------
    def wait_observation(self, after_seq: int, timeout: float) -> tuple[int, Observation] | None:
        """Block until an observation newer than ``after_seq`` exists (image, joints and an
        instruction) and the chunk schedule wants the next inference (``chunk_execution``);
        return (seq, observation) or None on timeout. ``stamp`` = image arrival."""
        with self._new_obs:
            ready = self._new_obs.wait_for(
                lambda: (self._obs_seq > after_seq and self._q is not None and bool(self._instruction)
                         and self._chunks.queue.wants_inference()), timeout
            )
            images = self._cameras.matched
            if not ready or images is None or self._q is None:
                return None
            opening = 0.0 if self._gripper_opening is None else self._gripper_opening
            obs = Observation(images[0], self._instruction, self._q.copy(),
                              float(np.clip(opening, 0.0, self._max_opening or np.inf)),
                              self._cameras.matched_received, extra_images=images[1:])
            return self._obs_seq, obs

    def on_action(self, action: np.ndarray, obs_stamp: float, now: float, instruction: str | None = None) -> str | None:
        """Hand over a verified action (of ``action_space``) computed from the observation stamped ``obs_stamp``."""
        return self.on_action_chunk(np.asarray(action, dtype=float).reshape(1, -1), obs_stamp, now, instruction)

    def on_action_chunk(self, actions: np.ndarray, obs_stamp: float, now: float,
                        instruction: str | None = None) -> str | None:
        """Hand over H verified actions (of ``action_space``) for H consecutive action steps, computed from the
        observation stamped ``obs_stamp`` (a chunked policy's output). The next tick plans them
        (aligned, re-anchored, blended with what the previous plan still holds); each step is used
        at most once, at the first tick it is due. A chunk of the wrong shape or with a non-finite
        value is rejected whole (the message says why): the arm goes on with what it has, then
        the fallback, then holds."""
        try:
            chunk = checked_chunk(actions, self._action_width)
        except ValueError as err:
            with self._lock:
                self._counters.add("inputs_rejected")
            return f"action rejected: {err}"
        with self._lock:
            if instruction is not None and instruction != self._instruction:
                self._counters.add("actions_expired")
                return "action dropped: the instruction changed while it was computed"
            self._chunks.receive(chunk, obs_stamp)
        return None

    # --- the tick -----------------------------------------------------------------------------
    def tick(self, now: float) -> TickResult:
        with self._lock:
            last_tick = self._ticks.last
            if last_tick is not None and now < last_tick - self.config.period_s:
                self._clock_went_back_locked("tick", now, last_tick)  # the watchdog holds below
            period = self._ticks.record(now)
            self._counters.add("ticks")
            if self._ticks.late(period):
                self._counters.add("deadline_misses")

            starved_before, self._fallback.starved_s = self._fallback.starved_s, 0.0
            self._chunk_start = False
            hold_reason = self._hold.why(
                now, joints_received=None if self._q is None else self._q_rx, beyond_limits=self._beyond_limits,
                cameras=self._cameras, enabled=self._enabled, instruction=self._instruction)
            if hold_reason:
                self._fallback.start = None  # the fallback window counts from the end of this hold
                q_cmd, source, reason = self._hold_locked(hold_reason), "hold", hold_reason
            else:
                q_cmd, source, reason = self._policy_or_fallback_locked(now)
            if source != "hold":
                self._hold.release()
            if self._fallback.starved_s > 0.0 and starved_before == 0.0:
                self._counters.add("fallback_expired")
            waiting = source == "fallback" and self.config.expect_actions or self._fallback.starved_s > 0.0
            if self._chunks.queue.started and waiting:
                self._counters.add("chunk_wait_ticks")  # between chunks: the wait for a task's first is not
            q_cmd, tripped = self._guard.arm(q_cmd, self._q)
            if tripped:
                self._counters.add("guard_trips")
            self._counters.add(f"{source}_ticks")
            fingers = self._guard.fingers(self._gripper_cmd, self._gripper_opening)
            if q_cmd is not None:
                self._counters.add("ticks_published")
                self._guard.returned(q_cmd, fingers)
            if self._chunks.queue.wants_inference():
                self._new_obs.notify_all()  # the schedule may have come due with this tick
            return TickResult(now, None if q_cmd is None else q_cmd.copy(), self._gripper_cmd, fingers, source,
                              reason, self._counters.snapshot(), period,
                              None if self._q is None else self._q.copy(), self._chunk_start)

    def _hold_locked(self, reason: str) -> np.ndarray | None:
        if self._q is not None and self._hold.target is None:  # the hold begins
            self._chunks.queue.forget(task_over=False)  # a hold between chunks still waits on them
        return self._hold.latch(reason, self._q)

    def _policy_or_fallback_locked(self, now: float) -> tuple[np.ndarray | None, str, str]:
        assert self._q is not None
        cfg = self.config
        if self._fallback.start is None:
            self._fallback.start = now
        self._chunk_start = self._chunks.start_pending(now, self._q)
        step = self._chunks.due_step(now, self._q)
        if isinstance(step, PolicyStep):
            self._fallback.start = now
            self._gripper_cmd = step.gripper
            return step.q, "policy", step.reason
        why = step  # no step due, or it expired
        if not cfg.expect_actions:  # no late action to stand in for: follow the (gated) measurement
            return self._q, "fallback", why + " (no policy): measured position"
        if starved := self._fallback.used_up(now):
            return self._hold_locked(starved), "hold", starved
        if cfg.chunks.holds_between_chunks and self._chunks.queue.started and self._guard.last_arm is not None:
            # The chunk will run from its first action, planned for the arm where the policy saw it.
            return self._guard.last_arm.copy(), "fallback", why + "; chunk_execution wait: holding the last command"
        q_pred, how = self._fallback.predict(now)
        return (self._q if q_pred is None else q_pred), "fallback", f"{why}; {how}"

    def _restart_locked(self) -> None:
        """The arm was moved from outside (episode reset, by hand) or the clock restarted: forget the
        motion, the pending action, the jump candidates and the hold target (a hold re-latches at the
        new position). The previous command stays: the commands ramp from it at the velocity limits."""
        self._kf.reset()
        self._chunks.queue.forget()
        self._hold.target = None
        self._gate.forget()

    # --- reporting ----------------------------------------------------------------------------
    @property
    def stats(self) -> TickStats:
        with self._lock:
            return self._counters.snapshot()

    @property
    def hold_reason(self) -> str:
        return self._hold.reason

    @property
    def action_starved_s(self) -> float:
        """Seconds without a fresh policy action at the last tick, when that made it hold (the
        fallback used up, ``fallback_max_s``); 0.0 otherwise. Persistently above 0 while a policy
        runs means inference is failing or stuck."""
        return self._fallback.starved_s

    @property
    def last_outlier(self) -> str:
        """Why the last gated joint-state sample was gated ('' = none yet)."""
        with self._lock:
            return self._counters.last_outlier

    def chunk_timing(self) -> dict[str, float]:
        """Observation to the first executed step of each plan (ms): p50, p99 over the recent window."""
        with self._lock:
            latency = np.asarray(self._chunks.queue.latency_s, dtype=float) * 1e3
        return obs_to_action_report(latency)

    def timing(self) -> dict[str, Any]:
        """Tick period statistics over the recent window (ms)."""
        with self._lock:
            periods = np.asarray(self._ticks.periods, dtype=float)
        return period_report(periods, self.config.period_s)
