"""The attempts of one call of :class:`~synapse_ha.client.cluster.ClusterClient`, and
the threads that run them.

A call that is safe to send twice (a read, or a write marked idempotent: a submission
carries a request id, so a duplicate returns the same job) is *hedged*: when the replica
asked last has not answered within ``hedge_s``, that attempt is left running and the
call moves on to the next replica, as if the silent one had failed. The first
definitive answer wins, whichever attempt gives it: an answer, or an error that is not
retried. The attempts still running then are abandoned (a blocking gRPC call cannot be
cancelled from another thread); each ends by its own per-try deadline, and what it ends
with still reaches the client (a replica silent to the end becomes suspect).

At most one attempt per replica is in flight. A replica with one in flight is *busy*:
the call does not ask it again, nor follow a redirect to it, until that attempt ends
(:class:`~synapse_ha.client.routing.Route`). So a frozen leader costs a fresh client
``hedge_s``, not the per-try deadline, and a healthy call that answers within
``hedge_s`` is sent to one replica only.

A call that is not hedged runs each attempt in the caller's thread, one after another.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synapse_ha.client.routing import Route

# How long a thread waits for another attempt to run before it ends.
IDLE_S = 30.0
# How long past the call's deadline its attempts may take to report how they ended
# (each attempt's own deadline is at or before the call's).
LATE_S = 1.0


class Workers:
    """Daemon threads that run attempts. An idle thread is reused; a new one starts when
    none is idle, so a hedge never waits for a thread. Each attempt ends by its own
    deadline, so the busy threads are the attempts in flight; an idle one ends after
    ``IDLE_S``, or at :meth:`close`. Daemon threads: a process exits without waiting for
    an attempt on a frozen replica. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # None: the thread that takes it ends (close).
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = 0  # threads free to take a task that no task was promised to
        self._closed = False
        self._threads = 0
        self.started = 0  # threads started so far

    @property
    def idle(self) -> int:
        """Threads waiting for an attempt to run."""
        with self._lock:
            return self._idle

    @property
    def threads(self) -> int:
        """Threads that have not ended."""
        with self._lock:
            return self._threads

    def run(self, task: Callable[[], None]) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
            else:
                self.started += 1
                self._threads += 1
        self._tasks.put(task)
        if start:
            threading.Thread(target=self._serve, name="synapse-client-attempt", daemon=True).start()

    def _serve(self) -> None:
        try:
            self._take_tasks()
        finally:
            with self._lock:
                self._threads -= 1

    def _take_tasks(self) -> None:
        while True:
            try:
                task = self._tasks.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # nothing was promised to this thread: it may end
                        self._idle -= 1
                        return
                    continue  # a task is on its way to the free threads: take it
            if task is None:
                return
            task()
            with self._lock:
                if self._closed:
                    return
                self._idle += 1

    def close(self) -> None:
        """End the idle threads, and each busy one once its attempt ends. Tasks run
        later still run, each on a thread of its own."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._tasks.put(None)


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended: ``result``, or ``error`` (whatever ``invoke`` raised)."""

    address: str
    result: Any = None
    error: Exception | None = None


class Flight:
    """The attempts of one call: :meth:`send` starts one, :meth:`next` reads the next to
    end. With ``workers`` they run there, side by side; without, :meth:`send` runs the
    attempt in the caller's thread. After :meth:`close`, every outcome not read (or
    still to come) goes to ``after_close``. Only the caller's thread uses it."""

    def __init__(
        self,
        invoke: Callable[[str, float], Any],
        workers: Workers | None,
        after_close: Callable[[Outcome], None],
    ) -> None:
        self._invoke = invoke
        self._workers = workers
        self._after_close = after_close
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.busy: set[str] = set()  # addresses of the attempts not yet read

    def send(self, address: str, per_try_s: float) -> None:
        self.busy.add(address)
        if self._workers is None:
            self._outcomes.put(self._attempt(address, per_try_s))
        else:
            self._workers.run(lambda: self._land(self._attempt(address, per_try_s)))

    def _attempt(self, address: str, per_try_s: float) -> Outcome:
        try:
            return Outcome(address, result=self._invoke(address, per_try_s))
        except Exception as exc:
            return Outcome(address, error=exc)

    def _land(self, outcome: Outcome) -> None:
        with self._lock:
            if not self._closed:
                self._outcomes.put(outcome)
                return
        self._after_close(outcome)

    def next(self, timeout_s: float) -> Outcome | None:
        """The next attempt to end, waiting up to ``timeout_s``; None if none did."""
        try:
            outcome = self._outcomes.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        self.busy.discard(outcome.address)
        return outcome

    def close(self) -> None:
        with self._lock:
            self._closed = True
        while True:
            try:
                outcome = self._outcomes.get_nowait()
            except queue.Empty:
                return
            self._after_close(outcome)


def fly(flight: Flight, route: Route, first: str, hedge_s: float | None) -> Outcome:
    """The first answer of the call that ``route`` steers, asking ``first`` first: an
    outcome with a result. Raises the error that ends the call (one not retried), or
    :class:`~synapse_ha.client.unavailable.ClusterUnavailable` after the deadline.
    With ``hedge_s``, the newest attempt unanswered after that long is left running and
    the next replica free is asked (:mod:`synapse_ha.client.attempts`)."""
    pending: str | None = first  # the replica to ask next, at ``send_at``
    send_at = time.monotonic()
    newest: str | None = None  # the attempt the route follows, until it ends or is hedged
    hedge_at = math.inf
    while True:
        now = time.monotonic()
        if pending is not None and now >= send_at:
            per_try = route.per_try(pending, now)
            if per_try > 0:
                flight.send(pending, per_try)
                newest, hedge_at = pending, now + (math.inf if hedge_s is None else hedge_s)
            pending = None
        if not flight.busy:
            if pending is None:
                raise route.unavailable(flight.busy)
            time.sleep(max(0.0, send_at - now))  # a back-off with nothing in flight
            send_at = -math.inf
            continue
        wake = route.deadline + LATE_S
        if pending is not None:
            wake = min(wake, send_at)
        if newest is not None:
            wake = min(wake, hedge_at)
        outcome = flight.next(wake - now)
        if outcome is None:
            now = time.monotonic()
            if now >= route.deadline + LATE_S:
                raise route.unavailable(flight.busy)
            if newest is not None and now >= hedge_at:
                pending, send_at = route.hedged(newest, flight.busy), now
                newest, hedge_at = None, math.inf
            continue
        if outcome.error is None:
            return outcome
        # Only the attempt the route follows steers it (or any, once none is left).
        steer = outcome.address == newest or (newest is None and pending is None)
        if outcome.address == newest:
            newest, hedge_at = None, math.inf
        turn = route.failed(outcome.address, outcome.error, flight.busy, steer=steer)
        if steer:
            pending, send_at = turn[0], time.monotonic() + turn[1]
