"""The control node's health as ``/diagnostics`` reports it: one level and message from the node's
state, its statistics and the input it rejected lately. ROS-free; the node maps the level to
diagnostic_msgs/DiagnosticStatus.

The state sets the level: not active (WARN), no command yet (ERROR), the node's clock stopped
(ERROR: the wall-clock watchdog holds), the inference worker stopped (ERROR), a policy server that
refuses the node's API key (ERROR, with the server's reason: the arm falls back, then holds, while
it refuses it), the arm holding because the policy gave no usable action for ``fallback_max_s``
while inference has run or failed (ERROR; :func:`starved_advice` says why: the actions expired
before use, inference is slower than the fallback window, or inference fails, naming the measured
inference time, ``action_timeout_s`` and what to change), holding (WARN), else running (OK). What
degrades a configured node since the last report raises it to WARN at least: a standing warning (the
checkpoint's robot differs, the decoder's fallbacks), a stall of the control loop (overdue now or
within its hold-off, ``runtime/stalls.py``), a policy server's new ``busy`` answers (it is
overloaded; the next observation is sent again, and these are not reported as failures), new
inference failures, rejected input, gated joint-state outliers, and the Kalman fallback standing in
for want of fresh policy actions. An arm starved while the server answers busy is an ERROR that
says the server is busy."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OK, WARN, ERROR = 0, 1, 2
MIN_WINDOW_S = 2.0  # the shortest window of recent input errors a report looks back over


@dataclass(frozen=True)
class NodeState:
    """What the node is at one report, in plain values."""

    lifecycle: str  # unconfigured, inactive, active or finalized
    configured: bool  # configure built the controller
    stats: Mapping[str, Any]  # the node's ~/stats
    clock_s: float  # the node's clock now
    tick_source: str = ""  # of the last tick: policy, fallback or hold; '' before the first
    tick_reason: str = ""
    commanded: bool = False  # the last tick gave a command
    inference: bool = False  # an inference worker serves the node
    inference_alive: bool = False
    action_starved_s: float = 0.0  # the controller's: > 0 while it holds, the fallback used up
    warnings: Sequence[str] = ()  # standing ones: the robot check, the decoder's fallbacks
    recent_input_errors: Sequence[str] = ()  # the distinct ones of the report's window, oldest first
    clock_stopped: str = ""  # why the wall-clock watchdog holds ('' = the node's clock runs)
    stall: str = ""  # the control loop's stall report ('' = none overdue or recent)


@dataclass(frozen=True)
class Report:
    level: int  # OK, WARN or ERROR
    message: str
    recent_input_errors: list[str]  # reported beside the node's stats


class Health:
    """The classification of the module docstring. It counts inference failures and outliers from
    one report to the next, and remembers the newest policy action's stamp (:meth:`ticked`)."""

    def __init__(self, report_period_s: float, stale_after_s: float, *, action_timeout_s: float,
                 fallback_max_s: float) -> None:
        """``report_period_s``: the time between reports; ``stale_after_s``: how long the Kalman
        fallback may stand in before the report says no fresh policy action came;
        ``action_timeout_s``, ``fallback_max_s``: the node's, named when the policy starves the arm."""
        self.window_s = max(MIN_WINDOW_S, report_period_s)
        self.stale_after_s = stale_after_s
        self.action_timeout_s = action_timeout_s
        self.fallback_max_s = fallback_max_s
        self._expired_seen = 0
        self._inference_errors_seen = 0
        self._busy_seen = 0
        self._outliers_seen = 0
        self._last_policy_stamp: float | None = None

    def ticked(self, source: str, stamp: float) -> None:
        """A tick of ``source`` at ``stamp`` (the node's clock)."""
        if source == "policy" or self._last_policy_stamp is None:
            self._last_policy_stamp = stamp

    def assess(self, state: NodeState) -> Report:
        expired = int(state.stats.get("actions_expired", 0) or 0)
        new_expired, self._expired_seen = expired - self._expired_seen, expired
        busy = int(state.stats.get("inference_server_busy", 0) or 0)
        new_busy, self._busy_seen = busy - self._busy_seen, busy
        busy_line = busy_note(new_busy) if new_busy > 0 else ""
        level, message = self._level(state, new_expired, busy_line)
        if not state.configured:
            return Report(level, message, [])
        warning = self._warning(state, max(new_busy, 0), "" if busy_line in message else busy_line)
        if warning:
            level = max(level, WARN)
            message = warning if message.startswith("running") else f"{message}; {warning}"
        return Report(level, message, list(state.recent_input_errors))

    def _level(self, state: NodeState, new_expired: int, busy_line: str) -> tuple[int, str]:
        stats = state.stats
        if not state.configured or state.lifecycle != "active":
            return WARN, f"{state.lifecycle}: not commanding (lifecycle)"
        if not state.commanded:
            return ERROR, state.tick_reason or "no tick yet"
        if state.clock_stopped:
            return ERROR, state.clock_stopped
        if state.inference and not state.inference_alive:
            why = stats.get("inference_down_reason") or stats.get("inference_last_error") or "thread ended"
            return ERROR, f"inference worker stopped: {why}"
        refused = str(stats.get("inference_server_api_key_refused") or "") if state.inference else ""
        if refused:
            doing = f"holding: {state.tick_reason}" if state.tick_source == "hold" else f"running ({state.tick_source})"
            return ERROR, f"{refused}; {doing}"
        if (state.inference and state.action_starved_s > 0.0
                and (stats.get("inference_errors") or stats.get("inference_actions"))):
            if busy_line:  # the server is overloaded, not the policy slow: say that
                return ERROR, (f"{busy_line}; no fresh policy action for {state.action_starved_s:.2f} s "
                               f"(fallback_max_s = {self.fallback_max_s:g} s)")
            return ERROR, starved_advice(
                starved_s=state.action_starved_s, inference_ms=stats.get("inference_latency_ms_p50"),
                action_timeout_s=self.action_timeout_s, fallback_max_s=self.fallback_max_s,
                expired=new_expired, failing=not stats.get("inference_actions"),
                last_error=str(stats.get("inference_last_error") or ""))
        if state.tick_source == "hold":
            return WARN, f"holding: {state.tick_reason}"
        return OK, f"running ({state.tick_source})"

    def _warning(self, state: NodeState, new_busy: int, busy_line: str) -> str:
        """What degrades the node since the last report, '' when nothing does (``new_busy``: the
        server's busy answers since then; ``busy_line``: what to say of them, '' when said already)."""
        stats = state.stats
        warnings = list(state.warnings)
        if state.stall:
            warnings.append(state.stall)
        errors = int(stats.get("inference_errors", 0) or 0)
        new_errors, self._inference_errors_seen = errors - self._inference_errors_seen, errors
        if busy_line:
            warnings.append(busy_line)
        # a refused API key is the level's message already; a busy answer counts as a worker error too
        if new_errors - new_busy > 0 and not stats.get("inference_server_api_key_refused"):
            failed = new_errors - new_busy
            warnings.append(f"inference failed {failed} time(s): {stats.get('inference_last_error', '')}")
        if state.recent_input_errors:
            warnings.append(f"input rejected: {state.recent_input_errors[-1]}")
        outliers = int(stats.get("outliers_rejected", 0) or 0)
        new_outliers, self._outliers_seen = outliers - self._outliers_seen, outliers
        if new_outliers > 0:
            warnings.append(f"{new_outliers} joint-state outlier(s) gated: {stats.get('last_outlier', '')}")
        last = self._last_policy_stamp
        stale = state.clock_s - (last if last is not None else state.clock_s)
        if state.inference and state.tick_source == "fallback" and stale > self.stale_after_s:
            warnings.append(f"no fresh policy action for {stale:.2f} s (inference slow or stuck): Kalman fallback")
        return "; ".join(warnings)


