"""The bounded event ring: resume after an index, or a clear expiry."""

from __future__ import annotations

import threading

import pytest

from synapse_ha.history.events import EventRing, EventsExpired
from synapse_ha.history.tracker import INDEX_SHIFT, Event, EventKind


def ev(command: int, k: int = 0) -> Event:
    return Event(index=command << INDEX_SHIFT | k, kind=EventKind.SUBMITTED, time_ms=command)


def test_resume_after_an_index_gives_exactly_what_followed() -> None:
    ring = EventRing(capacity=10)
    ring.extend([ev(1), ev(2), ev(2, 1), ev(3)])
    assert [e.index for e in ring.after(0)] == [
        ev(i, k).index for i, k in [(1, 0), (2, 0), (2, 1), (3, 0)]
    ]
    assert ring.after(ev(2).index) == [ev(2, 1), ev(3)]
    assert ring.after(ev(3).index) == []
    assert ring.after(ev(1).index, limit=1) == [ev(2)]


def test_an_index_older_than_the_ring_holds_expires_with_the_oldest_resumable_index() -> None:
    ring = EventRing(capacity=3)
    ring.extend([ev(i) for i in range(1, 6)])  # 1 and 2 evicted
    assert [e.time_ms for e in ring.after(0)] == [3, 4, 5]
    assert [e.time_ms for e in ring.after(ev(2).index)] == [3, 4, 5]  # nothing missed
    with pytest.raises(EventsExpired) as caught:
        ring.after(ev(1).index)
    assert caught.value.complete_after == ev(2).index


def test_a_restored_state_starts_the_ring_again() -> None:
    ring = EventRing(capacity=10)
    ring.extend([ev(1), ev(2)])
    ring.restart_at(40)
    assert ring.after(0) == []
    with pytest.raises(EventsExpired):
        ring.after(ev(2).index)
    ring.extend([ev(41)])
    assert ring.after(ring.complete_after) == [ev(41)]
    with pytest.raises(EventsExpired):  # command 40 was applied before the snapshot
        ring.after(ev(40, 5).index)


def test_a_waiting_reader_wakes_on_new_events() -> None:
    ring = EventRing(capacity=10)
    ring.extend([ev(1)])
    got: list[list[Event]] = []
    reader = threading.Thread(target=lambda: got.append(ring.wait_after(ev(1).index, 30.0)))
    reader.start()
    ring.extend([ev(2)])
    reader.join(timeout=30.0)
    assert got == [[ev(2)]]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        EventRing(capacity=0)
