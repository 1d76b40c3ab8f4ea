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

**The Raft channel.** pysyncobj encrypts and authenticates every Raft message with a key
derived from the Raft password, and unpickles what decrypts: whoever holds the key can
run code on every replica. So the password must be a real key
(:func:`raft_password_problem`, :data:`PASSWORD_RULE`), and the key is bound to the
replica's security mode (:func:`raft_key`): a replica started ``--insecure`` with the
cluster's password shares no key with the secure replicas, so it can neither join their
Raft nor receive a byte of their state (and both sides log why, see
:mod:`synapse_ha.raft.adapter`). A data directory remembers the mode that wrote it
(:func:`data_dir_mode_problem`): the state of a secure cluster is never served by a
replica started ``--insecure`` on it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol

from pysyncobj import SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.config import FAIL_REASON, SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.node import TCPNode

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec import (
    CodecError,
    UnreadableFormat,
    decode_command,
    encode_command,
)
from synapse_ha.core.membership import (
    MembershipCode,
    MembershipRefusal,
    MemberView,
    check_add,
    check_remove,
)
from synapse_ha.core.model import ClusterConfig, ClusterState
from synapse_ha.core.snapshot import Changes, SnapshotBuilder, apply_tracked
from synapse_ha.leader.ports import ProposalError
from synapse_ha.raft import journal as durable_journal
from synapse_ha.raft.adapter import SafeSyncObj
from synapse_ha.raft.batch import FrameError, frame, unframe
from synapse_ha.raft.snapshot_file import (
    ForkedWrite,
    LogEntry,
    SnapshotMember,
    read_snapshot_file,
    write_snapshot,
)

log = logging.getLogger(__name__)

_ROLES = {0: "follower", 1: "candidate", 2: "leader"}

# ------------------------------------------------------------------ the Raft channel

MIN_PASSWORD_BYTES = 32
# 32 random bytes hold about 30 distinct values; fewer than 16 is a pattern, not a key.
MIN_DISTINCT_BYTES = 16
PASSWORD_RULE = (
    f"a Raft password is at least {MIN_PASSWORD_BYTES} random bytes written in base64 "
    "(standard or URL-safe, padding optional) or in hex, and those bytes take at least "
    f"{MIN_DISTINCT_BYTES} distinct values; make one with `openssl rand -base64 32`"
)
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/_-]+={0,2}$")
# The key of an insecure replica is derived under this label (see raft_key).
_INSECURE_KEY_LABEL = b"synapse raft channel v1: a replica started --insecure"
MODE_FILE = "raft.mode"
SECURE, INSECURE = "secure", "insecure"


def raft_password_problem(password: str) -> str | None:
    """Why ``password`` may not guard the Raft channel, ending with :data:`PASSWORD_RULE`;
    None when it may.

    The rule, as checked: the text is hex (an even number of hex digits) or base64
    (either alphabet, padding optional; line breaks and spaces, as ``openssl rand
    -base64`` puts in long output, are skipped); decoded, it is at least
    :data:`MIN_PASSWORD_BYTES` bytes with at least :data:`MIN_DISTINCT_BYTES` distinct
    byte values. A text of hex digits only is read as hex. Entropy cannot be measured
    from one sample: this refuses short and patterned passwords, and the rule asks for
    random bytes."""
    decoded = _decode_password(password)
    if decoded is None:
        why = "it is neither base64 nor hex"
    elif len(decoded) < MIN_PASSWORD_BYTES:
        why = f"it holds {len(decoded)} bytes"
    elif len(set(decoded)) < MIN_DISTINCT_BYTES:
        why = f"its {len(decoded)} bytes take only {len(set(decoded))} distinct values"
    else:
        return None
    return f"the Raft password is too weak ({why}): {PASSWORD_RULE}"


def _decode_password(text: str) -> bytes | None:
    password = "".join(text.split())
    if _HEX.match(password):
        return bytes.fromhex(password) if len(password) % 2 == 0 else None
    if not _BASE64.match(password):
        return None
    body = password.rstrip("=")
    if ("+" in body or "/" in body) and ("-" in body or "_" in body):
        return None  # two alphabets at once
    try:
        return base64.b64decode(
            body.replace("-", "+").replace("_", "/") + "=" * (-len(body) % 4), validate=True
        )
    except (binascii.Error, ValueError):
        return None


