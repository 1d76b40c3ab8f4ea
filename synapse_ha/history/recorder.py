"""The replica's apply observer: events into the ring at once, history into SQLite later.

:meth:`HistoryRecorder.observe` runs on the thread that applies commands, under the
apply lock, after every applied command: it asks the :class:`Tracker` what the command
did (O(records touched)), appends the events to the :class:`EventRing` and queues the
history records for its own writer thread, which commits them to the
:class:`HistoryStore` in batches. It never raises (a failure is logged and counted in
:attr:`HistoryRecorder.errors`): an exception there would wedge the Raft log.

:meth:`flush` waits until the writer has committed everything queued; the replica calls
it before writing a Raft snapshot, so that no record is only in memory when the journal
entries it came from are dropped. A crash between an apply and its write is covered by
:meth:`restored`: a restored state's finished jobs and ended attempts are written again
(idempotently).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState
from synapse_ha.history.events import DEFAULT_CAPACITY, EventRing
from synapse_ha.history.store import FILE_NAME, HistoryStore
from synapse_ha.history.tracker import AttemptRecord, JobRecord, Tracker

log = logging.getLogger(__name__)

_Batch = tuple[list[AttemptRecord], list[JobRecord]]

# The writer gathers what is queued for up to this long (or this many commands' records)
# into one transaction: a commit costs far more than a row. A flush cuts it short.
WRITE_LINGER_S = 0.05
MAX_BATCHES_PER_WRITE = 2000
_HURRY = "hurry"


class HistoryRecorder:
    def __init__(
        self,
        store: HistoryStore | None,
        ring: EventRing | None = None,
        tracker: Tracker | None = None,
    ) -> None:
        """``store`` None keeps events only (no SQLite history)."""
        self.store = store
        self.ring = ring or EventRing(DEFAULT_CAPACITY)
        self.tracker = tracker or Tracker()
        self.errors = 0
        # Batches of records; None stops the writer; _HURRY ends its lingering (flush).
        self._queue: queue.SimpleQueue[_Batch | str | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._queued = 0
        self._written = 0
        self._writer: threading.Thread | None = None
        if store is not None:
            self._writer = threading.Thread(target=self._write, name="history-writer", daemon=True)
            self._writer.start()

    @classmethod
    def in_dir(cls, data_dir: Path | str, capacity: int = DEFAULT_CAPACITY) -> HistoryRecorder:
        return cls(HistoryStore(Path(data_dir) / FILE_NAME), EventRing(capacity))

    # ------------------------------------------------------------- apply thread

    def observe(
        self,
        command: cmd.Command,
        result: cmd.Result,
        job_ids: set[str] | None,
        node_ids: set[str] | None,
        state: ClusterState,
    ) -> None:
        """After ``command`` was applied to ``state``; see the module docstring."""
        try:
            step = self.tracker.step(command, result, job_ids, node_ids, state)
            self.ring.extend(step.events)
            if step.attempts or step.jobs:
                self._enqueue((step.attempts, step.jobs))
        except Exception:
            self.errors += 1
            log.exception("history: could not record an applied command")

    def restored(self, state: ClusterState) -> None:
        """The state was replaced by a restored snapshot."""
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
        with self._done:
            self._queued += 1
        self._queue.put(batch)

    # ------------------------------------------------------------------- writer

    def _write(self) -> None:
        store = self.store
        assert store is not None
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            if isinstance(batch, str):
                continue
            batches = [batch]
            stop = False
            linger_until = time.monotonic() + WRITE_LINGER_S
            while len(batches) < MAX_BATCHES_PER_WRITE:  # one transaction for many
                try:
                    more = self._queue.get(timeout=max(0.0, linger_until - time.monotonic()))
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                if isinstance(more, str):
                    break
                batches.append(more)
            attempts = [a for b in batches for a in b[0]]
            jobs = [j for b in batches for j in b[1]]
            try:
                store.write(attempts, jobs)
            except Exception:
                self.errors += 1
                log.exception("history: could not write %d record(s)", len(attempts) + len(jobs))
            with self._done:
                self._written += len(batches)
                self._done.notify_all()
            if stop:
                return

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        if self.store is None:
            return True
        with self._done:
            target = self._queued
            if self._written >= target:
                return True
        self._queue.put(_HURRY)
        with self._done:
            return self._done.wait_for(lambda: self._written >= target, timeout_s)

    def close(self) -> None:
        self.ring.close()
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=10.0)
            self._writer = None
        if self.store is not None:
            self.store.close()
