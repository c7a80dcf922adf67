"""The node's /diagnostics classification (runtime/health.py), on plain values: no rclpy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vla_accel_ros.runtime.health import ERROR, OK, WARN, Health, NodeState

RUNNING = NodeState(lifecycle="active", configured=True, stats={"inference_actions": 10}, clock_s=100.0,
                    tick_source="policy", tick_reason="fresh action", commanded=True, inference=True,
                    inference_alive=True)


def health(report_period_s: float = 1.0) -> Health:
    return Health(report_period_s=report_period_s, stale_after_s=0.5, action_timeout_s=0.5, fallback_max_s=0.25)


@pytest.mark.parametrize("state, level, message", [
    (NodeState(lifecycle="unconfigured", configured=False, stats={}, clock_s=0.0), WARN,
     "unconfigured: not commanding (lifecycle)"),
    (replace(RUNNING, lifecycle="inactive"), WARN, "inactive: not commanding (lifecycle)"),
    (replace(RUNNING, commanded=False, tick_reason=""), ERROR, "no tick yet"),
    (replace(RUNNING, commanded=False, tick_reason="no joint state yet"), ERROR, "no joint state yet"),
    (replace(RUNNING, inference_alive=False, stats={"inference_down_reason": "child died 3 times"}), ERROR,
     "inference worker stopped: child died 3 times"),
    (replace(RUNNING, inference_alive=False, stats={"inference_last_error": "OSError: x"}), ERROR,
     "inference worker stopped: OSError: x"),
    (replace(RUNNING, inference_alive=False, stats={}), ERROR, "inference worker stopped: thread ended"),
    (replace(RUNNING, action_starved_s=0.3, tick_source="hold", tick_reason="fallback used up",
             stats={"inference_actions": 10, "inference_latency_ms_p50": 400.0}), ERROR,
     "no fresh policy action for 0.30 s (fallback_max_s = 0.25 s, action_timeout_s = 0.5 s): inference takes 400 ms "
     "(p50); use a faster decoder or device, or a policy that predicts action chunks"),
    (replace(RUNNING, action_starved_s=1.1, tick_source="hold", tick_reason="fallback used up",
             stats={"inference_errors": 4, "inference_last_error": "OSError: x"}), ERROR,
     "inference gives no actions for 1.10 s (fallback_max_s = 0.25 s): it fails: OSError: x; inference failed 4 "
     "time(s): OSError: x"),
    (replace(RUNNING, tick_source="hold", tick_reason="disabled"), WARN, "holding: disabled"),
    (replace(RUNNING, inference=False, inference_alive=False), OK, "running (policy)"),
    (replace(RUNNING, tick_source="hold", clock_stopped="clock stopped: no /clock for 1.2 s"), ERROR,
     "clock stopped: no /clock for 1.2 s"),
    (replace(RUNNING, stall="control loop stalled 1 time(s)"), WARN, "control loop stalled 1 time(s)"),
    (RUNNING, OK, "running (policy)"),
])
def test_the_state_sets_the_level(state, level, message):
    report = health().assess(state)
    assert (report.level, report.message) == (level, message)


def test_a_first_action_still_loading_is_no_error():
    starved = replace(RUNNING, stats={}, action_starved_s=5.0, tick_source="hold", tick_reason="no action yet")
    assert health().assess(starved).level == WARN


def test_warnings_raise_a_running_node_to_warn_and_say_what_degrades_it():
    h = health()
    state = replace(RUNNING, warnings=("the checkpoint's robot differs",),
                    stats={"inference_errors": 2, "inference_last_error": "ValueError: bad", "outliers_rejected": 1,
                           "last_outlier": "joint3 jumped"},
                    recent_input_errors=("image rejected: 0x0", "joint state rejected: NaN"))
    report = h.assess(state)
    assert report.level == WARN and report.message == (
        "the checkpoint's robot differs; inference failed 2 time(s): ValueError: bad; input rejected: joint state "
        "rejected: NaN; 1 joint-state outlier(s) gated: joint3 jumped")
    assert report.recent_input_errors == ["image rejected: 0x0", "joint state rejected: NaN"]
    # the counts are since the last report: nothing new, only the standing warning
    again = h.assess(replace(state, recent_input_errors=()))
    assert again.message == "the checkpoint's robot differs"


def test_a_warning_is_appended_to_a_degraded_state():
    report = health().assess(replace(RUNNING, tick_source="hold", tick_reason="camera stale",
                                     recent_input_errors=("image rejected: 0x0",)))
    assert report.level == WARN and report.message == "holding: camera stale; input rejected: image rejected: 0x0"
    starved = replace(RUNNING, commanded=False, tick_reason="no joint state yet", warnings=("decoder fallback",))
    assert health().assess(starved).level == ERROR  # a warning never lowers the level


def test_a_long_kalman_fallback_says_no_fresh_policy_action_came():
    h = health()
    h.ticked("policy", 100.0)
    h.ticked("fallback", 100.05)
    fallback = replace(RUNNING, tick_source="fallback", clock_s=100.3)
    assert h.assess(fallback).level == OK  # within stale_after_s
    report = h.assess(replace(fallback, clock_s=100.8))
    assert report.level == WARN and report.message == (
        "no fresh policy action for 0.80 s (inference slow or stuck): Kalman fallback")
    assert health().assess(replace(fallback, inference=False, clock_s=200.0)).level == OK


def test_an_unconfigured_node_reports_no_warnings_and_counts_nothing():
    h = health()
    idle = NodeState(lifecycle="unconfigured", configured=False, stats={"inference_errors": 3}, clock_s=0.0,
                     recent_input_errors=("image rejected: 0x0",))
    assert h.assess(idle).recent_input_errors == []
    report = h.assess(replace(RUNNING, stats={"inference_errors": 3, "inference_last_error": "x"}))
    assert "inference failed 3 time(s)" in report.message  # counted from the first configured report


def test_the_window_of_recent_errors_covers_at_least_one_report():
    assert health(report_period_s=0.1).window_s == 2.0
    assert health(report_period_s=20.0).window_s == 20.0


def test_actions_that_expire_before_use_are_an_error_naming_the_inference_time_and_action_timeout_s():
    h = health()
    slow = replace(RUNNING, action_starved_s=2.4, tick_source="hold", tick_reason="no fresh policy action",
                   stats={"inference_actions": 3, "inference_latency_ms_p50": 1170.0, "actions_expired": 3})
    report = h.assess(slow)
    assert report.level == ERROR and report.message == (
        "policy actions expire before use (3 expired, none used for 2.40 s): inference takes 1170 ms (p50) and "
        "action_timeout_s is 0.5 s; raise action_timeout_s above the inference time, or use a faster decoder or "
        "device")
    # the expired actions are counted from one report to the next
    later = h.assess(replace(slow, stats={**slow.stats, "inference_actions": 4, "actions_expired": 4}))
    assert later.level == ERROR and later.message.startswith("policy actions expire before use (1 expired,")
    # a fallback that has not run out is no error, whatever expired
    assert h.assess(replace(slow, action_starved_s=0.0, tick_source="fallback")).level == OK
