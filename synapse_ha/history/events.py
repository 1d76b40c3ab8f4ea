"""The replica's recent events, in a bounded ring that readers can wait on.

The ring holds the newest ``capacity`` events (default :data:`DEFAULT_CAPACITY`) that
this replica derived from its applied commands (:mod:`synapse_ha.history.tracker`), and
remembers ``complete_after``: every event with a larger index is in the ring. A reader
that resumes after index ``i`` gets everything it missed when ``i >= complete_after``;
older than that (evicted, or from before this replica started or restored a snapshot),
:meth:`EventRing.after` raises :class:`EventsExpired` naming the oldest index it could
resume from.

Appended on the apply thread; read from any thread.
"""

from __future__ import annotations

import threading
from collections import deque

from synapse_ha.history.tracker import INDEX_SHIFT, Event

DEFAULT_CAPACITY = 10_000


class EventsExpired(Exception):
    """The events after ``since`` are no longer all held here."""

    def __init__(self, since: int, complete_after: int) -> None:
        super().__init__(
            f"events after index {since} are no longer held by this replica; the oldest "
            f"index to resume from is {complete_after}"
        )
        self.since = since
        self.complete_after = complete_after


class EventRing:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._events: deque[Event] = deque()
        self._cond = threading.Condition()
        self.complete_after = 0
        self._closed = False

    def restart_at(self, applied_commands: int) -> None:
        """The state was replaced by one at ``applied_commands`` (a restored snapshot):
        events before it were never seen here. Drop what is held and start again."""
        with self._cond:
            self._events.clear()
            self.complete_after = ((applied_commands + 1) << INDEX_SHIFT) - 1
            self._cond.notify_all()

    def extend(self, events: list[Event]) -> None:
        if not events:
            return
        with self._cond:
            for event in events:
                if len(self._events) >= self.capacity:
                    evicted = self._events.popleft()
                    self.complete_after = max(self.complete_after, evicted.index)
                self._events.append(event)
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiting reader for good (the replica stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def newest_index(self) -> int:
        with self._cond:
            return self._events[-1].index if self._events else self.complete_after

    def after(self, since: int, limit: int = 1000) -> list[Event]:
        """Up to ``limit`` held events with index > ``since``, oldest first. ``since``
        0 means from the oldest held. Raises :class:`EventsExpired` when events after
        ``since`` may have been missed."""
        with self._cond:
            return self._after(since, limit)

    def _after(self, since: int, limit: int) -> list[Event]:
        if since and since < self.complete_after:
            raise EventsExpired(since, self.complete_after)
        events = self._events
        if not events or events[-1].index <= since:
            return []
        # Binary search on the index (a deque supports O(1) access near its ends only;
        # the ring is bounded, so this is a few dozen steps).
        lo, hi = 0, len(events)
        while lo < hi:
            mid = (lo + hi) // 2
            if events[mid].index <= since:
                lo = mid + 1
            else:
                hi = mid
        return [events[i] for i in range(lo, min(lo + limit, len(events)))]

    def wait_after(self, since: int, timeout_s: float, limit: int = 1000) -> list[Event]:
        """As :meth:`after`, waiting up to ``timeout_s`` for at least one event."""
        with self._cond:
            found = self._after(since, limit)
            if found or self._closed:
                return found
            self._cond.wait(timeout_s)
            return self._after(since, limit)
