"""Input errors counted by kind (the numbers left out), their round trip through ~/stats, and the
node's log of them (throttled, the recent ones kept)."""

from __future__ import annotations

import json

import pytest

from vla_accel_ros.core.input_errors import InputErrorCounts, InputErrorLog, error_kind


@pytest.mark.parametrize("messages, expected", [
    ([], {}),
    (["image rejected: 0x0"] * 3, {"image rejected: #x#": 3}),
    (["joint state rejected: 0.52 rad", "joint state rejected: -1e-3 rad", "image rejected: bad encoding 'yuv'"],
     {"joint state rejected: # rad": 2, "image rejected: bad encoding 'yuv'": 1}),
])
def test_every_kind_is_counted_apart_with_its_first_message(messages, expected):
    counts = InputErrorCounts()
    for m in messages:
        counts.add(m)
    assert dict(counts.by_kind) == expected and counts.total == len(messages)
    for kind in expected:
        assert error_kind(counts.examples[kind]) == kind
    again = InputErrorCounts.from_json(json.loads(json.dumps(counts.to_json())))
    assert again.by_kind == counts.by_kind and again.lines() == counts.lines()
    assert len(counts.lines()) == len(expected)


def test_stats_without_counts_give_none():
    assert InputErrorCounts.from_json({"input_errors": 3}).total == 0


def test_the_log_counts_every_error_logs_each_kind_once_per_throttle_and_keeps_the_recent_ones():
    log = InputErrorLog(throttle_s=10.0)
    assert log.add("image rejected: 0x0", now=100.0) is True
    assert log.add("image rejected: 2x0", now=105.0) is False  # the same kind, within the throttle
    assert log.add("joint state rejected: NaN", now=106.0) is True  # another kind
    assert log.add("image rejected: 0x0", now=111.0) is True  # the throttle has passed
    assert log.to_json() == {"input_errors": 4, "last_input_error": "image rejected: 0x0",
                             **log.counts.to_json()}
    assert log.counts.by_kind["image rejected: #x#"] == 3
    assert log.recent(now=111.0, window_s=7.0) == ["image rejected: 2x0", "joint state rejected: NaN",
                                                   "image rejected: 0x0"]
    assert log.recent(now=111.0, window_s=5.5) == ["joint state rejected: NaN", "image rejected: 0x0"]


def test_what_the_log_keeps_stays_small_whatever_the_input():
    from vla_accel_ros.core.input_errors import MAX_KINDS, MAX_MESSAGE_CHARS, OTHER_KINDS

    log = InputErrorLog(throttle_s=10.0)
    huge = "x" * 1_000_000
    log.add(f"unsupported image encoding '{huge}'", now=0.0)
    assert len(log.last) < MAX_MESSAGE_CHARS + 40 and log.last.endswith("(1000029 chars)")
    for k in range(3 * MAX_KINDS):  # an encoding string that never repeats: a kind each
        log.add(f"unsupported image encoding '{chr(0x4e00 + k)}'", now=1.0)
    assert len(log.counts.by_kind) == MAX_KINDS + 1 and log.total == 3 * MAX_KINDS + 1
    assert log.counts.by_kind[OTHER_KINDS] == 2 * MAX_KINDS + 1
    assert len(json.dumps(log.to_json())) < 64 * MAX_KINDS * 8
