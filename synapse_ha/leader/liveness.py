"""When the leader last heard from each node (:class:`Liveness`): recorded by the
heartbeat handlers, read by the leader loop's reaper. Local to the leader, never
replicated."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Liveness:
    """When the leader last heard from each node. Local to the leader, never replicated.

    ``baseline_ms`` is the current leader's election time, or the end of its latest stall:
    a node not heard from since counts as heard then. Thread-safe (heartbeat handlers
    record, the loop reads).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heard: dict[str, int] = {}
        self._baseline_ms = 0

    def reset(self, now_ms: int) -> None:
        with self._lock:
            self._heard.clear()
            self._baseline_ms = now_ms

    def raise_baseline(self, now_ms: int) -> None:
        """Count every node as heard at ``now_ms`` at the latest (after a stall)."""
        with self._lock:
            self._baseline_ms = max(self._baseline_ms, now_ms)

    def heard(self, node_id: str, now_ms: int) -> None:
        with self._lock:
            if now_ms > self._heard.get(node_id, 0):
                self._heard[node_id] = now_ms

    def heard_since_election(self, node_id: str) -> int | None:
        with self._lock:
            return self._heard.get(node_id)

    def silences(self, node_ids: Iterable[str], now_ms: int) -> dict[str, int]:
        """How long each of ``node_ids`` has been silent at ``now_ms``, under one lock."""
        with self._lock:
            heard = self._heard.get
            baseline = self._baseline_ms
            return {n: now_ms - max(heard(n, 0), baseline) for n in node_ids}

    def overdue(
        self, node_ids: Iterable[str], now_ms: int, late_after_ms: int, dead_after_ms: int
    ) -> tuple[int, list[tuple[str, int]]]:
        """In one pass under one lock: how many of ``node_ids`` have been silent longer
        than ``late_after_ms`` at ``now_ms``, and those silent longer than
        ``dead_after_ms``, each with its silence, in the order given (silences counted as
        :meth:`silences` counts them). The reaper asks at every step about every node:
        this builds no dictionary of all silences and sorts none."""
        late = 0
        dead: list[tuple[str, int]] = []
        late_before, dead_before = now_ms - late_after_ms, now_ms - dead_after_ms
        with self._lock:
            baseline = self._baseline_ms
            if baseline >= late_before and baseline >= dead_before:
                return late, dead  # every node counts as heard since the baseline
            heard = self._heard.get
            for node_id in node_ids:
                last = max(heard(node_id, 0), baseline)
                if last < late_before:
                    late += 1
                if last < dead_before:
                    dead.append((node_id, now_ms - last))
        return late, dead
