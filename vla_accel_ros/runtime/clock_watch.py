"""The control node's watchdog for a stopped clock: it looks twice a period on the wall clock and
says when the node's clock has stopped (sim time without ``/clock``): neither a tick nor a move of
the node's clock for ``stall_after_periods`` periods, at least ``CLOCK_STOPPED_MIN_S``. The node
then holds the arm and ticks once a period on the wall clock until its control timer ticks again.
It also measures the node's clock's steps under sim time, which widen the future-stamp tolerance of
the inputs. ROS-free: the node passes the times in.
"""

from __future__ import annotations

# The node's clock standing still this long on the wall clock (and stall_after_periods periods) is a
# stopped clock. A sim's /clock under load pauses for a while (0.14-0.24 s seen on a loaded host):
# that is no reason to drop the policy's actions and hold; its robot stood still too.
CLOCK_STOPPED_MIN_S = 0.5
MAX_CLOCK_LAG_S = 1.0  # the most a /clock step widens the future-stamp tolerance


class ClockWatch:
    """Wall times are ``time.monotonic()``; ``now`` is the node's clock."""

    def __init__(self, period_s: float, stall_after_periods: float) -> None:
        self.period_s = period_s
        self.stopped_after_s = max(stall_after_periods * period_s, CLOCK_STOPPED_MIN_S)
        self.step_s = 0.0  # use_sim_time: the clock's last step between two looks (a /clock period or more), <= 1 s
        self._tick_wall = 0.0  # the last tick
        self._clock_value = 0.0  # the node's clock at the last look
        self._clock_moved = 0.0  # when the last look saw the node's clock move
        self._stopped_at = 0.0  # the last tick before the clock stopped

    def restart(self, wall: float, now: float) -> None:
        """The control timer starts (activate)."""
        self._tick_wall = self._clock_moved = wall
        self._clock_value = now

    def ticked(self, wall: float) -> None:
        self._tick_wall = wall

    def stopped_for(self, wall: float) -> float:
        """Since the last tick before the clock stopped."""
        return wall - self._stopped_at

    def look(self, wall: float, now: float, sim_time: bool, stopped: bool) -> tuple[bool, str]:
        """One look; ``stopped``: the clock counts as stopped already (the node holds). Returns
        (tick now on the wall clock, why the clock counts as stopped from now on: '' unless it
        stopped at this look)."""
        if now != self._clock_value:
            if sim_time:  # the clock moves in /clock steps
                self.step_s = min(max(now - self._clock_value, 0.0), MAX_CLOCK_LAG_S)
            self._clock_value, self._clock_moved = now, wall
        if stopped:
            return wall - self._tick_wall >= 0.99 * self.period_s, ""  # looked at twice a period: tick once
        # Looked at every half period: the last look before the bound comes within half a period of it.
        still = wall - max(self._tick_wall, self._clock_moved)
        if still < self.stopped_after_s - 0.5 * self.period_s:
            return False, ""  # ticking, or the clock moves and a tick is merely late (the stall report names it)
        self._stopped_at = self._tick_wall
        return True, (f"clock stopped: the node's clock has stood at {now:.3f} s for {still:.3f} s (use_sim_time "
                      f"without /clock?); holding, one command per period on the wall clock")
