"""An fsync mode for pysyncobj's file journal, without changing pysyncobj.

Raft's safety argument assumes stable storage: a follower's append response, a vote and
the leader's own share of a commit majority all stand for data that survives a crash.
pysyncobj 0.3.17 writes its journal through a shared ``mmap`` and never syncs it (the
kernel writes the pages back when it likes), and its term/vote file is replaced with a
rename but not synced. That survives the death of the process (the page cache belongs to
the kernel) but not a power loss or a kernel crash.

:class:`DurableFileJournal` is a :class:`pysyncobj.journal.FileJournal` whose every
change reaches the disk before the method returns, and pysyncobj calls these methods on
its Raft thread before it sends the message that relies on them:

* ``add`` (an entry appended by the leader or received by a follower) syncs the mapping
  (``msync(MS_SYNC)``, which on Linux is an ``fdatasync`` of the written range), so the
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
  durable before the entries it covers are gone.

pysyncobj creates its journal with the module-level ``createJournal`` it imported into
:mod:`pysyncobj.syncobj`. :func:`register` replaces that name, once per process, with a
function that builds a :class:`DurableFileJournal` for the journal paths registered and
defers to the original for every other path (so replicas with and without the mode can
share a process). :func:`check_installed` verifies, after ``SyncObj`` is built, that the
journal really is a durable one: a pysyncobj that stopped calling ``createJournal`` makes
the replica refuse to start instead of running silently without fsync.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pysyncobj.syncobj as _syncobj
from pysyncobj.journal import FileJournal, MetaStorer
from pysyncobj.pickle import dumps


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


class DurableFileJournal(FileJournal):  # type: ignore[misc]
    """A FileJournal whose changes are on stable storage when its methods return."""

    def __init__(self, journal_file: str, dump_file: str | None) -> None:
        created = not os.path.exists(journal_file)
        super().__init__(journal_file)
        self.dump_file = dump_file
        self.directory = os.path.dirname(os.path.abspath(journal_file))
        self.syncs = 0  # how many times the journal was synced (for tests and metrics)
        self._deferred = False
        storer = getattr(self, "_FileJournal__metaStorer", None)
        if not isinstance(storer, MetaStorer):
            raise JournalHookError("pysyncobj's FileJournal has no meta storer to make durable")
        self._FileJournal__metaStorer = DurableMetaStorer(storer.getPath())
        self.flush()
        if created:
            fsync_directory(self.directory)

    def sync(self) -> None:
        self.flush()  # ResizableFile.flush: mmap.flush, i.e. msync(MS_SYNC)
        self.syncs += 1

    def add(self, command: Any, idx: int, term: int) -> None:
        super().add(command, idx, term)
        if not self._deferred:
            self.sync()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        super().deleteEntriesFrom(entryFrom)
        self.sync()

    def clear(self) -> None:
        if self._deferred:
            super().clear()
            return
        self._sync_snapshot()
        super().clear()
        self.sync()

    def deleteEntriesTo(self, entryTo: int) -> None:
        # FileJournal rewrites the kept entries with clear() and add(): one sync at the end.
        self._sync_snapshot()
        self._deferred = True
        try:
            super().deleteEntriesTo(entryTo)
        finally:
            self._deferred = False
        self.sync()

    def _sync_snapshot(self) -> None:
        if self.dump_file is not None and fsync_file(self.dump_file):
            fsync_directory(os.path.dirname(os.path.abspath(self.dump_file)))


_lock = threading.Lock()
_durable: dict[str, str | None] = {}  # absolute journal path -> snapshot path
_original_create = _syncobj.createJournal


def _create_journal(journalFile: str | None = None) -> Any:
    if journalFile is not None:
        key = os.path.abspath(journalFile)
        with _lock:
            durable = key in _durable
            dump = _durable.get(key)
        if durable:
            return DurableFileJournal(journalFile, dump)
    return _original_create(journalFile)


def register(journal_file: str, dump_file: str | None) -> None:
    """Journals pysyncobj creates at ``journal_file`` from now on are durable; their
    snapshot file is ``dump_file``. Installs the hook on first use."""
    with _lock:
        _durable[os.path.abspath(journal_file)] = dump_file
        if _syncobj.createJournal is not _create_journal:
            if _syncobj.createJournal is not _original_create:
                raise JournalHookError("pysyncobj.syncobj.createJournal was replaced by another")
            _syncobj.createJournal = _create_journal


def unregister(journal_file: str) -> None:
    with _lock:
        _durable.pop(os.path.abspath(journal_file), None)


def journal_of(sync_obj: Any) -> Any:
    """The journal object a ``SyncObj`` uses."""
    return getattr(sync_obj, "_SyncObj__raftLog", None)


def check_installed(sync_obj: Any) -> DurableFileJournal:
    """The durable journal of ``sync_obj``; raises :class:`JournalHookError` when pysyncobj
    built another kind (the fsync mode would silently not apply)."""
    journal = journal_of(sync_obj)
    if not isinstance(journal, DurableFileJournal):
        raise JournalHookError(
            f"pysyncobj built a {type(journal).__name__} journal, not a durable one: "
            "the fsync mode cannot be guaranteed with this pysyncobj version"
        )
    return journal
