"""The full-dump (snapshot) file format, written with our own codec instead of pickle.

pysyncobj hands a custom serializer the two newest applied log entries and the cluster
membership, but not the replicated objects: the serializer reads the state itself. The
file is one JSON header line (format version and the two log entries, commands in
base64) followed by the canonical state encoding from :mod:`synapse_ha.core.codec.versioned`.

The serializer runs on the Raft thread between two applies and takes a copy-on-write
snapshot of the state there, exactly the state after the newest entry it is given; the
file is then encoded and written by a forked child process (:class:`ForkedWrite`), so the
Raft thread keeps sending heartbeats while a large state is written. A thread would not
do: encoding a 50,000-job state builds and then frees millions of objects, and freeing
them holds the interpreter lock for a second or more at a time, long enough for the
followers of a leader that stops sending heartbeats to elect another. The child shares
the parent's memory copy-on-write (its reference counting copies the pages of the
objects it reads, so the machine needs up to the state's size again while it runs),
never touches the parent's threads or sockets, and is killed by the kernel when the
thread that forked it ends, so an orphan can never rename an old file over a newer one.

With online membership changes the header also lists the members (``"members"``: raft
address, replica id and gRPC address of each) as of the newest entry: a replica restarted
from the file, or a new one that received it from the leader, learns the replica set from
it. The key is optional and the format version stays 1, so a replica of the previous
release, which ignores keys it does not use, still reads files written by this one during
a rolling upgrade (files without the key give ``members=None``).

Reading a file parses the state with ``msgspec`` (a catching-up replica's wait is mostly
the decoding of the newest snapshot; msgspec's parser takes about a fifth off the decoding
of a large state), then decodes it with the core's codec. msgspec gives the values the
standard library's parser gives (integers of any size included); what it refuses (a
``NaN``, a lone surrogate) the core parses again with the standard library, which takes
it or names the error: the state read is the same either way, and the file's bytes are
the core's encoding.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import json
import os
import signal
import time
import traceback
import warnings
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NoReturn

import msgspec

from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.model import ClusterState

SNAPSHOT_VERSION = 1
_JSON = msgspec.json.Decoder()  # parses what json.loads parses, into the same values

LogEntry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj stores them


@dataclass(frozen=True, slots=True)
class SnapshotMember:
    raft: str
    replica_id: str
    grpc: str


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    state: ClusterState
    entries: tuple[LogEntry, LogEntry]
    members: tuple[SnapshotMember, ...] | None  # None: written without a member list


def write_snapshot(
    path: str,
    state: ClusterState,
    entries: tuple[LogEntry, LogEntry],
    members: Sequence[SnapshotMember] | None = None,
) -> None:
    header: dict[str, Any] = {
        "v": SNAPSHOT_VERSION,
        "entries": [
            [base64.b64encode(command).decode("ascii"), index, term]
            for command, index, term in entries
        ],
    }
    if members is not None:
        header["members"] = [
            [m.raft, m.replica_id, m.grpc] for m in sorted(members, key=lambda m: m.raft)
        ]
    body = encode_state(state)
    with open(path, "wb") as f:
        f.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
        f.write(body)
        f.flush()
        os.fsync(f.fileno())


def replace_snapshot(
    path: str,
    state: ClusterState,
    entries: tuple[LogEntry, LogEntry],
    members: Sequence[SnapshotMember] | None = None,
) -> None:
    """Write the snapshot to a file next to ``path``, fsync it, rename it over ``path``
    and fsync the directory: ``path`` holds the previous snapshot or this one, whole,
    whenever the process dies."""
    partial = path + ".partial"
    write_snapshot(partial, state, entries, members)
    os.replace(partial, path)
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ForkedWrite:
    """One :func:`replace_snapshot` in a forked child process, polled without blocking.

    The child resets the signals a scheduler handles to their defaults, asks the kernel
    to kill it when the forking thread ends (``PR_SET_PDEATHSIG``), pauses the cyclic
    collector (the parent's objects are not its to collect, and a collection would walk
    all of them), writes the file and leaves with ``os._exit``: no ``atexit`` handler,
    no flush of the parent's buffers, no finalizer of a thread or socket it inherited.
    A failure prints its traceback to standard error and exits non-zero."""

    def __init__(
        self,
        path: str,
        state: ClusterState,
        entries: tuple[LogEntry, LogEntry],
        members: Sequence[SnapshotMember] | None = None,
    ) -> None:
        # Resolved before the fork: looking a symbol up takes the dynamic loader's lock,
        # which another thread may hold at the moment of the fork.
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        parent = os.getpid()
        self.started = time.perf_counter()
        with warnings.catch_warnings():
            # Python 3.12 warns about fork() in a process with threads: the child here
            # runs only pure-Python encoding and file system calls, then os._exit.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _write_in_child(prctl, parent, path, state, entries, members)
        self.pid = pid
        self.fork_seconds = time.perf_counter() - self.started
        self.seconds: float | None = None  # from the fork to the child's exit
        self.exit_code: int | None = None

    def poll(self) -> bool | None:
        """True once the file is on disk, False if the child failed, None while it runs."""
        if self.exit_code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: the outcome is unknown
                pid, status = self.pid, 255 << 8
            if pid == 0:
                return None
            self.exit_code = os.waitstatus_to_exitcode(status)
            self.seconds = time.perf_counter() - self.started
        return self.exit_code == 0

    def wait(self, timeout_s: float) -> bool | None:
        """:meth:`poll` until the child exits or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while (done := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return done

    def kill(self) -> None:
        """Stop a child still writing (its partial file is never renamed into place)."""
        if self.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait(10.0)


def _write_in_child(
    prctl: Any,
    parent: int,
    path: str,
    state: ClusterState,
    entries: tuple[LogEntry, LogEntry],
    members: Sequence[SnapshotMember] | None,
) -> NoReturn:
    code = 1
    try:
        gc.disable()
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != parent:  # the parent died before the line above
            raise RuntimeError("the replica exited before its snapshot was written")
        replace_snapshot(path, state, entries, members)
        code = 0
    except BaseException:
        with suppress(BaseException):
            os.write(2, f"snapshot writer {os.getpid()}: {traceback.format_exc()}".encode())
    finally:
        os._exit(code)


def read_snapshot(path: str) -> tuple[ClusterState, tuple[LogEntry, LogEntry]]:
    """Raises :class:`CodecError` for a file that is not a valid snapshot."""
    snap = read_snapshot_file(path)
    return snap.state, snap.entries


def read_snapshot_file(path: str) -> SnapshotFile:
    """The state, the two log entries and the member list (when the file has one).
    Raises :class:`CodecError` for a file that is not a valid snapshot."""
    with open(path, "rb") as f:
        header_line = f.readline()
        body = f.read()
    header = _header(header_line)
    members = _members(header.get("members"))
    return SnapshotFile(decode_state(body, _JSON.decode), _entries(header), members)


def read_snapshot_entries(path: str) -> tuple[LogEntry, LogEntry]:
    """The two log entries of a snapshot file, read from its header alone (the state is
    not decoded). Raises :class:`CodecError` for a file that is not a valid snapshot."""
    with open(path, "rb") as f:
        header_line = f.readline(1 << 20)
    return _entries(_header(header_line))


def _header(line: bytes) -> dict[str, Any]:
    try:
        header: Any = json.loads(line)
    except ValueError as exc:
        raise CodecError(f"snapshot header: {exc}") from None
    if not isinstance(header, dict) or header.get("v") != SNAPSHOT_VERSION:
        raise CodecError("snapshot header: unsupported version")
    return header


def _entries(header: dict[str, Any]) -> tuple[LogEntry, LogEntry]:
    raw = header.get("entries")
    if not isinstance(raw, list) or len(raw) != 2:
        raise CodecError("snapshot header: expected two log entries")
    entries: list[LogEntry] = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or type(item[1]) is not int
            or type(item[2]) is not int
        ):
            raise CodecError("snapshot header: malformed log entry")
        entries.append((base64.b64decode(item[0]), item[1], item[2]))
    return entries[0], entries[1]


def _members(raw: Any) -> tuple[SnapshotMember, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise CodecError("snapshot header: members must be a non-empty list")
    out = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not all(isinstance(x, str) for x in item)
        ):
            raise CodecError("snapshot header: a member is [raft, replica_id, grpc]")
        out.append(SnapshotMember(raft=item[0], replica_id=item[1], grpc=item[2]))
    return tuple(out)
