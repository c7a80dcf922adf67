"""/diagnostics for a node in front of a policy server (runtime/health.py, no rclpy): a refused API
key is an ERROR with the server's reason, and busy answers are said as busy, not as failures."""

from __future__ import annotations

from dataclasses import replace

from vla_accel_ros.runtime.health import ERROR, OK, WARN, Health, NodeState

RUNNING = NodeState(lifecycle="active", configured=True, stats={"inference_actions": 10}, clock_s=100.0,
                    tick_source="policy", tick_reason="fresh action", commanded=True, inference=True,
                    inference_alive=True)
REFUSED = "the openpi server refused the API key (HTTP 401: API key refused: wrong API key)"
BUSY_ERROR = ("ServerError: ws://h:1: the openpi server is busy (overloaded), retrying on the next observation: "
              "busy: 1 requests waiting (bound 1); try again later")


def health() -> Health:
    return Health(report_period_s=1.0, stale_after_s=0.5, action_timeout_s=0.5, fallback_max_s=0.25)


def test_a_refused_key_is_an_error_saying_so_while_the_server_refuses_it():
    h = health()
    refused = replace(RUNNING, tick_source="hold", tick_reason="no fresh action", action_starved_s=2.0,
                      stats={"inference_actions": 0, "inference_errors": 6, "inference_server_api_key_refusals": 2,
                             "inference_server_api_key_refused": REFUSED,
                             "inference_last_error": f"ServerError: ws://h:1: not connected: {REFUSED}"})
    report = h.assess(refused)
    assert (report.level, report.message) == (ERROR, f"{REFUSED}; holding: no fresh action")  # not "inference failed"
    taken = replace(RUNNING, stats={**refused.stats, "inference_actions": 3, "inference_server_api_key_refused": ""})
    assert (h.assess(taken).level, h.assess(taken).message) == (OK, "running (policy)")


def test_busy_answers_are_said_as_busy_not_as_failures():
    h = health()
    busy = replace(RUNNING, tick_source="fallback", stats={"inference_actions": 10, "inference_errors": 2,
                                                           "inference_server_busy": 2,
                                                           "inference_last_error": BUSY_ERROR})
    report = h.assess(busy)
    assert report.level == WARN
    assert report.message == ("policy server busy: 2 request(s) answered 'busy' (overloaded); each next observation "
                              "is sent again")
    # one more busy answer and one other failure since the last report: both said, each for what it is
    mixed = replace(busy, stats={**busy.stats, "inference_errors": 4, "inference_server_busy": 3,
                                 "inference_last_error": "ServerError: ws://h:1: no reply within 0.5 s"})
    assert h.assess(mixed).message == (
        "policy server busy: 1 request(s) answered 'busy' (overloaded); each next observation is sent again; "
        "inference failed 1 time(s): ServerError: ws://h:1: no reply within 0.5 s")
    assert h.assess(mixed).level == OK  # nothing new since: the busy answers are over


def test_an_arm_starved_by_a_busy_server_is_an_error_naming_the_overload():
    h = health()
    starved = replace(RUNNING, tick_source="hold", tick_reason="fallback used up", action_starved_s=0.7,
                      stats={"inference_actions": 10, "inference_errors": 3, "inference_server_busy": 3,
                             "inference_latency_ms_p50": 30.0, "inference_last_error": BUSY_ERROR})
    report = h.assess(starved)
    assert report.level == ERROR and report.message == (
        "policy server busy: 3 request(s) answered 'busy' (overloaded); each next observation is sent again; "
        "no fresh policy action for 0.70 s (fallback_max_s = 0.25 s)")
