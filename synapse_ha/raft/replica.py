"""One replica of the replicated cluster state, over pysyncobj.

* :class:`ReplicatedState` is the single pysyncobj consumer. It owns the
  :class:`ClusterState` and exposes exactly one replicated method, which takes an encoded
  command envelope, applies it with :func:`synapse_ha.core.machine.apply` and returns the
  encoded :class:`Result`. It never raises: an undecodable command becomes an ``invalid``
  result, anything unexpected an ``internal`` one (an exception there would wedge
  pysyncobj forever).
* :class:`RaftReplica` builds the consumer first and the ``SyncObj`` second (so a restored
  snapshot is never overwritten by a late constructor), and turns pysyncobj's callbacks
  into :class:`Proposal` futures that gRPC handlers wait on with a deadline.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.config import FAIL_REASON

from synapse_ha.app.ports import ProposalError
from synapse_ha.core import commands as cmd
from synapse_ha.core.codec import (
    CodecError,
    decode_command,
    decode_result,
    encode_command,
    encode_result,
)
from synapse_ha.core.model import ClusterConfig, ClusterState
from synapse_ha.core.snapshot import Changes, SnapshotBuilder, apply_tracked
from synapse_ha.raft.batch import FrameError, frame, unframe
from synapse_ha.raft.snapshot import LogEntry, read_snapshot, write_snapshot

log = logging.getLogger(__name__)

_ROLES = {0: "follower", 1: "candidate", 2: "leader"}


@dataclass(frozen=True, slots=True)
class RaftTiming:
    """Raft timers in seconds. The defaults were measured on loopback to give sub-second
    failover without spurious elections on a loaded two-core machine."""

    election_min_s: float = 0.4
    election_max_s: float = 0.8
    append_entries_period_s: float = 0.05
    leader_step_down_s: float = 2.0
    connection_retry_s: float = 0.5
    log_compaction_min_entries: int = 20_000
    log_compaction_min_time_s: float = 300.0


class ReplicatedState(SyncObjConsumer):  # type: ignore[misc]
    """The replicated cluster state and its one replicated entry point."""

    def __init__(
        self,
        on_applied: Callable[[], None] | None = None,
        observer: ApplyObserver | None = None,
    ) -> None:
        super().__init__()
        self.state = ClusterState()
        self.lock = threading.RLock()
        self._on_applied = on_applied
        self._snapshots = SnapshotBuilder()
        self.lock_stats = LockStats()
        self.observer = observer

    def snapshot(self) -> ClusterState:
        """An immutable snapshot of the state as of the newest applied command.

        Holds the apply lock only while the records changed since the previous snapshot
        are copied (see :mod:`synapse_ha.core.snapshot`); the caller then reads it with no
        lock at all. Never change the returned state."""
        with self.lock:
            started = time.perf_counter()
            snap = self._snapshots.take(self.state)
            self.lock_stats.record(time.perf_counter() - started)
        return snap

    @replicated  # type: ignore[untyped-decorator]
    def apply_commands(self, envelope: bytes) -> bytes:
        """Apply a framed batch of encoded commands in order; return the framed encoded
        results, one per command. Never raises: an undecodable command gets an
        ``invalid`` result, an unexpected error an ``internal`` one, and a malformed
        frame an empty result frame (nothing applied)."""
        try:
            items = unframe(envelope)
        except FrameError:
            return frame([])
        results = [self._apply_one(item) for item in items]
        if self._on_applied is not None:
            try:
                self._on_applied()
            except Exception:
                log.exception("on_applied listener failed")
        return frame(results)

    def _apply_one(self, item: bytes) -> bytes:
        try:
            try:
                command = decode_command(item)
            except CodecError as exc:
                result = cmd.error(cmd.ResultCode.INVALID, f"undecodable command: {exc}")
            else:
                with self.lock:
                    if self.observer is None:
                        result = apply_tracked(self.state, command, self._snapshots.changes)
                    else:
                        result = self._apply_observed(command)
            return encode_result(result)
        except Exception as exc:  # a bug; keeping the log moving matters more
            log.exception("unexpected error applying a command")
            return encode_result(cmd.error(cmd.ResultCode.INTERNAL, f"{type(exc).__name__}: {exc}"))

    # -- apply observer (history and events, issue 15)

    def _apply_observed(self, command: cmd.Command) -> cmd.Result:
        """Apply under the lock, then tell the observer what the command touched (the
        records :mod:`synapse_ha.core.snapshot` notes for this one command, also added
        to the snapshot builder's changes). The observer must not raise; if it does,
        the error is logged and the log moves on."""
        touched = Changes()
        result = apply_tracked(self.state, command, touched)
        changes = self._snapshots.changes
        changes.nodes |= touched.nodes
        changes.jobs |= touched.jobs
        changes.request_ids |= touched.request_ids
        changes.tokens |= touched.tokens
        changes.everything |= touched.everything
        if self.observer is not None:
            everything = touched.everything
            try:
                self.observer.observe(
                    command,
                    result,
                    None if everything else touched.jobs,
                    None if everything else touched.nodes,
                    self.state,
                )
            except Exception:
                log.exception("apply observer failed")
        return result

    # -- snapshot hooks (SyncObjConf serializer/deserializer)

    def write_dump(self, path: str, data: tuple[Any, ...]) -> None:
        newest, previous = data[0], data[1]
        entries: tuple[LogEntry, LogEntry] = (
            (bytes(newest[0]), int(newest[1]), int(newest[2])),
            (bytes(previous[0]), int(previous[1]), int(previous[2])),
        )
        if self.observer is not None:
            try:
                if not self.observer.flush():
                    log.warning("apply observer did not catch up before the snapshot")
            except Exception:
                log.exception("apply observer failed to flush")
        with self.lock:
            write_snapshot(path, self.state, entries)

    def read_dump(self, path: str) -> tuple[Any, ...]:
        state, entries = read_snapshot(path)
        with self.lock:
            self.state = state
            self._snapshots.reset()
            if self.observer is not None:
                try:
                    self.observer.restored(state)
                except Exception:
                    log.exception("apply observer failed to take over a restored state")
        log.info("restored snapshot at log index %d", entries[0][1])
        return (entries[0], entries[1], None)


class ApplyObserver(Protocol):
    """Told about every applied command, on the Raft thread under the apply lock
    (synapse_ha.history.recorder.HistoryRecorder). Must be quick and must not raise;
    slow work (disk writes) goes to a thread of its own."""

    def observe(
        self,
        command: cmd.Command,
        result: cmd.Result,
        job_ids: set[str] | None,
        node_ids: set[str] | None,
        state: ClusterState,
    ) -> None:
        """``job_ids``/``node_ids``: what the command may have touched; None: anything."""

    def restored(self, state: ClusterState) -> None:
        """The state was replaced by a restored snapshot."""

    def flush(self) -> bool:
        """Finish queued work before a snapshot is written; False if it could not."""


class LockStats:
    """How long readers held the apply lock to take snapshots: count, total and the
    longest hold, in seconds. Written under the apply lock; read without it."""

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0

    def record(self, held_s: float) -> None:
        self.count += 1
        self.total_s += held_s
        if held_s > self.max_s:
            self.max_s = held_s


@dataclass(frozen=True, slots=True)
class RaftStatus:
    role: str
    term: int
    commit_index: int
    last_applied: int
    leader: str  # raft address of the leader; empty when unknown
    has_quorum: bool
    ready: bool


class RaftReplica:
    """A replica: the consumer plus its ``SyncObj``.

    ``on_role_change(is_leader, term)`` runs on the Raft thread whenever this replica
    becomes or stops being leader; it must return quickly and never raise.
    """

    def __init__(
        self,
        self_address: str,
        peer_addresses: list[str],
        data_dir: str,
        password: str,
        timing: RaftTiming | None = None,
        on_role_change: Callable[[bool, int], None] | None = None,
        on_applied: Callable[[], None] | None = None,
        observer: ApplyObserver | None = None,
    ) -> None:
        timing = timing or RaftTiming()
        if not password:
            raise ValueError("a Raft password is required (it encrypts replica traffic)")
        self.self_address = self_address
        self._on_role_change = on_role_change
        self.machine = ReplicatedState(on_applied, observer)
        conf = SyncObjConf(
            password=password,
            bindAddress=self_address,
            journalFile=os.path.join(data_dir, "raft.journal"),
            fullDumpFile=os.path.join(data_dir, "raft.dump"),
            serializer=self.machine.write_dump,
            deserializer=self.machine.read_dump,
            appendEntriesUseBatch=False,
            leaderFallbackTimeout=timing.leader_step_down_s,
            raftMinTimeout=timing.election_min_s,
            raftMaxTimeout=timing.election_max_s,
            appendEntriesPeriod=timing.append_entries_period_s,
            connectionTimeout=max(3.5, timing.election_max_s),
            connectionRetryTime=timing.connection_retry_s,
            logCompactionMinEntries=timing.log_compaction_min_entries,
            logCompactionMinTime=timing.log_compaction_min_time_s,
            dynamicMembershipChange=False,
            onStateChanged=self._state_changed,
            commandsQueueSize=100_000,
        )
        self.max_batch = 512
        self.max_batches_in_flight = 2
        self.batch_forget_s = 2 * timing.leader_step_down_s
        self._batch_cond = threading.Condition()
        self._queue: list[tuple[bytes, Future[cmd.Result]]] = []
        self._in_flight: dict[int, float] = {}
        self._batch_seq = 0
        self._stopping = False
        others = [p for p in peer_addresses if p != self_address]
        self._sync = SyncObj(self_address, others, conf=conf, consumers=[self.machine])
        self._batcher = threading.Thread(
            target=self._send_batches, name="raft-batcher", daemon=True
        )
        self._batcher.start()

    # ---------------------------------------------------------------- proposals

    def propose(self, command: cmd.Command) -> Future[cmd.Result]:
        """Append ``command`` to the log. The future resolves with the apply result on
        this replica, or with :class:`ProposalError`. It may never resolve when
        leadership moves mid-flight: callers wait with a deadline and treat a timeout as
        an unknown outcome.

        Proposals are group-committed: while ``max_batches_in_flight`` entries replicate,
        new proposals queue and leave together as the next entry, in proposal order."""
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
            futures = [f for _, f in batch]

            def done(
                result: Any,
                error: int,
                batch_id: int = batch_id,
                futures: list[Future[cmd.Result]] = futures,
            ) -> None:
                with cond:
                    self._in_flight.pop(batch_id, None)
                    cond.notify()
                _resolve(futures, result, error)

            try:
                self.machine.apply_commands(frame([e for e, _ in batch]), callback=done)
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

    # ------------------------------------------------------------------- status

    def status(self) -> RaftStatus:
        sync = self._sync
        leader = sync._getLeader()
        raw = sync.getStatus()
        return RaftStatus(
            role=_ROLES.get(int(raw["state"]), "unknown"),
            term=int(raw["raft_term"]),
            commit_index=int(raw["commit_idx"]),
            last_applied=int(raw["last_applied"]),
            leader=str(leader.address) if leader is not None else "",
            has_quorum=bool(raw["has_quorum"]),
            ready=bool(sync.isReady()),
        )

    def is_leader(self) -> bool:
        return bool(self._sync._isLeader())

    def leader_address(self) -> str:
        leader = self._sync._getLeader()
        return str(leader.address) if leader is not None else ""

    def term(self) -> int:
        return int(self._sync._getTerm())

    def cluster_config(self) -> ClusterConfig:
        """The replicated configuration; an immutable value, read without the lock."""
        return self.machine.state.config

    def snapshot(self) -> ClusterState:
        """An immutable snapshot of the local state; see :meth:`ReplicatedState.snapshot`."""
        return self.machine.snapshot()

    @contextmanager
    def reading(self) -> Iterator[ClusterState]:
        """The live local state, locked against applies for the duration of the block.
        Only for work that must see one exact applied state and is O(1) or a single
        encode (a state digest); everything else reads a :meth:`snapshot`."""
        with self.machine.lock:
            yield self.machine.state

    def stop(self) -> None:
        with self._batch_cond:
            self._stopping = True
            self._batch_cond.notify_all()
        self._batcher.join(timeout=2.0)
        self._sync.destroy()

    def _state_changed(self, old: int, new: int) -> None:
        if self._on_role_change is None:
            return
        was_leader, is_leader = old == 2, new == 2
        if was_leader == is_leader:
            return
        try:
            self._on_role_change(is_leader, int(self._sync._getTerm()))
        except Exception:
            log.exception("role change listener failed")


def _resolve(futures: list[Future[cmd.Result]], result: Any, error: int) -> None:
    """Settle each proposal of a batch from the batch's outcome."""
    if error == FAIL_REASON.SUCCESS:
        try:
            encoded = unframe(result)
        except FrameError:
            encoded = []
        if len(encoded) != len(futures):
            failure = ProposalError("malformed batch result", committed_unknown=False)
            for f in futures:
                if not f.done():
                    f.set_exception(failure)
            return
        for f, item in zip(futures, encoded, strict=True):
            if f.done():
                continue
            try:
                f.set_result(decode_result(item))
            except CodecError as exc:
                f.set_exception(ProposalError(f"undecodable result: {exc}", committed_unknown=True))
        return
    unknown = error not in (FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER)
    for f in futures:
        if not f.done():
            f.set_exception(ProposalError(_fail_text(error), committed_unknown=unknown))


def _fail_text(error: int) -> str:
    names = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}
    return f"proposal failed: {names.get(error, error)}"