def busy_note(answers: int) -> str:
    """What ``answers`` busy answers of a policy server since the last report say."""
    return (f"policy server busy: {answers} request(s) answered 'busy' (overloaded); each next observation is "
            "sent again")


def starved_advice(*, starved_s: float, inference_ms: float | None, action_timeout_s: float, fallback_max_s: float,
                   expired: int, failing: bool, last_error: str = "", timeout_name: str = "action_timeout_s") -> str:
    """Why the policy gave the arm no usable action for ``starved_s`` (longer than ``fallback_max_s``)
    and what to change, in one line: ``expired`` actions expired before use (the newest ones:
    ``inference_ms``, the measured inference time, against ``action_timeout_s``), inference only
    failed (``failing``, ``last_error``), or it is slower than the fallback window.
    ``timeout_name``: how the reader sets ``action_timeout_s`` (the parameter, or a command's flag)."""
    took = (f"inference takes {inference_ms:.0f} ms (p50)" if inference_ms is not None and math.isfinite(inference_ms)
            else "no inference time measured yet")
    if failing:
        return (f"inference gives no actions for {starved_s:.2f} s (fallback_max_s = {fallback_max_s:g} s): it fails"
                + (f": {last_error}" if last_error else ""))
    if expired > 0:
        return (f"policy actions expire before use ({expired} expired, none used for {starved_s:.2f} s): {took} "
                f"and action_timeout_s is {action_timeout_s:g} s; raise {timeout_name} above the inference time, "
                "or use a faster decoder or device")
    return (f"no fresh policy action for {starved_s:.2f} s (fallback_max_s = {fallback_max_s:g} s, "
            f"action_timeout_s = {action_timeout_s:g} s): {took}; use a faster decoder or device, or a policy "
            "that predicts action chunks")
