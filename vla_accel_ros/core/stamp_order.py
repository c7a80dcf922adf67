"""Header stamps of each input in order. A stamp a little older than the newest one of its input
(within ``tolerance_s``, the watchdogs' span) is out-of-order delivery: that message is dropped.
Much older, the sender's clock was reset: the stamps are followed from there. Both are named for
the node's report; unset (zero) stamps pass.
"""

from __future__ import annotations


class StampOrder:
    def __init__(self, tolerance_s: float) -> None:
        self.tolerance_s = tolerance_s
        self._newest: dict[str, float] = {}  # input -> its newest stamp

    def check(self, what: str, stamp: float) -> tuple[bool, str]:
        """Whether to take ``what``'s message stamped ``stamp`` (seconds), and the problem to report
        ('' when none)."""
        last = self._newest.get(what)
        if stamp <= 0.0 or last is None or stamp >= last:
            self._newest[what] = max(stamp, last or 0.0)
            return True, ""
        back = last - stamp
        if back <= self.tolerance_s:
            return False, (f"{what} dropped: header stamp {stamp:.6f} is {back:.3f} s older than the previous one "
                           f"(out-of-order delivery)")
        self._newest[what] = stamp
        return True, f"{what}: header stamps went back by {back:.3f} s (sender clock reset?); following them"
