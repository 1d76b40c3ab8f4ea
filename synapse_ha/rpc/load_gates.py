"""Admission on a replica: heavy reads, and the per-identity stream slots of DESIGN §8
(the submit rate and pending holds are the use cases': :mod:`synapse_ha.service.limits`).

Heavy reads: a replica's reads must never starve its Raft and heartbeats.

A read served from a snapshot holds no lock, but it still costs CPU, and on a replica
that CPU is shared with pysyncobj (which must answer its peers within the election
timeout) and with the heartbeats of every node (which must be answered within the
lease). A storm of full ``ListJobs`` calls from dashboards once cost a leader its term.

:class:`ReadGate` bounds heavy reads (lists, explanations, state dumps) two ways:

* **concurrency**: at most ``concurrency`` run at once; the rest wait their turn;
* **CPU share**: a token bucket of CPU seconds that refills at ``cpu_share`` seconds per
  wall-clock second (burst ``burst_s``); each admitted read pays the CPU time its thread
  actually used, and then what encoding its answer cost (:func:`metered`: gRPC
  encodes an answer after its handler returns, and a listing's encoding costs half as
  much again as building it). While the bucket is empty, new reads wait.

A read that cannot start within ``max_wait_s`` is refused with OVERLOADED
(RESOURCE_EXHAUSTED), which clients retry after a back-off. Cheap reads (one job, the
cluster summary) and every write bypass the gate.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class Overloaded(Exception):
    """The read was not admitted within the wait limit."""

    def __init__(self, waited_s: float, reason: str) -> None:
        super().__init__(f"replica overloaded by reads ({reason}); waited {waited_s:.2f} s")
        self.waited_s = waited_s
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GateStats:
    admitted: int
    refused: int
    running: int
    credit_s: float


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """The bounds of heavy reads (see the module's description); a concurrency below 1
    or a CPU share outside (0, 64] raises ValueError."""

    concurrency: int = 2
    cpu_share: float = 0.3
    burst_s: float = 0.5
    max_wait_s: float = 2.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 < self.cpu_share <= 64:
            raise ValueError("cpu_share must be in (0, 64]")


DEFAULT_READ_LIMITS = ReadLimits()


class ReadGate:
    """Thread-safe. ``clock`` is monotonic wall time, ``cpu_clock`` the calling thread's
    CPU time; both are injectable for tests."""

    def __init__(
        self,
        limits: ReadLimits = DEFAULT_READ_LIMITS,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._cond = threading.Condition()
        self._running = 0
        self._credit = limits.burst_s
        self._refilled_at = clock()
        self._admitted = 0
        self._refused = 0

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._refilled_at)
        self._refilled_at = now
        self._credit = min(self.limits.burst_s, self._credit + elapsed * self.limits.cpu_share)

    def _blocked(self) -> str:
        if self._running >= self.limits.concurrency:
            return f"{self._running} heavy reads running"
        if self._credit <= 0:
            return f"read CPU share {self.limits.cpu_share:.0%} of a core used up"
        return ""

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Run the body as one heavy read, or raise :class:`Overloaded`."""
        started = self._clock()
        deadline = started + self.limits.max_wait_s
        with self._cond:
            while True:
                now = self._clock()
                self._refill(now)
                why = self._blocked()
                if not why:
                    break
                if now >= deadline:
                    self._refused += 1
                    raise Overloaded(now - started, why)
                # The bucket refills with time, not only on release: wake to re-check.
                wait = deadline - now
                if self._running < self.limits.concurrency and self._credit <= 0:
                    wait = min(wait, -self._credit / self.limits.cpu_share + 0.001)
                self._cond.wait(timeout=max(0.001, wait))
            self._running += 1
            self._admitted += 1
        cpu_before = self._cpu_clock()
        try:
            yield
        finally:
            used = max(0.0, self._cpu_clock() - cpu_before)
            with self._cond:
                self._running -= 1
                self._refill(self._clock())
                self._credit -= used
                self._cond.notify_all()
            _admitted.gate = self  # the answer's encoding, next on this thread, pays here

    def charge(self, cpu_s: float) -> None:
        """Take ``cpu_s`` seconds of CPU spent on a heavy read after it left the gate."""
        with self._cond:
            self._refill(self._clock())
            self._credit -= max(0.0, cpu_s)

    def stats(self) -> GateStats:
        with self._cond:
            self._refill(self._clock())
            return GateStats(self._admitted, self._refused, self._running, self._credit)


# The gate that admitted the last heavy read of each thread: gRPC encodes a handler's
# answer on the handler's thread, right after it returns.
_admitted = threading.local()


def metered(encode: Callable[[T], bytes]) -> Callable[[T], bytes]:
    """``encode`` (a heavy read's answer serializer), its CPU time charged to the gate
    that admitted the read on this thread (:meth:`ReadGate.charge`); an answer no gate
    admitted (a refusal's) is encoded as it is."""

    def run(message: T) -> bytes:
        gate: ReadGate | None = getattr(_admitted, "gate", None)
        _admitted.gate = None
        if gate is None:
            return encode(message)
        before = gate._cpu_clock()
        try:
            return encode(message)
        finally:
            gate.charge(gate._cpu_clock() - before)

    return run


# ------------------------------------------------------- per-identity streams (DESIGN §8)


@dataclass(frozen=True, slots=True)
class StreamRefusal:
    """Why a stream was not opened: the limit's name, its value and the count now."""

    limit: str
    allowed: int
    actual: int


class StreamSlots:
    """Open streams on this replica (each holds a server thread): per identity and in
    all for callers the limits bind, and a fixed number more for those they do not
    (admins, replicas), so that no user can lock them out. Thread-safe."""

    def __init__(self, unlimited_slots: int = 16) -> None:
        self.unlimited_slots = unlimited_slots
        self._lock = threading.Lock()
        self._by_identity: Counter[str] = Counter()
        self._limited = 0
        self._unlimited = 0

    def acquire(
        self, who: str, limited: bool, per_identity: int, total: int
    ) -> StreamRefusal | None:
        """Take a slot for ``who``, or say which limit refuses it."""
        with self._lock:
            if not limited:
                if self._unlimited >= self.unlimited_slots:
                    return StreamRefusal("unlimited_streams", self.unlimited_slots, self._unlimited)
                self._unlimited += 1
                return None
            mine = self._by_identity[who]
            if mine >= per_identity:
                return StreamRefusal("watch_streams_per_identity", per_identity, mine)
            if self._limited >= total:
                return StreamRefusal("watch_streams_total", total, self._limited)
            self._by_identity[who] += 1
            self._limited += 1
            return None

    def release(self, who: str, limited: bool) -> None:
        with self._lock:
            if not limited:
                self._unlimited -= 1
                return
            self._by_identity -= Counter({who: 1})  # keeps only identities holding some
            self._limited -= 1

    def held(self, who: str) -> int:
        with self._lock:
            return self._by_identity[who]
