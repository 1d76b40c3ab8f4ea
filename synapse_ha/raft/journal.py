"""pysyncobj's file journal made crash-safe, and an fsync mode for it, without changing
pysyncobj.

**Compaction that a crash cannot tear** (always on). After a snapshot, pysyncobj's
``FileJournal.deleteEntriesTo`` rewrites the kept entries in place: it marks the journal
empty, then appends them again one by one. A process killed in the middle leaves a journal
holding only the first few kept entries, and the newest entries, acknowledged to clients,
are gone from that replica; the replicas compact at the same log index, so all of them can
be in that window at once. And pysyncobj renames the new snapshot into place before it
compacts: a replica killed in between restarts with a journal that does not begin at the
snapshot, which pysyncobj's loader answers by clearing the journal, so every entry after
the snapshot is lost. :class:`AtomicFileJournal`

* compacts by writing the kept entries to a new file and renaming it over the journal, so
  the journal is the old one or the new one, whole, whenever the process dies;
* on opening, drops the entries its snapshot file already covers when the journal still
  begins before the snapshot, so the loader finds the journal beginning at the snapshot and
  keeps every entry after it.

**fsync mode** (``[raft] fsync``, on by default).

Raft's safety argument assumes stable storage: a follower's append response, a vote and
the leader's own share of a commit majority all stand for data that survives a crash.
pysyncobj 0.3.17 writes its journal through a shared ``mmap`` and never syncs it (the
kernel writes the pages back when it likes), and its term/vote file is replaced with a
rename but not synced. That survives the death of the process (the page cache belongs to
the kernel) but not a power loss or a kernel crash.

:class:`DurableFileJournal` is an :class:`AtomicFileJournal` whose every change reaches
the disk before the method returns, and pysyncobj calls these methods on
its Raft thread before it sends the message that relies on them:

* ``add`` (an entry appended by the leader or received by a follower) syncs the mapping
  (an ``fdatasync`` of the file, what ``msync(MS_SYNC)`` does on Linux, but with the
  interpreter lock released: :meth:`ReservedFile.flush`), so the
  follower's ``next_node_idx`` success answer and the leader's own vote in the commit
  count follow a durable write. A batch of entries received in one message is synced
  once per entry; our proposals are group-committed (many commands in one entry), so a
  message rarely carries more than a few;
* ``deleteEntriesFrom`` (a follower dropping a conflicting suffix) syncs too;
* the term and vote (``setCurrentTerm``, stored before a vote is sent) are written to a
  temporary file, synced, renamed over the old one, and the directory is synced;
* before the journal forgets entries (``deleteEntriesTo`` after a snapshot,
  ``clear`` before a snapshot received from the leader is loaded), the snapshot file
  that replaces them and its directory entry are synced: the rename pysyncobj does is
  durable before the entries it covers are gone; the compacted journal is synced before
  it is renamed into place, and its directory after.

**A full disk stops the replica, never kills or tears it** (always on). pysyncobj writes
the journal through a shared ``mmap`` that it grows with ``ftruncate``: the new pages have
no blocks behind them, and on a full file system the first store into one ends the
process with SIGBUS; a restarted replica dies the same way at its first append, for as
long as the disk stays full. And ``FileJournal.add`` puts the entry into its in-memory log
before writing the file, so a failed write would leave an entry the replica holds (and
could acknowledge) but has not stored. Here every append first makes sure the file's
blocks under it are reserved (``posix_fallocate``, ``RESERVE_CHUNK`` ahead at a time, or
just the room it needs when that much is not free) and then writes, and the in-memory log
takes the entry only once it is in the file. When the reservation finds no space, the
append waits, retrying every ``DISK_FULL_RETRY_S``, until space returns (or the replica
stops): the replica's Raft thread stands still, so it answers no leader and, leading,
loses its quorum contact and stops serving (``SafeSyncObj.quorum_contact_within``) while
the others elect a leader. It rejoins where it stopped when space returns, as after a
pause.

pysyncobj creates its journal with the module-level ``createJournal`` it imported into
:mod:`pysyncobj.syncobj`. :func:`register` has the adapter
(:func:`~synapse_ha.raft.adapter.install_journal_factory`) replace that name, once per
process, with a function that builds our journal for the journal paths registered
(durable or not, per path) and defers to the original for every other path.
:func:`check_installed` verifies, after ``SyncObj`` is built, that the journal really is
ours: a pysyncobj that stopped calling ``createJournal`` makes the replica refuse to
start instead of running silently without these guarantees."""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from typing import Any

from pysyncobj.journal import (
    FIRST_RECORD_OFFSET,
    LAST_RECORD_OFFSET_OFFSET,
    FileJournal,
    MetaStorer,
    ResizableFile,
)
from pysyncobj.pickle import dumps, to_bytes

from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.raft.adapter import FileJournalState, ResizableFileState, install_journal_factory
from synapse_ha.raft.snapshot_file import read_snapshot_entries

log = logging.getLogger(__name__)


