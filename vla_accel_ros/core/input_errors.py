"""Input errors counted by kind: a kind is the message with its numbers left out, so "joint state
rejected: 0.52 rad" and "... 0.61 rad" are one kind. The node counts every rejected input this
way (``~/stats`` reports the counts and the first message of each kind); replay lists them.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")


def error_kind(message: str) -> str:
    return _NUMBER.sub("#", message)


class InputErrorCounts:
    """How many errors of each kind, and the first message of each."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def add(self, message: str, count: int = 1) -> str:
        """Count ``message``; returns its kind."""
        kind = error_kind(message)
        self.examples.setdefault(kind, message)
        self.by_kind[kind] += count
        return kind

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def to_json(self) -> dict[str, Any]:
        return {"input_errors_by_kind": dict(self.by_kind), "input_error_examples": dict(self.examples)}

    @classmethod
    def from_json(cls, stats: dict[str, Any]) -> InputErrorCounts:
        """The counts a node reported in its ``~/stats`` (empty when it reported none)."""
        counts = cls()
        by_kind = stats.get("input_errors_by_kind")
        examples = stats.get("input_error_examples")
        if isinstance(by_kind, dict):
            counts.by_kind.update({str(k): int(v) for k, v in by_kind.items()})
            counts.examples = {str(k): str(v) for k, v in (examples or {}).items()} if isinstance(examples, dict) else {}
        return counts

    def lines(self) -> list[str]:
        """One line per kind: its first message and the count."""
        return [f"{self.examples.get(kind, kind)} (x{n})" for kind, n in self.by_kind.items()]
