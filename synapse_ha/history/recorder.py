"""The replica's apply observer: events into the ring per applied batch, history into
SQLite later, on a writer thread of its own.

:meth:`HistoryRecorder.observe` runs on the thread that applies commands, under the
apply lock, after every applied command: it asks the :class:`Tracker` what the command
did (O(records touched)) and keeps the events and history records. :meth:`applied`
follows once per applied batch (a committed Raft entry holds the commands proposed
together): the batch's events go to the :class:`EventRing` in one append (one wake-up
of its readers) and its records to the writer as one item. The writer commits them to
the :class:`HistoryStore` in transactions of many batches: it is woken only when it
waits for work with nothing queued, then lingers for :data:`WRITE_LINGER_S` while more
arrive, without being woken for them, and writes everything queued at once. Neither
method raises (a failure is logged and counted in :attr:`HistoryRecorder.errors`): an
exception there would wedge the Raft log.

:meth:`flush` waits until the writer has committed everything queued; the replica calls
it before writing a Raft snapshot, so that no record is only in memory when the journal
entries it came from are dropped. A crash between an apply and its write is covered by
:meth:`restored`: a restored state's finished jobs and ended attempts are written again
(idempotently).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import AppliedCommand
from synapse_ha.history.events import DEFAULT_CAPACITY, EventRing
from synapse_ha.history.store import FILE_NAME, HistoryStore
from synapse_ha.history.tracker import AttemptRecord, Event, JobRecord, Tracker

log = logging.getLogger(__name__)

_Batch = tuple[list[AttemptRecord], list[JobRecord]]

# Once woken, the writer gathers what is queued for this long (or until this many
# batches wait) into one transaction: a commit costs far more than a row. A flush or a
# stop cuts it short.
WRITE_LINGER_S = 0.05
MAX_BATCHES_PER_WRITE = 2000


class HistoryRecorder:
    def __init__(
        self,
        store: HistoryStore | None,
        ring: EventRing | None = None,
        tracker: Tracker | None = None,
        linger_s: float = WRITE_LINGER_S,
    ) -> None:
        """``store`` None keeps events only (no SQLite history)."""
        self.store = store
        self.ring = ring or EventRing(DEFAULT_CAPACITY)
        self.tracker = tracker or Tracker()
        self.linger_s = linger_s
        self.errors = 0
        # What the commands observed since the last applied() produced (apply thread).
        self._events: list[Event] = []
        self._attempts: list[AttemptRecord] = []
        self._jobs: list[JobRecord] = []
        # The writer's queue and its state, under one lock: _work wakes the writer,
        # _done wakes whoever waits in flush().
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)
        self._pending: list[_Batch] = []
        self._idle = False  # the writer waits for work: the next batch wakes it
        self._hurry = False  # a flush or a full queue: write without lingering
        self._stop = False
        self._queued = 0  # batches handed to the writer
        self._written = 0  # batches it has written (or failed to)
        self.wakeups = 0  # times the writer took up queued work (woken, or finding it)
        self.writes = 0  # transactions it committed
        self._writer: threading.Thread | None = None
        if store is not None:
            self._writer = threading.Thread(target=self._write, name="history-writer", daemon=True)
            self._writer.start()

    @classmethod
    def in_dir(cls, data_dir: Path | str, capacity: int = DEFAULT_CAPACITY) -> HistoryRecorder:
        return cls(HistoryStore(Path(data_dir) / FILE_NAME), EventRing(capacity))

    @property
    def queued_batches(self) -> int:
        """Batches of records handed to the writer so far."""
        with self._lock:
            return self._queued

    # ------------------------------------------------------------- apply thread

    def observe(self, entry: AppliedCommand) -> None:
        """After a command was applied; what it produced is published by the next
        :meth:`applied`."""
        try:
            step = self.tracker.step(entry)
            self._events += step.events
            self._attempts += step.attempts
            self._jobs += step.jobs
        except Exception:
            self.errors += 1
            log.exception("history: could not record an applied command")

    def applied(self) -> None:
        """The batch of commands observed since the previous call is applied: its events
        into the ring, its records to the writer, each in one piece."""
        try:
            events, self._events = self._events, []
            attempts, self._attempts = self._attempts, []
            jobs, self._jobs = self._jobs, []
            self.ring.extend(events)
            if attempts or jobs:
                self._enqueue((attempts, jobs))
        except Exception:
            self.errors += 1
            log.exception("history: could not publish applied commands")

    def restored(self, state: ClusterState) -> None:
        """The state was replaced by a restored snapshot."""
        self.applied()  # what came before it, in order
        try:
            step = self.tracker.reset(state)
            self.ring.restart_at(state.applied_commands)
            if step.attempts or step.jobs:
                self._enqueue((step.attempts, step.jobs))
        except Exception:
            self.errors += 1
            log.exception("history: could not take over a restored state")

    def _enqueue(self, batch: _Batch) -> None:
        if self.store is None:
            return
        with self._lock:
            self._pending.append(batch)
            self._queued += 1
            if len(self._pending) >= MAX_BATCHES_PER_WRITE:
                self._hurry = True
                self._work.notify()
            elif self._idle:
                self._idle = False
                self._work.notify()

    # ------------------------------------------------------------------- writer

    def _write(self) -> None:
        while True:
            batches, stop = self._gather()
            if batches:
                self._commit(batches)
            if stop:
                return

    def _gather(self) -> tuple[list[_Batch], bool]:
        """Wait for work, linger for more, and take everything queued; and whether the
        recorder stops."""
        with self._lock:
            while not self._pending and not self._stop:
                self._idle = True
                self._hurry = False  # nothing is left for a flush to wait for
                self._work.wait()
            self._idle = False
            if self._pending:
                self.wakeups += 1
            deadline = time.monotonic() + self.linger_s
            while not (self._stop or self._hurry):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._work.wait(left)
            self._hurry = False
            batches, self._pending = self._pending, []
            return batches, self._stop

    def _commit(self, batches: list[_Batch]) -> None:
        store = self.store
        assert store is not None
        attempts = [a for b in batches for a in b[0]]
        jobs = [j for b in batches for j in b[1]]
        try:
            store.write(attempts, jobs)
            self.writes += 1
        except Exception:
            self.errors += 1
            log.exception("history: could not write %d record(s)", len(attempts) + len(jobs))
        with self._lock:
            self._written += len(batches)
            self._done.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        if self.store is None:
            return True
        with self._lock:
            target = self._queued
            if self._written >= target:
                return True
            self._hurry = True
            self._work.notify()
            return self._done.wait_for(lambda: self._written >= target, timeout_s)

    def close(self) -> None:
        """Stop the writer once it has written everything queued."""
        self.ring.close()
        if self._writer is not None:
            with self._lock:
                self._stop = True
                self._work.notify()
            self._writer.join(timeout=10.0)
            self._writer = None
        if self.store is not None:
            self.store.close()
