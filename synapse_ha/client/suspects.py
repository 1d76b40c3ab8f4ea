"""Replicas that did not answer at all, as :class:`~synapse_ha.client.cluster.ClusterClient`
keeps them.

A leader that froze (its process stopped, its machine hung) or was cut off closes no
connection: a call to it waits for its whole deadline, and its followers keep naming it
in their NOT_LEADER redirects until they elect another. A replica that gave no answer
(UNAVAILABLE without a reason, or the per-try deadline) is therefore *suspect* for a
while: calls start at another replica, a redirect to it is not followed (the next replica
is asked instead, as after NO_LEADER), and the first try there in a call waits at most
``try_s`` (later ones in the same call the whole per-try deadline: it may only be slow).
It stays in the rotation, so a leader whose only fault was one lost answer is still
reached; the first answer it gives clears it.

A hedged call (:mod:`synapse_ha.client.attempts`) does not wait for such a replica past
the hedge delay even before it is suspect; an attempt left unanswered there still makes
it suspect when its deadline passes, after the call was answered elsewhere.
"""

from __future__ import annotations

import threading
import time

import grpc

from synapse_ha.rpc.errors import Reason, RpcFailure


def silent(failure: RpcFailure) -> bool:
    """The replica gave no answer at all: unreachable, or the per-try deadline passed."""
    return failure.reason is Reason.UNKNOWN and failure.code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def as_no_leader(failure: RpcFailure) -> RpcFailure:
    """A redirect to a suspect replica, taken as NO_LEADER: ask the next replica."""
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, Reason.NO_LEADER, failure.message, {})


class Suspects:
    """Thread-safe. ``for_s``: how long an address stays suspect; ``try_s``: the per-try
    deadline at a suspect address."""

    def __init__(self, for_s: float, try_s: float) -> None:
        self.for_s = for_s
        self.try_s = try_s
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}  # address -> monotonic time it stays suspect

    def add(self, address: str) -> None:
        with self._lock:
            self._until[address] = time.monotonic() + self.for_s

    def clear(self, address: str) -> None:
        with self._lock:
            self._until.pop(address, None)

    def __contains__(self, address: object) -> bool:
        with self._lock:
            until = self._until.get(address) if isinstance(address, str) else None
            if until is not None and until <= time.monotonic():
                del self._until[address]  # type: ignore[arg-type]
                return False
            return until is not None
