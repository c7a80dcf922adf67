"""Input errors counted by kind: a kind is the message with its numbers left out, so "joint state
rejected: 0.52 rad" and "... 0.61 rad" are one kind. The node counts every rejected input this
way (``~/stats`` reports the counts and the first message of each kind; :class:`InputErrorLog`
also keeps the newest ones for ``/diagnostics`` and says when a kind may be logged again); replay
lists them. Whatever the input, what is kept stays small: a message is cut to ``MAX_MESSAGE_CHARS``
(it may quote the input, e.g. an encoding string) and at most ``MAX_KINDS`` kinds are told apart,
the rest counted as one.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter, deque
from typing import Any

_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")
MAX_MESSAGE_CHARS = 300
MAX_KINDS = 64
OTHER_KINDS = "(other kinds)"


def error_kind(message: str) -> str:
    return _NUMBER.sub("#", message)


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with its full length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class InputErrorCounts:
    """How many errors of each kind, and the first message of each."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def add(self, message: str, count: int = 1) -> str:
        """Count ``message``; returns its kind (``OTHER_KINDS`` once ``MAX_KINDS`` are known)."""
        message = shorten(message)
        kind = error_kind(message)
        if kind not in self.by_kind and len(self.by_kind) >= MAX_KINDS:
            kind = OTHER_KINDS
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
            counts.examples = ({str(k): str(v) for k, v in (examples or {}).items()}
                               if isinstance(examples, dict) else {})
        return counts

    def lines(self) -> list[str]:
        """One line per kind: its first message and the count."""
        return [f"{self.examples.get(kind, kind)} (x{n})" for kind, n in self.by_kind.items()]


class InputErrorLog:
    """Every input the node rejected: counted in total and by kind, the newest message, the recent
    ones with their (monotonic) times, and each kind logged at most once per ``throttle_s``.
    Thread-safe: the node's callbacks and its camera intake add from different threads."""

    def __init__(self, throttle_s: float, keep: int = 64) -> None:
        self.throttle_s = throttle_s
        self.total = 0
        self.last = ""
        self.counts = InputErrorCounts()
        self._recent: deque[tuple[float, str]] = deque(maxlen=keep)
        self._logged: dict[str, float] = {}  # kind -> when it was last logged
        self._lock = threading.Lock()

    def add(self, message: str, now: float) -> bool:
        """Count ``message``, rejected at ``now``; True when its kind is due to be logged."""
        message = shorten(message)
        with self._lock:
            self.total += 1
            self.last = message
            self._recent.append((now, message))
            kind = self.counts.add(message)  # the same problem with other numbers is one kind
            if now - self._logged.get(kind, -math.inf) < self.throttle_s:
                return False
            self._logged[kind] = now
            return True

    def recent(self, now: float, window_s: float) -> list[str]:
        """The distinct messages of the last ``window_s`` seconds, oldest first."""
        with self._lock:
            return list(dict.fromkeys(m for t, m in self._recent if now - t <= window_s))

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"input_errors": self.total, "last_input_error": self.last, **self.counts.to_json()}
