"""Proposals to the Raft log, group-committed: commands queue, leave together as one
framed log entry (:mod:`synapse_ha.raft.batch`) while at most a few entries replicate,
and each proposal's :class:`~concurrent.futures.Future` settles from its entry's
outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pysyncobj.config import FAIL_REASON

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.versioned import encode_command
from synapse_ha.leader.ports import ProposalError
from synapse_ha.raft.batch import frame


class ProposalBatcher:
    """The proposal queue and the thread that sends it to the log in batches.

    ``max_batch`` commands at most leave as one entry; ``max_batches_in_flight`` entries
    at most replicate at once; an entry whose callback has not come after
    ``batch_forget_s`` (leadership moved) stops counting as in flight.

    ``append(entry, callback=...)`` appends one framed entry to the log (the replicated
    method of :class:`~synapse_ha.raft.replicated_state.ReplicatedState`); pysyncobj
    calls ``callback(result, error)`` once the entry is applied here or has failed."""

    def __init__(self, append: Callable[..., Any], batch_forget_s: float) -> None:
        self._append = append
        self.max_batch = 512
        self.max_batches_in_flight = 2
        self.batch_forget_s = batch_forget_s
        self._batch_cond = threading.Condition()
        self._queue: list[tuple[bytes, Future[cmd.Result]]] = []
        self._in_flight: dict[int, float] = {}
        self._batch_seq = 0
        self._stopping = False
        self._batcher = threading.Thread(
            target=self._send_batches, name="raft-batcher", daemon=True
        )

    def start(self) -> None:
        self._batcher.start()

    def stop(self) -> None:
        with self._batch_cond:
            self._stopping = True
            self._batch_cond.notify_all()
        self._batcher.join(timeout=2.0)

    def propose(self, command: cmd.Command) -> Future[cmd.Result]:
        """Queue ``command`` for the next batch; see :meth:`RaftReplica.propose
        <synapse_ha.raft.replica.RaftReplica.propose>`."""
        future: Future[cmd.Result] = Future()
        future.set_running_or_notify_cancel()
        encoded = encode_command(command)
        with self._batch_cond:
            self._queue.append((encoded, future))
            self._batch_cond.notify()
        return future

    def _send_batches(self) -> None:
        cond = self._batch_cond
        while True:
            with cond:
                while not self._stopping and not (
                    self._queue and len(self._in_flight) < self.max_batches_in_flight
                ):
                    cond.wait(0.1)
                    self._forget_stale_batches()
                if self._stopping:
                    return
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                self._batch_seq += 1
                batch_id = self._batch_seq
                self._in_flight[batch_id] = time.monotonic()
            self._send(batch_id, batch)

    def _send(self, batch_id: int, batch: list[tuple[bytes, Future[cmd.Result]]]) -> None:
        """Append one batch as one log entry; its callback settles the batch's futures."""
        cond = self._batch_cond
        futures = [f for _, f in batch]

        def done(result: Any, error: int) -> None:
            with cond:
                self._in_flight.pop(batch_id, None)
                cond.notify()
            resolve(futures, result, error)

        try:
            self._append(frame([e for e, _ in batch]), callback=done)
        except Exception as exc:  # e.g. the replica is being destroyed
            with cond:
                self._in_flight.pop(batch_id, None)
            for f in futures:
                if not f.done():
                    f.set_exception(ProposalError(str(exc), committed_unknown=False))

    def _forget_stale_batches(self) -> None:
        """Batches whose callback never came (leadership moved) stop blocking new ones;
        their callers have long hit their own deadlines."""
        horizon = time.monotonic() - self.batch_forget_s
        for batch_id in [b for b, sent in self._in_flight.items() if sent < horizon]:
            del self._in_flight[batch_id]


def resolve(futures: list[Future[cmd.Result]], result: Any, error: int) -> None:
    """Settle each proposal of a batch from the batch's outcome."""
    if error == FAIL_REASON.SUCCESS:
        results = result if isinstance(result, list) else []
        if len(results) != len(futures):
            failure = ProposalError("malformed batch result", committed_unknown=False)
            for f in futures:
                if not f.done():
                    f.set_exception(failure)
            return
        for f, item in zip(futures, results, strict=True):
            if not f.done():
                f.set_result(item)
        return
    for f in futures:
        if not f.done():
            f.set_exception(proposal_failure(error))


def proposal_failure(error: int) -> ProposalError:
    """The error of a proposal (a batch or a membership change) pysyncobj failed.

    Not appended anywhere, so surely not committed: a full queue, no leader, or
    (REQUEST_DENIED) this replica stopped leading before the entry left
    (raft/adapter.py: no forwarding). Any other failure may have been committed."""
    unknown = error not in (
        FAIL_REASON.QUEUE_FULL,
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.REQUEST_DENIED,
    )
    return ProposalError(fail_text(error), committed_unknown=unknown)


def fail_text(error: int) -> str:
    names = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}
    return f"proposal failed: {names.get(error, error)}"