class JournalHookError(RuntimeError):
    """pysyncobj no longer builds its journal the way this module hooks into."""


def fsync_directory(path: str) -> None:
    """Make the directory entries in ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> bool:
    """fsync ``path`` if it exists; whether it did."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


class DurableMetaStorer(MetaStorer):  # type: ignore[misc]
    """pysyncobj's term/vote/commit-index file, written durably: temporary file, fsync,
    rename, fsync of the directory."""

    def storeMeta(self, meta: dict[str, Any]) -> None:
        path = self.getPath()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(os.path.dirname(os.path.abspath(path)))


DISK_FULL_RETRY_S = 0.5
RESERVE_CHUNK = 1 << 20  # journal blocks are reserved this much at a time


class ReservedFile(ResizableFile):  # type: ignore[misc]
    """pysyncobj's memory-mapped file whose writes reserve their blocks first: on a full
    file system a write raises ``OSError`` (ENOSPC) and changes nothing, instead of
    ending the process with SIGBUS when the mapping touches a page with no block."""

    def __init__(self, path: str) -> None:
        self._private = ResizableFileState(self)
        self.reserved = 0  # bytes from the start known to have blocks
        super().__init__(path)

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        mapping: Any = self._private.mapping
        if end > self.reserved:
            # Reserve ahead, a chunk at a time (one call per RESERVE_CHUNK, not per
            # append); the mapping, which only grows, always covers what is reserved.
            ahead = -(-end // RESERVE_CHUNK) * RESERVE_CHUNK
            if ahead > len(mapping):
                # Grow the mapping (and the file, sparse) as pysyncobj does, by doubling.
                mapping.resize(max(2 * len(mapping), ahead))
            fd = self._private.fileno()
            try:
                os.posix_fallocate(fd, 0, ahead)
                self.reserved = ahead
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                os.posix_fallocate(fd, 0, end)  # the room this write needs, or ENOSPC
                self.reserved = end
        mapping[offset:end] = values

    def flush(self) -> None:
        """Make the written records durable: ``fdatasync`` of the mapped file, which is
        what ``mmap.flush`` (``msync(MS_SYNC)``) does on Linux, but with the interpreter
        lock released while the disk works, so the replica's other threads (its RPCs, the
        Raft channel's reader) go on meanwhile."""
        os.fdatasync(self._private.fileno())


class AtomicFileJournal(FileJournal):  # type: ignore[misc]
    """A FileJournal whose compaction a crash cannot tear, which, on opening, drops the
    entries its snapshot already covers, and which waits out a full disk (see the module
    docstring)."""

    fsync = False

    def __init__(self, journal_file: str, dump_file: str | None) -> None:
        self._private = FileJournalState(self)
        super().__init__(journal_file)
        self.path = journal_file
        self.dump_file = dump_file
        self.directory = os.path.dirname(os.path.abspath(journal_file))
        self.compactions = 0  # whole-file rewrites (for tests)
        self.closing = threading.Event()  # set when the replica stops: stop waiting
        self.disk_full_waits = 0  # appends that waited for space (for tests and logs)
        self._meta_unwritten = False
        self._use_reserved_file()
        self._align_with_snapshot()

    def _use_reserved_file(self) -> None:
        old = self._private.file
        self._private.file = ReservedFile(self.path)
        ResizableFileState(old).close()

    def add(self, command: Any, idx: int, term: int) -> None:
        """Append an entry: the file first (waiting for space), then the in-memory log."""
        data = struct.pack("<QQ", idx, term) + to_bytes(command)
        size = struct.pack("<I", len(data))
        record = size + data + size
        private = self._private
        offset = private.offset
        self._write_when_space(offset, record)
        private.offset = offset + len(record)
        private.file.write(LAST_RECORD_OFFSET_OFFSET, struct.pack("<I", offset + len(record)))
        private.entries.append((command, idx, term))

    def onOneSecondTimer(self) -> None:
        """pysyncobj stores the commit index once a second; on a full disk that raised out
        of its tick (logged as ``failed _onTick`` every second, the rest of that tick
        skipped). The index is only a hint for a restart, so the write waits for space:
        it is tried again the next second."""
        try:
            super().onOneSecondTimer()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            if not self._meta_unwritten:
                log.error("%s: the commit index cannot be stored: %s", self.path, exc)
            self._meta_unwritten = True
        else:
            self._meta_unwritten = False

    def _write_when_space(self, offset: int, record: bytes) -> None:
        waited = False
        while True:
            try:
                self._private.file.write(offset, record)
                break
            except OSError as exc:
                if exc.errno != errno.ENOSPC or self.closing.is_set():
                    raise
                if not waited:
                    waited = True
                    self.disk_full_waits += 1
                    log.error(
                        "%s: no space left for the Raft journal; this replica waits "
                        "(answering no leader) until space returns",
                        self.path,
                    )
                self.closing.wait(DISK_FULL_RETRY_S)
        if waited:
            log.warning("%s: space is back; the Raft journal goes on", self.path)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self._rewrite([self[i] for i in range(entryTo, len(self))])

    def _align_with_snapshot(self) -> None:
        """Drop the entries before the snapshot's older entry when the journal holds it:
        pysyncobj keeps a journal only when it begins exactly at the snapshot."""
        if self.dump_file is None or len(self) < 2 or not os.path.exists(self.dump_file):
            return
        try:
            newest, previous = read_snapshot_entries(self.dump_file)
        except (OSError, CodecError):
            return  # pysyncobj's loader reports an unreadable snapshot
        first = int(self[0][1])
        at = int(previous[1]) - first
        if at <= 0 or at + 1 >= len(self):
            return
        if tuple(self[at]) == tuple(previous) and tuple(self[at + 1]) == tuple(newest):
            self._rewrite([self[i] for i in range(at, len(self))])

    def _rewrite(self, kept: list[tuple[Any, int, int]]) -> None:
        """Write ``kept`` to a new file and rename it over the journal."""
        partial = self.path + ".compacting"
        with open(partial, "wb") as f:
            f.write(self._private.default_header())
            offset = FIRST_RECORD_OFFSET
            for command, idx, term in kept:
                data = struct.pack("<QQ", idx, term) + to_bytes(command)
                size = struct.pack("<I", len(data))
                f.write(size + data + size)
                offset += len(data) + 8
            f.seek(LAST_RECORD_OFFSET_OFFSET)
            f.write(struct.pack("<I", offset))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(partial, self.path)
        if self.fsync:
            fsync_directory(self.directory)
        self._use_reserved_file()
        self._private.entries = list(kept)
        self._private.offset = offset
        self.compactions += 1


class DurableFileJournal(AtomicFileJournal):
    """An AtomicFileJournal whose changes are on stable storage when its methods return."""

    fsync = True

    def __init__(self, journal_file: str, dump_file: str | None) -> None:
        created = not os.path.exists(journal_file)
        self.syncs = 0  # how many times the journal was synced (for tests and metrics)
        super().__init__(journal_file, dump_file)
        storer = self._private.meta_storer
        if not isinstance(storer, MetaStorer):
            raise JournalHookError("pysyncobj's FileJournal has no meta storer to make durable")
        self._private.meta_storer = DurableMetaStorer(storer.getPath())
        self.flush()
        if created:
            fsync_directory(self.directory)

    def sync(self) -> None:
        self.flush()  # ReservedFile.flush: fdatasync, the interpreter lock released
        self.syncs += 1

    def add(self, command: Any, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self.sync()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        super().deleteEntriesFrom(entryFrom)
        self.sync()

    def clear(self) -> None:
        self._sync_snapshot()
        super().clear()
        self.sync()

    def deleteEntriesTo(self, entryTo: int) -> None:
        # The new file is synced before the rename (one sync for all kept entries).
        self._sync_snapshot()
        super().deleteEntriesTo(entryTo)
        self.syncs += 1

    def _sync_snapshot(self) -> None:
        if self.dump_file is not None and fsync_file(self.dump_file):
            fsync_directory(os.path.dirname(os.path.abspath(self.dump_file)))


_lock = threading.Lock()
_ours: dict[str, tuple[str | None, bool]] = {}  # absolute journal path -> (snapshot, fsync)


def _create_journal(journalFile: str) -> AtomicFileJournal | None:
    with _lock:
        found = _ours.get(os.path.abspath(journalFile))
    if found is None:
        return None  # pysyncobj's own journal
    dump, fsync = found
    if fsync:
        return DurableFileJournal(journalFile, dump)
    return AtomicFileJournal(journalFile, dump)


def register(journal_file: str, dump_file: str | None, fsync: bool = True) -> None:
    """Journals pysyncobj creates at ``journal_file`` from now on are ours (durable when
    ``fsync``); their snapshot file is ``dump_file``. Installs the hook on first use."""
    with _lock:
        _ours[os.path.abspath(journal_file)] = (dump_file, fsync)
        if not install_journal_factory(_create_journal):
            raise JournalHookError("pysyncobj.syncobj.createJournal was replaced by another")


def unregister(journal_file: str) -> None:
    with _lock:
        _ours.pop(os.path.abspath(journal_file), None)


def journal_of(sync_obj: Any) -> Any:
    """The journal object a replica's ``SafeSyncObj`` uses."""
    return sync_obj.raft_log()


def check_installed(sync_obj: Any, fsync: bool = True) -> AtomicFileJournal:
    """The journal of ``sync_obj``; raises :class:`JournalHookError` when pysyncobj built
    another kind (crash-safe compaction, and fsync when asked, would silently not apply)."""
    journal = journal_of(sync_obj)
    wanted = DurableFileJournal if fsync else AtomicFileJournal
    if not isinstance(journal, wanted):
        what = "a durable one" if fsync else "a crash-safe one"
        raise JournalHookError(
            f"pysyncobj built a {type(journal).__name__} journal, not {what}: "
            "the journal's guarantees cannot be kept with this pysyncobj version"
        )
    return journal