def raft_key(password: str, secure: bool) -> str:
    """What pysyncobj derives the Raft channel key from, for a replica in this mode.

    A secure replica uses the password itself (the key of a secure cluster is what it
    was, so a rolling upgrade keeps its replicas talking); an insecure one uses an HMAC
    of the password under a fixed label. The two keys differ whatever the password, so
    replicas of different modes cannot exchange a single message."""
    if secure:
        return password
    digest = hmac.new(password.encode(), _INSECURE_KEY_LABEL, hashlib.sha256).hexdigest()
    return f"{INSECURE}:{digest}"


def data_dir_mode_problem(data_dir: str, secure: bool) -> str | None:
    """Why a replica in this mode may not start on ``data_dir`` (None when it may): the
    directory holds the state of a secure cluster (its :data:`MODE_FILE` says so) and
    the replica is insecure, so it would serve that state, tokens included, to anyone.
    The other way (an insecure cluster turned secure) is allowed."""
    try:
        with open(os.path.join(data_dir, MODE_FILE), encoding="utf-8") as f:
            recorded = f.read().strip()
    except FileNotFoundError:
        return None
    if secure or recorded != SECURE:
        return None
    return (
        f"{data_dir} holds the state of a secure cluster ({MODE_FILE}: {SECURE}); a "
        "replica started --insecure would serve it, tokens included, to anyone who can "
        "reach its port: start it with TLS, or on an empty data directory"
    )


def _record_mode(data_dir: str, secure: bool) -> None:
    """Write this replica's mode into ``data_dir`` (atomically) unless it is there."""
    path = os.path.join(data_dir, MODE_FILE)
    mode = SECURE if secure else INSECURE
    try:
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == mode:
                return
    except FileNotFoundError:
        pass
    staged = f"{path}.new"
    with open(staged, "w", encoding="utf-8") as f:
        f.write(mode + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, path)


