"""The per-identity limits a replica keeps in memory (DESIGN §8): each identity's
submit rate, and the submissions checked against the pending-jobs caps but not yet
applied."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class SubmitRate:
    """A token bucket per identity: ``burst`` submissions at once, refilled at ``per_s``
    a second (the replicated ``Limits``, passed at each call so a change applies at
    once). Each replica keeps its own buckets and charges the calls it receives.

    Thread-safe; ``clock`` is monotonic seconds. Memory is bounded: buckets that are full
    again are forgotten once more than ``max_identities`` are held."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_identities: int = 10_000
    ) -> None:
        self._clock = clock
        self._max = max_identities
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # who -> (tokens, at)

    def take(self, who: str, burst: int, per_s: int, count: int = 1) -> float:
        """Charge ``count`` submissions (at most ``burst``) to ``who``: 0.0 when allowed,
        else the seconds until the bucket holds that many again (nothing is charged
        then)."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(who, (float(burst), now))
            tokens = min(float(burst), tokens + max(0.0, now - at) * per_s)
            if tokens < count:
                self._buckets[who] = (tokens, now)
                return (count - tokens) / per_s
            self._buckets[who] = (tokens - count, now)
            if len(self._buckets) > self._max:
                self._forget_full(now, burst, per_s)
            return 0.0

    def _forget_full(self, now: float, burst: int, per_s: int) -> None:
        for who, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * per_s >= burst:
                del self._buckets[who]


class PendingInFlight:
    """Submissions that passed the pending-jobs check and are not applied yet, per owner
    and per queue, so that concurrent submissions cannot overshoot the caps between the
    check and the commit. Thread-safe: check and :meth:`hold` under :attr:`lock`, then
    :meth:`release` once the proposal has an outcome."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._owner: dict[str, int] = {}
        self._queue: dict[str, int] = {}

    def counts(self, owner: str, queue: str) -> tuple[int, int]:
        """Held for ``owner`` and for ``queue``; call with :attr:`lock` held."""
        return self._owner.get(owner, 0), self._queue.get(queue, 0)

    def hold(self, owner: str, queue: str, jobs: int = 1) -> None:
        """Count ``jobs`` more (an array's tasks); call with :attr:`lock` held."""
        self._owner[owner] = self._owner.get(owner, 0) + jobs
        self._queue[queue] = self._queue.get(queue, 0) + jobs

    def release(self, owner: str, queue: str, jobs: int = 1) -> None:
        with self.lock:
            for counts, key in ((self._owner, owner), (self._queue, queue)):
                left = counts.get(key, 0) - jobs
                if left > 0:
                    counts[key] = left
                else:
                    counts.pop(key, None)
