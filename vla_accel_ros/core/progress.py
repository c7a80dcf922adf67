"""Progress of a long run, shown the same way by every command.

:func:`progress_bar` takes tqdm's common arguments. On a terminal it is a tqdm bar. Anywhere else (a
log file, a pipe, CI) a bar's carriage returns would fill the log, so it writes plain lines
instead: one when it starts, at most one every :data:`LINE_INTERVAL_S` while it runs, and one when
it ends. A run over episodes reports its running success rate (:meth:`LineProgress.success`, which a
tqdm bar gets as well): ``success 67% (2/3)``.

Importable without tqdm, which is imported only to draw a bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TextIO

LINE_INTERVAL_S = 30.0


def success_text(successes: int, episodes: int) -> str:
    """``67% (2/3)``: the running success rate, as every episode run shows it."""
    return f"{successes / episodes:.0%} ({successes}/{episodes})" if episodes else "-"


class LineProgress:
    """A progress report in whole lines, for output that is not a terminal (see the module docstring).
    Offers the part of tqdm's interface the package uses."""

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", disable: bool = False, stream: TextIO | None = None) -> None:
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if isinstance(iterable, Sized) else None)
        self.desc, self.unit, self.disable = desc, unit, disable
        self.stream = stream if stream is not None else sys.stderr
        self.n = 0
        self.postfix = ""
        self.started = time.monotonic()
        self._last_line = 0.0
        self._closed = False
        self._line()

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last_line >= LINE_INTERVAL_S:
            self._line()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def success(self, successes: int, episodes: int) -> None:
        self.set_postfix_str(f"success {success_text(successes, episodes)}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._line(done=True)

    def _line(self, done: bool = False) -> None:
        if self.disable:
            return
        self._last_line = time.monotonic()
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        elapsed = f", {self._last_line - self.started:.0f} s" if self.n or done else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {count} {self.unit}{elapsed}{postfix}{' (done)' if done else ''}",
              file=self.stream, flush=True)


def progress_bar(iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             disable: bool = False, stream: TextIO | None = None, **tqdm_options: Any) -> Any:
    """A tqdm bar over ``iterable`` (or ``total`` updates) when ``stream`` (default stderr) is a
    terminal, else a :class:`LineProgress`. Either has ``success(successes, episodes)`` to show
    the running success rate."""
    out = stream if stream is not None else sys.stderr
    if disable or not out.isatty():
        return LineProgress(iterable, total=total, desc=desc, unit=unit, disable=disable, stream=out)
    from tqdm import tqdm

    class Bar(tqdm):
        def success(self, successes: int, episodes: int) -> None:
            self.set_postfix_str(f"success {success_text(successes, episodes)}")

    return Bar(iterable, total=total, desc=desc, unit=unit, file=out, **tqdm_options)
