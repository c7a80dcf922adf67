"""Header stamps of each input in order. A stamp a little older than the newest one of its input
(within ``tolerance_s``, the watchdogs' span) is out-of-order delivery: that message is dropped.
Much older, the sender's clock was reset: the stamps are followed from there. A stamp further ahead
of the node's clock than ``future_tolerance_s`` (plus the clock's lag: under sim time the node's clock
stands still between two ``/clock`` messages, so a message may arrive up to one ``/clock`` step before
the clock reaches its stamp) is refused and leaves the newest stamp as it was, so one message from the
future cannot make the good ones after it look out of order. Each is named for
the node's report; unset (zero) stamps pass, and so does any stamp while the node's clock has not
started (sim time before the first ``/clock``).
"""

from __future__ import annotations

import math


class StampOrder:
    def __init__(self, tolerance_s: float, future_tolerance_s: float = math.inf) -> None:
        self.tolerance_s = tolerance_s
        self.future_tolerance_s = future_tolerance_s
        self._newest: dict[str, float] = {}  # input -> its newest stamp

    def check(self, what: str, stamp: float, now: float = 0.0, clock_lag_s: float = 0.0) -> tuple[bool, str]:
        """Whether to take ``what``'s message stamped ``stamp`` (seconds) at ``now`` on the node's
        clock (0: not started), which may lag the sender's by up to ``clock_lag_s`` (sim time: the
        last ``/clock`` step), and the problem to report ('' when none)."""
        if stamp > 0.0 and now > 0.0 and stamp - now > self.future_tolerance_s + clock_lag_s:
            lag = f" + the clock's last step {clock_lag_s:.3f} s" if clock_lag_s > 0.0 else ""
            return False, (f"{what} refused: header stamp {stamp:.6f} is {stamp - now:.3f} s ahead of the node's "
                           f"clock (future_stamp_tolerance_s = {self.future_tolerance_s:g}{lag})")
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
