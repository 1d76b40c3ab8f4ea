"""The replicated cluster state: the one pysyncobj consumer of a replica.

:class:`ReplicatedState` owns the :class:`ClusterState` and exposes exactly one
replicated method, which takes a framed batch of encoded commands, applies each with
:func:`synapse_ha.core.machine.apply` and returns the :class:`Result` of each. It never
raises: an undecodable command becomes an ``invalid`` result, anything unexpected an
``internal`` one (an exception there would wedge pysyncobj forever). It is also
pysyncobj's snapshot serializer: snapshots are written by a forked child, off the Raft
thread, and read back at start.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

from pysyncobj import SyncObjConsumer, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.node import TCPNode

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.decode_errors import CodecError, UnreadableFormat
from synapse_ha.core.codec.versioned import decode_command
from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import AppliedCommand, Changes, SnapshotBuilder, apply_tracked
from synapse_ha.raft.batch import FrameError, unframe
from synapse_ha.raft.membership import member_of, tcp_node
from synapse_ha.raft.snapshot_file import (
    ForkedWrite,
    LogEntry,
    SnapshotMember,
    read_snapshot_file,
    write_snapshot,
)

log = logging.getLogger(__name__)


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
        # The members a snapshot file without a member list stands for (one written by a
        # release before online membership changes): the configured replicas.
        self.default_members: tuple[TCPNode, ...] = ()
        self.observer = observer
        self._in_entry = False  # apply_commands is applying an entry's commands
        # Background snapshot writes (see start_dump): where the snapshot file lives, and
        # the pysyncobj SERIALIZER_STATE of the write in progress or just finished.
        self.dump_path: str | None = None
        self._dump_lock = threading.Lock()
        self._dump_state = SERIALIZER_STATE.NOT_SERIALIZING
        self.dump_seconds: float = 0.0  # how long the newest background write took
        self.dump_write: ForkedWrite | None = None  # the newest background write
        self._dump_index = 0  # the log index it covers

    def snapshot(self) -> ClusterState:
        """An immutable snapshot of the state as of the newest applied command.

        Holds the apply lock only while the record dictionaries are copied (no record
        is: see :mod:`synapse_ha.core.snapshot`); the caller then reads it with no lock
        at all. Never change the returned state."""
        with self.lock:
            started = time.perf_counter()
            snap = self._snapshots.take(self.state)
            self.lock_stats.record(time.perf_counter() - started)
        return snap

    @replicated  # type: ignore[untyped-decorator]
    def apply_commands(self, envelope: bytes) -> list[cmd.Result]:
        """Apply a framed batch of encoded commands in order; return the results, one
        per command. Never raises: an undecodable command gets an ``invalid`` result, an
        unexpected error an ``internal`` one, and a malformed frame no result (nothing
        applied).

        The results are values, not bytes: pysyncobj hands them to the proposer's
        callback in this process and never sends them anywhere (a command is applied
        where it was proposed or, replayed, for no one; ``SafeSyncObj`` forwards no
        proposal to another replica)."""
        try:
            items = unframe(envelope)
        except FrameError:
            return []
        self._in_entry = True
        try:
            results = [self._apply_one(item) for item in items]
        finally:
            self._in_entry = False
        self._observer_applied()
        if self._on_applied is not None:
            try:
                self._on_applied()
            except Exception:
                log.exception("on_applied listener failed")
        return results

    def _apply_one(self, item: bytes) -> cmd.Result:
        try:
            try:
                command = decode_command(item)
            except UnreadableFormat as exc:
                # Written by a newer release: this replica now lacks a change the others
                # applied. Loud, because the upgrade rule was broken (core/codec/versioned.py).
                log.error("cannot apply a command of a newer release: %s", exc)
                result = cmd.error(cmd.ResultCode.INVALID, f"unreadable command: {exc}")
            except CodecError as exc:
                result = cmd.error(cmd.ResultCode.INVALID, f"undecodable command: {exc}")
            else:
                with self.lock:
                    if self.observer is None:
                        result = apply_tracked(self.state, command, self._snapshots.changes)
                    else:
                        result = self._apply_observed(command, item)
                if not self._in_entry:  # one command on its own is a batch of its own
                    self._observer_applied()
            return result
        except Exception as exc:  # a bug; keeping the log moving matters more
            log.exception("unexpected error applying a command")
            return cmd.error(cmd.ResultCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    # -- apply observer (history and events)

    def _apply_observed(self, command: cmd.Command, encoded: bytes) -> cmd.Result:
        """Apply under the lock, then tell the observer what the command touched (the
        records :mod:`synapse_ha.core.snapshot` notes for this one command, also added
        to the snapshot builder's changes) and the bytes it was decoded from. The
        observer must not raise; if it does, the error is logged and the log moves on."""
        touched = Changes()
        result = apply_tracked(self.state, command, self._snapshots.changes, touched)
        if self.observer is not None:
            everything = touched.everything
            try:
                self.observer.observe(
                    AppliedCommand(
                        command,
                        result,
                        self.state,
                        None if everything else touched.jobs,
                        None if everything else touched.nodes,
                        encoded,
                    )
                )
            except Exception:
                log.exception("apply observer failed")
        return result

    def _observer_applied(self) -> None:
        """Tell the observer that the commands it was told about since the last call
        form one applied batch (a committed entry), if it asks to be told."""
        applied = getattr(self.observer, "applied", None)
        if applied is not None:
            try:
                applied()
            except Exception:
                log.exception("apply observer failed to publish an applied batch")

    # -- snapshot hooks (SyncObjConf serializer/deserializer)

    def write_dump(self, path: str, data: tuple[Any, ...]) -> None:
        """Write the snapshot of the state as of the newest entry in ``data`` now, on
        the calling thread."""
        entries, members = _dump_header(data)
        self._flush_observer()
        with self.lock:
            write_snapshot(path, self.state, entries, members)

    def read_dump(self, path: str) -> tuple[Any, ...]:
        snap = read_snapshot_file(path)
        with self.lock:
            self.state = snap.state
            self._snapshots.reset()
            if self.observer is not None:
                try:
                    self.observer.restored(snap.state)
                except Exception:
                    log.exception("apply observer failed to take over a restored state")
        log.info("restored snapshot at log index %d", snap.entries[0][1])
        if snap.members is None:
            nodes = list(self.default_members)
        else:
            nodes = [tcp_node(m.raft, m.replica_id, m.grpc) for m in snap.members]
        return (snap.entries[0], snap.entries[1], nodes)

    # -- background snapshot writes (log compaction off the Raft thread)

    def start_dump(self, tmp_path: str, data: tuple[Any, ...]) -> None:
        """pysyncobj's serializer: start writing the snapshot of the state as of the newest
        applied entry in ``data`` and return at once; :meth:`dump_progress` reports when
        it is on disk, and only then does pysyncobj drop the log entries it covers.

        Runs on the Raft thread between two applies, so the copy-on-write snapshot taken
        here (:mod:`synapse_ha.core.snapshot`: a copy of the record dictionaries) is
        exactly the state after that entry; a forked child encodes it, writes and fsyncs
        the file (:class:`synapse_ha.raft.snapshot_file.ForkedWrite`: a synchronous write, or
        one on a thread of this process, stops the Raft thread for seconds at 10,000
        nodes, and a leader that sends no heartbeats is replaced by its followers).

        The file is written next to :attr:`dump_path` and renamed over it once synced.
        pysyncobj renames ``tmp_path`` over the snapshot file when this returns; removing
        ``tmp_path`` first makes that rename fail (pysyncobj ignores the failure and
        follows :meth:`dump_progress`), so it can never put a stale file in place."""
        if self.dump_path is None:
            raise RuntimeError("no snapshot path: set dump_path before compaction starts")
        entries, members = _dump_header(data)
        self._flush_observer()
        with self.lock:
            state = self._snapshots.take(self.state)
        with suppress(FileNotFoundError):
            os.remove(tmp_path)
        try:
            write = ForkedWrite(self.dump_path, state, entries, members)
        except OSError:
            log.exception("could not start the snapshot writer; the log is kept")
            with self._dump_lock:
                self._dump_state = SERIALIZER_STATE.FAILED
            return
        with self._dump_lock:
            self.dump_write = write
            self._dump_index = entries[0][1]
            self._dump_state = SERIALIZER_STATE.SERIALIZING

    def dump_progress(self) -> int:
        """pysyncobj's serialize checker: SERIALIZING while a write runs, then SUCCESS or
        FAILED exactly once, else NOT_SERIALIZING. Called on the Raft thread at every
        tick; a poll is one ``waitpid`` that does not block."""
        with self._dump_lock:
            state = self._dump_state
            write = self.dump_write
            if state == SERIALIZER_STATE.SERIALIZING and write is not None:
                done = write.poll()
                if done is None:
                    return int(state)
                state = SERIALIZER_STATE.SUCCESS if done else SERIALIZER_STATE.FAILED
                self.dump_seconds = write.seconds or 0.0
                if done:
                    log.info(
                        "snapshot at log index %d written in %.2fs (fork %.1f ms)",
                        self._dump_index,
                        self.dump_seconds,
                        write.fork_seconds * 1000,
                    )
                else:
                    log.error(
                        "writing the snapshot at log index %d failed (writer exit code %s, "
                        "its error is above); the log is kept",
                        self._dump_index,
                        write.exit_code,
                    )
            if state in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
                self._dump_state = SERIALIZER_STATE.NOT_SERIALIZING
            return int(state)

    def stop_dump(self) -> None:
        """Stop a snapshot write still running (the replica is stopping); the previous
        file stays in place."""
        with self._dump_lock:
            write = self.dump_write
        if write is not None:
            write.kill()

    def _flush_observer(self) -> None:
        if self.observer is not None:
            try:
                if not self.observer.flush():
                    log.warning("apply observer did not catch up before the snapshot")
            except Exception:
                log.exception("apply observer failed to flush")


class ApplyObserver(Protocol):
    """Told about every applied command, on the Raft thread under the apply lock
    (synapse_ha.history.recorder.HistoryRecorder). Must be quick and must not raise;
    slow work (disk writes) goes to a thread of its own.

    An observer that also has the method ``applied()`` (:class:`BatchObserver`) is told
    once after every applied batch of commands, and may keep what it derived from them
    until then."""

    def observe(self, entry: AppliedCommand) -> None:
        """``entry``: the command, its result, the state, what it may have touched and
        the bytes it was decoded from."""

    def restored(self, state: ClusterState) -> None:
        """The state was replaced by a restored snapshot."""

    def flush(self) -> bool:
        """Finish queued work before a snapshot is written; False if it could not."""


class BatchObserver(ApplyObserver, Protocol):
    """An :class:`ApplyObserver` told about the batches its commands were applied in."""

    def applied(self) -> None:
        """The commands observed since the previous call were one applied batch (a
        committed entry, or one command applied on its own), on the Raft thread, after
        the apply lock is released."""


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


def _dump_header(
    data: tuple[Any, ...],
) -> tuple[tuple[LogEntry, LogEntry], list[SnapshotMember] | None]:
    """The two log entries and the members pysyncobj hands its serializer."""
    newest, previous = data[0], data[1]
    entries: tuple[LogEntry, LogEntry] = (
        (bytes(newest[0]), int(newest[1]), int(newest[2])),
        (bytes(previous[0]), int(previous[1]), int(previous[2])),
    )
    members = [member_of(node) for node in data[2]] if len(data) > 2 and data[2] else None
    return entries, members