@dataclass(frozen=True, slots=True)
class RaftTiming:
    """Raft timers in seconds. The defaults were measured on loopback to give sub-second
    failover without spurious elections on a loaded two-core machine (bench/failover.py).

    ``tick_period_s``: how long the Raft thread waits for a message before it looks at
    its timers again (pysyncobj's ``autoTickPeriod``); a follower notices a silent
    leader at most this late after its election timeout.
    ``restart_election_delay_s``: a replica restarted on an existing data directory
    stands for election no sooner than this after it started. pysyncobj has no
    pre-vote: a restarted follower that timed out before the leader had reconnected to
    it would start an election with a higher term and depose a healthy leader. The
    leader reconnects within ``connection_retry_s``; a whole cluster restarted at once
    elects its first leader this much later. Loading the snapshot and replaying the
    journal can take longer than the delay; after such a long tick a follower draws a
    fresh election timeout (:class:`~synapse_ha.raft.adapter.SafeSyncObj`).
    ``leader_loss_stagger_s``: when a follower's connection to its leader closes (the
    leader's process ended), the survivors stand for election in address order this far
    apart, the first at once, instead of waiting for their election timeouts
    (:mod:`synapse_ha.raft.adapter`); None waits for the timeouts."""

    election_min_s: float = 0.4
    election_max_s: float = 0.8
    append_entries_period_s: float = 0.05
    leader_step_down_s: float = 2.0
    connection_retry_s: float = 0.5
    log_compaction_min_entries: int = 20_000
    log_compaction_min_time_s: float = 300.0
    tick_period_s: float = 0.02
    restart_election_delay_s: float = 2.0
    leader_loss_stagger_s: float | None = 0.1


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

        Holds the apply lock only while the records changed since the previous snapshot
        are copied (see :mod:`synapse_ha.core.snapshot`); the caller then reads it with no
        lock at all. Never change the returned state."""
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
        results = [self._apply_one(item) for item in items]
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
                # applied. Loud, because the upgrade rule was broken (core/codec.py).
                log.error("cannot apply a command of a newer release: %s", exc)
                result = cmd.error(cmd.ResultCode.INVALID, f"unreadable command: {exc}")
            except CodecError as exc:
                result = cmd.error(cmd.ResultCode.INVALID, f"undecodable command: {exc}")
            else:
                with self.lock:
                    if self.observer is None:
                        result = apply_tracked(self.state, command, self._snapshots.changes)
                    else:
                        result = self._apply_observed(command)
            return result
        except Exception as exc:  # a bug; keeping the log moving matters more
            log.exception("unexpected error applying a command")
            return cmd.error(cmd.ResultCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    # -- apply observer (history and events)

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
        members = [_member_of(node) for node in data[2]] if len(data) > 2 and data[2] else None
        if self.observer is not None:
            try:
                if not self.observer.flush():
                    log.warning("apply observer did not catch up before the snapshot")
            except Exception:
                log.exception("apply observer failed to flush")
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
            nodes = [_node(m.raft, m.replica_id, m.grpc) for m in snap.members]
        return (snap.entries[0], snap.entries[1], nodes)

    # -- background snapshot writes (log compaction off the Raft thread)

    def start_dump(self, tmp_path: str, data: tuple[Any, ...]) -> None:
        """pysyncobj's serializer: start writing the snapshot of the state as of the newest
        applied entry in ``data`` and return at once; :meth:`dump_progress` reports when
        it is on disk, and only then does pysyncobj drop the log entries it covers.

        Runs on the Raft thread between two applies, so the copy-on-write snapshot taken
        here (:mod:`synapse_ha.core.snapshot`, O(records changed since the last one)) is
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

    ``directory`` maps raft addresses to ``(replica_id, grpc_address)``; each member
    carries them, and a member added online carries those given to :meth:`add_member`,
    so every replica knows every member's gRPC address (:meth:`members`). ``join``: this
    replica is new to a running cluster; it starts no election until it has heard from
    a leader (it would only disturb the members with its empty log).
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
        directory: Mapping[str, tuple[str, str]] | None = None,
        join: bool = False,
        observer: ApplyObserver | None = None,
        fsync: bool = False,
        *,
        secure: bool,
    ) -> None:
        """``secure``: whether this replica serves mutual TLS (False: ``--insecure``); it
        chooses the Raft key (:func:`raft_key`). Raises ``ValueError`` with the rule for a
        weak ``password`` (:func:`raft_password_problem`), and for an insecure replica on
        a secure cluster's data directory (:func:`data_dir_mode_problem`)."""
        timing = timing or RaftTiming()
        problem = raft_password_problem(password) or data_dir_mode_problem(data_dir, secure)
        if problem is not None:
            raise ValueError(problem)
        _record_mode(data_dir, secure)
        self.self_address = self_address
        self._on_role_change = on_role_change
        self._timing = timing
        self.machine = ReplicatedState(on_applied, observer)
        self.machine.dump_path = os.path.join(data_dir, "raft.dump")
        directory = directory or {}

        def node(address: str) -> TCPNode:
            replica_id, grpc = directory.get(address, (address, ""))
            return _node(address, replica_id, grpc)

        self_node = node(self_address)
        other_nodes = [node(p) for p in dict.fromkeys(peer_addresses) if p != self_address]
        self.machine.default_members = (self_node, *other_nodes)
        self._change_lock = threading.Lock()
        self._change_started: float | None = None  # monotonic; None: no change in flight
        self._raft_thread_calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._joining = join
        restarted = any(
            os.path.exists(os.path.join(data_dir, name)) for name in ("raft.journal", "raft.dump")
        )
        conf = SyncObjConf(
            password=raft_key(password, secure),
            bindAddress=self_address,
            journalFile=os.path.join(data_dir, "raft.journal"),
            fullDumpFile=os.path.join(data_dir, "raft.dump"),
            serializer=self.machine.start_dump,
            serializeChecker=self.machine.dump_progress,
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
            dynamicMembershipChange=True,
            onStateChanged=self._state_changed,
            commandsQueueSize=100_000,
            autoTickPeriod=timing.tick_period_s,
        )
        self.max_batch = 512
        self.max_batches_in_flight = 2
        self.batch_forget_s = 2 * timing.leader_step_down_s
        self._batch_cond = threading.Condition()
        self._queue: list[tuple[bytes, Future[cmd.Result]]] = []
        self._in_flight: dict[int, float] = {}
        self._batch_seq = 0
        self._stopping = False
        # Our journal (synapse_ha.raft.journal): compaction a crash cannot tear, and in
        # fsync mode every journal change on stable storage before pysyncobj sends the
        # answer or counts the vote that relies on it.
        durable_journal.register(conf.journalFile, conf.fullDumpFile, fsync=fsync)
        self.fsync = fsync
        self._sync = SafeSyncObj(
            self_node,
            other_nodes,
            conf=conf,
            consumers=[self.machine],
            channel_mode="secure (TLS)" if secure else "insecure (--insecure)",
        )
        durable_journal.check_installed(self._sync, fsync=fsync)
        if join:
            # No election before a leader has been heard from (see _finish_join). Set after
            # the constructor, which checks the timeouts against the connection timeout;
            # the first deadline is pushed out too (it was drawn with the normal ones).
            conf.raftMinTimeout = _JOIN_ELECTION_TIMEOUT_S
            conf.raftMaxTimeout = 2 * _JOIN_ELECTION_TIMEOUT_S
            self._sync.delay_election(raft_clock() + _JOIN_ELECTION_TIMEOUT_S)
        elif restarted and other_nodes:
            # No election before the leader had time to reconnect (see RaftTiming).
            # pysyncobj's deadlines are on its own clock (CLOCK_MONOTONIC_RAW).
            self._sync.delay_election(raft_clock() + timing.restart_election_delay_s)
        if not join:
            self._sync.leader_loss_stagger_s = timing.leader_loss_stagger_s
        self._sync.addOnTickCallback(self._on_tick)
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
        raw = self._raw_status()
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

    def leads_with_quorum(self) -> bool:
        """Leads, and its Raft thread heard a majority within ``leader_step_down_s``: a
        leader whose Raft thread stands still (its journal's disk is full, a long stall)
        stops serving after that long, as pysyncobj would have it step down."""
        return bool(self._sync.quorum_contact_within(self._timing.leader_step_down_s))

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

    # --------------------------------------------------------------- membership

    def members(self) -> list[MemberView]:
        """Every member of the replica set as this replica knows it, itself included,
        sorted by replica id. ``live`` is meaningful on the leader: the member is
        connected and its log is within :data:`CATCH_UP_SLACK` entries of the commit
        index; elsewhere it only says whether this replica is connected to it."""
        sync = self._sync
        raw = self._raw_status()
        leading = int(raw["state"]) == 2
        commit = int(raw["commit_idx"])
        views = [_view(sync.selfNode, live=True)]
        for node in sync.otherNodes:
            connected = raw.get(f"partner_node_status_server_{node.id}") == 2
            match = int(raw.get(f"match_idx_server_{node.id}") or 0)
            caught_up = match >= commit - CATCH_UP_SLACK if leading else True
            views.append(_view(node, live=connected and caught_up))
        return sorted(views, key=lambda v: (v.replica_id, v.raft))

    def _raw_status(self) -> dict[str, Any]:
        """pysyncobj's status, read from another thread: it iterates the member set,
        which a membership change on the Raft thread may resize mid-read; read again."""
        for _ in range(9):
            try:
                return dict(self._sync.getStatus())
            except RuntimeError:
                continue
        return dict(self._sync.getStatus())

    def member_addresses(self) -> list[SnapshotMember]:
        """The members (this replica included), without asking who is live."""
        sync = self._sync
        nodes = [sync.selfNode, *sync.otherNodes]
        return sorted((_member_of(n) for n in nodes), key=lambda m: (m.replica_id, m.raft))

    def change_in_flight(self) -> bool:
        with self._change_lock:
            return self._in_flight_locked()

    def _in_flight_locked(self) -> bool:
        started = self._change_started
        if started is not None and time.monotonic() - started > CHANGE_FORGET_S:
            self._change_started = started = None  # its callback never came (leader moved)
        return started is not None

    def add_member(
        self, replica_id: str, raft_address: str, grpc_address: str
    ) -> MembershipRefusal | Future[None]:
        """Start adding a replica (on the leader). Returns the refusal when the change may
        not start now (:mod:`synapse_ha.core.membership`), else a future that resolves
        once the membership entry is committed (or fails with :class:`ProposalError`).
        The new replica then catches up from the leader (a snapshot when the log was
        compacted) while the cluster keeps committing."""
        with self._change_lock:
            refusal = check_add(
                self.members(), replica_id, raft_address, grpc_address, self._in_flight_locked()
            )
            if refusal is not None:
                return refusal
            self._change_started = time.monotonic()
        future = self._change_future()
        node = _node(raft_address, replica_id, grpc_address)
        self._sync.addNodeToCluster(node, callback=self._change_done(future))
        log.info("adding replica %s (raft %s, grpc %s)", replica_id, raft_address, grpc_address)
        return future

    def remove_member(self, replica_id: str) -> MembershipRefusal | Future[None]:
        """Start removing a replica (on the leader); as :meth:`add_member`. The leader
        cannot remove itself: asked to, it hands leadership to its most caught-up peer
        and refuses with ``IS_LEADER`` (the caller retries; the new leader removes it)."""
        with self._change_lock:
            members = self.members()
            refusal = check_remove(members, replica_id, self._in_flight_locked())
            if refusal is not None:
                return refusal
            target = next(m for m in members if m.replica_id == replica_id)
            if target.raft == self.self_address:
                self._call_on_raft_thread(self._hand_over_leadership)
                return MembershipRefusal(
                    MembershipCode.IS_LEADER,
                    f"{replica_id} is the leader; it is handing leadership to another "
                    "replica: retry, and the new leader removes it",
                )
            self._change_started = time.monotonic()
        future = self._change_future()
        self._sync.removeNodeFromCluster(target.raft, callback=self._change_done(future))
        log.info("removing replica %s (raft %s)", replica_id, target.raft)
        return future

    @staticmethod
    def _change_future() -> Future[None]:
        future: Future[None] = Future()
        future.set_running_or_notify_cancel()
        return future

    def _change_done(self, future: Future[None]) -> Callable[[Any, int], None]:
        def done(result: Any, error: int) -> None:
            with self._change_lock:
                self._change_started = None
            if future.done():
                return
            if error == FAIL_REASON.SUCCESS:
                future.set_result(None)
            else:
                unknown = error not in (
                    FAIL_REASON.QUEUE_FULL,
                    FAIL_REASON.MISSING_LEADER,
                    FAIL_REASON.REQUEST_DENIED,
                )
                future.set_exception(ProposalError(_fail_text(error), committed_unknown=unknown))

        return done

    def _hand_over_leadership(self) -> None:
        def done(result: Any, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                log.info("leadership hand-over not possible now: %s", _fail_text(error))

        self._sync.transferLeadership(callback=done)

    def _call_on_raft_thread(self, fn: Callable[[], None]) -> None:
        self._raft_thread_calls.put(fn)

    def _on_tick(self) -> None:
        """Runs on the Raft thread at every tick."""
        while True:
            try:
                fn = self._raft_thread_calls.get_nowait()
            except queue.Empty:
                break
            try:
                fn()
            except Exception:
                log.exception("raft-thread call failed")
        if self._joining and self._sync._getLeader() is not None:
            self._finish_join()

    def _finish_join(self) -> None:
        """A joining replica heard from a leader: from now on it times out and stands for
        election like any member (the next append from the leader resets its deadline)."""
        self._joining = False
        conf = self._sync.conf
        conf.raftMinTimeout = self._timing.election_min_s
        conf.raftMaxTimeout = self._timing.election_max_s
        self._sync.leader_loss_stagger_s = self._timing.leader_loss_stagger_s
        log.info("joined: heard from leader %s", self.leader_address())

    def stop(self) -> None:
        with self._batch_cond:
            self._stopping = True
            self._batch_cond.notify_all()
        self._batcher.join(timeout=2.0)
        # A Raft thread waiting for disk space gives up so that it can stop.
        durable_journal.check_installed(self._sync, fsync=self.fsync).closing.set()
        self._sync.destroy()
        self.machine.stop_dump()

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


# A member whose log is this many entries behind the commit index is not counted as
# live when deciding a membership change (a replica still receiving a snapshot is).
CATCH_UP_SLACK = 5_000
# A membership change whose callback never came (leadership moved) stops blocking the
# next one after this long.
CHANGE_FORGET_S = 10.0
# Election timeout of a joining replica until it has heard from a leader.
_JOIN_ELECTION_TIMEOUT_S = 1.0e6


class RestoreError(Exception):
    """A data directory a backup cannot be restored into; the message says why."""


# The command byte of a Raft no-op entry (pysyncobj's _COMMAND_TYPE.NO_OP).
_NO_OP_ENTRY = b"\x01"


def seed_restored_state(
    data_dir: str, state: ClusterState, raft_index: int, me: SnapshotMember
) -> None:
    """Write the snapshot a new one-replica cluster starts from: ``state`` as of
    ``raft_index``, with ``me`` as its only member. The data directory must hold no
    journal and no snapshot. The replica loads it at start and, alone, leads at once;
    the members added to it afterwards receive this snapshot from it (their logs hold
    nothing this old)."""
    journal = os.path.join(data_dir, "raft.journal")
    dump = os.path.join(data_dir, "raft.dump")
    used = [p for p in (journal, dump) if os.path.exists(p)]
    if used:
        raise RestoreError(
            f"{data_dir} already holds a replica's data ({', '.join(used)}); restore into "
            "an empty data directory"
        )
    os.makedirs(data_dir, exist_ok=True)
    # Index at least 3: a fresh member's log holds index 1 only, so the leader must send
    # it the snapshot rather than entries.
    index = max(raft_index, 3)
    entries: tuple[LogEntry, LogEntry] = ((_NO_OP_ENTRY, index, 0), (_NO_OP_ENTRY, index - 1, 0))
    write_snapshot(dump, state, entries, [me])


def _dump_header(
    data: tuple[Any, ...],
) -> tuple[tuple[LogEntry, LogEntry], list[SnapshotMember] | None]:
    """The two log entries and the members pysyncobj hands its serializer."""
    newest, previous = data[0], data[1]
    entries: tuple[LogEntry, LogEntry] = (
        (bytes(newest[0]), int(newest[1]), int(newest[2])),
        (bytes(previous[0]), int(previous[1]), int(previous[2])),
    )
    members = [_member_of(node) for node in data[2]] if len(data) > 2 and data[2] else None
    return entries, members


def _node(raft_address: str, replica_id: str, grpc_address: str) -> TCPNode:
    return TCPNode(raft_address, replica_id=replica_id, grpc=grpc_address)


def _member_of(node: Any) -> SnapshotMember:
    """A pysyncobj node as a snapshot member. Nodes made here carry ``replica_id`` and
    ``grpc``; a node from a replica of an earlier release carries only its address."""
    address = str(node.id)
    return SnapshotMember(
        raft=address,
        replica_id=str(getattr(node, "replica_id", address)),
        grpc=str(getattr(node, "grpc", "")),
    )


def _view(node: Any, live: bool) -> MemberView:
    m = _member_of(node)
    return MemberView(replica_id=m.replica_id, raft=m.raft, grpc=m.grpc, live=live)


def _resolve(futures: list[Future[cmd.Result]], result: Any, error: int) -> None:
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
    # Not appended anywhere: a full queue, no leader, or (REQUEST_DENIED) this replica
    # stopped leading before the batch left (raft/adapter.py: no forwarding).
    unknown = error not in (
        FAIL_REASON.QUEUE_FULL,
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.REQUEST_DENIED,
    )
    for f in futures:
        if not f.done():
            f.set_exception(ProposalError(_fail_text(error), committed_unknown=unknown))


def _fail_text(error: int) -> str:
    names = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}
    return f"proposal failed: {names.get(error, error)}"
