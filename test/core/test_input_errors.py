"""Input errors counted by kind (the numbers left out), and their round trip through ~/stats."""

from __future__ import annotations

import json

import pytest

from vla_accel_ros.core.input_errors import InputErrorCounts, error_kind


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
