"""A full disk under the Raft journal: an append waits for space and changes nothing until
it has it; the replica's process survives (pysyncobj's own journal dies of SIGBUS); a
leader whose Raft thread stands still stops counting as leading with a quorum."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.syncobj import _RAFT_STATE

from synapse_ha.raft import journal as raft_journal
from synapse_ha.raft.adapter import SafeSyncObj
from synapse_ha.raft.journal import AtomicFileJournal
from tests.disks import needs_root, small_tmpfs
from tests.raft.test_appendentries import Follower

REPO = Path(__file__).resolve().parents[2]


class Disk:
    """``os.posix_fallocate`` that fails with ENOSPC while ``full`` is set."""

    def __init__(self) -> None:
        self.full = threading.Event()
        self.refused = 0
        self._real = os.posix_fallocate

    def __call__(self, fd: int, offset: int, length: int) -> None:
        if self.full.is_set():
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        self._real(fd, offset, length)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    d = Disk()
    monkeypatch.setattr(raft_journal.os, "posix_fallocate", d)
    monkeypatch.setattr(raft_journal, "DISK_FULL_RETRY_S", 0.02)
    # Reserve a page at a time, so that every entry below needs room of its own.
    monkeypatch.setattr(raft_journal, "RESERVE_CHUNK", 4096)
    return d


def entries(path: Path) -> list[tuple[Any, int, int]]:
    j = AtomicFileJournal(str(path), None)
    try:
        return [tuple(j[i]) for i in range(len(j))]
    finally:
        j._destroy()


def big(i: int) -> bytes:
    return b"\x01" + bytes([i % 251]) * 5000  # more than a reserved chunk each


def test_an_append_waits_for_space_and_then_lands(tmp_path: Path, disk: Disk) -> None:
    path = tmp_path / "raft.journal"
    j = AtomicFileJournal(str(path), None)
    try:
        for i in range(1, 4):
            j.add(big(i), i, 1)
        disk.full.set()
        t = threading.Thread(target=j.add, args=(big(4), 4, 1))
        t.start()
        deadline = time.monotonic() + 5.0
        while disk.refused < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.is_alive() and j.disk_full_waits == 1
        assert len(j) == 3  # not in memory before it is in the file
        disk.full.clear()
        t.join(timeout=5.0)
        assert not t.is_alive()
        assert len(j) == 4
    finally:
        j._destroy()
    assert [idx for _, idx, _ in entries(path)] == [1, 2, 3, 4]


def test_room_reserved_ahead_takes_entries_on_a_disk_full_since(
    tmp_path: Path, disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(raft_journal, "RESERVE_CHUNK", 1 << 16)
    j = AtomicFileJournal(str(tmp_path / "raft.journal"), None)
    try:
        j.add(b"\x01small", 1, 1)  # reserves the first 64 KiB
        disk.full.set()
        for i in range(2, 12):
            j.add(b"\x01small", i, 1)
        assert (len(j), disk.refused, j.disk_full_waits) == (11, 0, 0)
    finally:
        j._destroy()


def test_a_stopping_replica_gives_up_and_the_journal_stays_whole(
    tmp_path: Path, disk: Disk
) -> None:
    path = tmp_path / "raft.journal"
    j = AtomicFileJournal(str(path), None)
    try:
        j.add(big(1), 1, 1)
        disk.full.set()
        j.closing.set()
        with pytest.raises(OSError, match="No space"):
            j.add(big(2), 2, 1)
        assert len(j) == 1
    finally:
        j._destroy()
    assert [idx for _, idx, _ in entries(path)] == [1]


FILL_AND_APPEND = textwrap.dedent(
    """
    import os, sys, threading, time
    from pysyncobj.journal import FileJournal
    from synapse_ha.raft import journal
    from synapse_ha.raft.journal import AtomicFileJournal
    journal.RESERVE_CHUNK = 4096  # so that the second entry needs room of its own
    disk, kind = sys.argv[1], sys.argv[2]
    path = os.path.join(disk, "raft.journal")
    j = FileJournal(path) if kind == "pysyncobj" else AtomicFileJournal(path, None)
    j.add(b"\\x01first", 1, 1)
    filler = os.path.join(disk, "fill")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\\0" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"\\0" * 512)
    except OSError:
        os.close(fd)
    t = threading.Thread(target=j.add, args=(b"\\x01" + b"x" * 200000, 2, 1))
    t.start()
    deadline = time.monotonic() + 10.0
    while getattr(j, "disk_full_waits", 0) == 0 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    print("waiting" if t.is_alive() else "done", len(j), flush=True)
    os.unlink(filler)
    t.join(10)
    print("after", len(j), flush=True)
    """
)


@needs_root
@pytest.mark.parametrize("kind", ["ours", "pysyncobj"])
def test_a_real_full_disk_pauses_our_journal_and_kills_pysyncobjs(
    tmp_path: Path, kind: str
) -> None:
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        done = subprocess.run(
            [sys.executable, "-c", FILL_AND_APPEND, str(disk), kind],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
        )
    if kind == "ours":
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[:2] == ["waiting 1", "after 2"]
    else:
        assert done.returncode == -signal.SIGBUS, (done.returncode, done.stdout, done.stderr)


def test_a_leader_that_heard_no_majority_lately_does_not_lead_with_a_quorum() -> None:
    f = Follower(SafeSyncObj, [], 3)
    try:
        obj: Any = f.obj
        assert not obj.quorum_contact_within(1.0)  # a follower
        obj._SyncObj__raftState = _RAFT_STATE.LEADER
        obj._SyncObj__lastResponseTime[f.leader] = raft_clock()
        assert obj.quorum_contact_within(1.0)  # itself and its one peer: 2 of 2
        obj._SyncObj__lastResponseTime[f.leader] = raft_clock() - 5.0
        assert not obj.quorum_contact_within(1.0)  # its Raft thread heard nobody since
    finally:
        f.close()


def test_the_commit_index_waits_for_space_without_failing_the_tick(tmp_path: Path) -> None:
    j = AtomicFileJournal(str(tmp_path / "raft.journal"), None)
    try:
        storer = j._FileJournal__metaStorer
        stored: list[dict[str, Any]] = []
        full = True

        def store(meta: dict[str, Any]) -> None:
            if full:
                raise OSError(errno.ENOSPC, "No space left on device")
            stored.append(dict(meta))

        storer.storeMeta = store
        j.setRaftCommitIndex(7)
        j.onOneSecondTimer()  # no exception out of pysyncobj's tick
        j.onOneSecondTimer()
        assert stored == []
        full = False
        j.onOneSecondTimer()
        assert stored == [{"raftCommitIndex": 7}]
    finally:
        j._destroy()
