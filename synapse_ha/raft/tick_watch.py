"""How regularly the Raft thread runs.

pysyncobj does everything on one thread, in ticks a few milliseconds apart: a leader
sends its heartbeats and entries there, a follower reads them and judges the leader's
silence there. When that thread is not run for a while (the process starved of CPU, the
interpreter lock held by busy threads, a long apply or snapshot, a garbage collection),
a leader falls silent and its followers stand for election after the election timeout,
though nothing failed. :class:`TickWatch` measures the interval between the starts of
two ticks and counts the **stalls**: intervals longer than half the shortest election
timeout, the point from which a silent leader risks its term. A stall is split in two:
the time the previous tick itself took (its work on the Raft thread, such as applying
entries, a snapshot or a disk write, and its waits for the interpreter lock) and the time
from its end to the next start (the thread waiting to run: a process short of CPU, other
threads holding the interpreter lock, a garbage collection). The longest interval and
the stalls are in the replica's metrics (``synapse_raft_longest_tick_interval_seconds``,
``synapse_raft_tick_stalls_total``), and a stall is logged, at most once per
``warn_every_s`` with the count of those in between: the cause to look for when an
election happened with every replica up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stall:
    """A stall to log: its interval, how much of it the previous tick took (the rest the
    thread waited to run again), and the stalls not logged since the last line."""

    interval_s: float
    worked_s: float
    unlogged: int


class TickWatch:
    """Called by the Raft thread only (at the start of each tick); its figures are read
    from any thread (plain ints and floats)."""

    def __init__(self, warn_every_s: float = 10.0) -> None:
        self.warn_every_s = warn_every_s
        self.stalls = 0
        self.longest_interval_s = 0.0
        self._last_start: float | None = None
        self._last_end: float | None = None
        self._last_warned: float | None = None
        self._unlogged = 0

    def tick(self, now: float, stall_after_s: float) -> Stall | None:
        """A tick starts at ``now`` (seconds, a monotonic clock); the stall to log when
        the interval since the last tick's start is over ``stall_after_s``."""
        last, self._last_start = self._last_start, now
        ended, self._last_end = self._last_end, None
        if last is None:
            return None
        interval = now - last
        self.longest_interval_s = max(self.longest_interval_s, interval)
        if interval <= stall_after_s:
            return None
        self.stalls += 1
        if self._last_warned is not None and now - self._last_warned < self.warn_every_s:
            self._unlogged += 1
            return None
        unlogged, self._unlogged = self._unlogged, 0
        self._last_warned = now
        worked = interval if ended is None else min(interval, max(0.0, ended - last))
        return Stall(interval, worked, unlogged)

    def ended(self, now: float) -> None:
        """The tick that started last ends at ``now``."""
        self._last_end = now
