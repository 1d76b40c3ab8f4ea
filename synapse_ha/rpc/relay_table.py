"""The leader's table of the followers that relay workers' heartbeats
(:mod:`synapse_ha.rpc.relay`), and which one a registering worker is sent to."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Collection

RELAY_FRESH_S = 1.0  # the leader names a follower's streams while it relayed this lately


class RelayTable:
    """The leader's view of the followers that relay: their stream addresses and when
    each last sent a batch. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, float]] = {}

    def heard(self, replica_id: str, stream_address: str) -> None:
        with self._lock:
            self._seen[replica_id] = (stream_address, self._clock())

    def fresh(self) -> dict[str, str]:
        """Replica id → stream address of every follower that relayed lately."""
        oldest = self._clock() - RELAY_FRESH_S
        with self._lock:
            return {r: a for r, (a, at) in self._seen.items() if at >= oldest and a}

    def pick(self, node_id: str, avoid: Collection[str] = ()) -> str:
        """The stream address ``node_id``'s worker should use: one of the fresh followers'
        (not one it could not reach lately), chosen by a stable hash of the node id so the
        workers spread evenly; "" when there is none."""
        addresses = [a for _, a in sorted(self.fresh().items()) if a not in avoid]
        if not addresses:
            return ""
        return addresses[zlib.crc32(node_id.encode()) % len(addresses)]
