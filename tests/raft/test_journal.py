"""The fsync mode of the Raft journal (synapse_ha.raft.journal): which journal pysyncobj
builds, that every change is synced before the method returns, that the snapshot is
synced before the journal forgets entries, and that the term/vote file is durable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pysyncobj.syncobj as syncobj_module
import pytest
from pysyncobj.journal import FileJournal

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState
from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.waiting import wait_until
from synapse_ha.raft import journal as durable
from synapse_ha.raft.replica import RaftReplica
from synapse_ha.raft.snapshot_file import write_snapshot
from tests.integration.cluster import PASSWORD

# pysyncobj's MetaStorer.getMeta reads the term/vote file with open(...).read() and
# leaves closing it to the garbage collector; reopening a journal here triggers that.
pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[tuple[str, str]]:
    journal, dump = str(tmp_path / "raft.journal"), str(tmp_path / "raft.dump")
    try:
        yield journal, dump
    finally:
        durable.unregister(journal)


def test_a_registered_path_gets_a_durable_journal_and_others_the_plain_one(
    tmp_path: Path, paths: tuple[str, str]
) -> None:
    journal_path, dump_path = paths
    durable.register(journal_path, dump_path)
    built = syncobj_module.createJournal(journal_path)
    other = syncobj_module.createJournal(str(tmp_path / "other.journal"))
    try:
        assert isinstance(built, durable.DurableFileJournal)
        assert built.dump_file == dump_path
        assert type(other) is FileJournal
        assert syncobj_module.createJournal(None).__class__.__name__ == "MemoryJournal"
    finally:
        built._destroy()
        other._destroy()


def test_unregistering_gives_the_plain_journal_again(paths: tuple[str, str]) -> None:
    journal_path, dump_path = paths
    durable.register(journal_path, dump_path)
    durable.unregister(journal_path)
    built = syncobj_module.createJournal(journal_path)
    try:
        assert type(built) is FileJournal
    finally:
        built._destroy()


def test_every_append_and_truncation_is_synced_and_survives_a_reopen(
    paths: tuple[str, str],
) -> None:
    journal_path, dump_path = paths
    journal = durable.DurableFileJournal(journal_path, dump_path)
    start = journal.syncs
    for i in range(1, 6):
        journal.add(b"cmd%d" % i, i, 1)
        assert journal.syncs == start + i
    journal.deleteEntriesFrom(3)
    assert journal.syncs == start + 6
    journal._destroy()
    reopened = durable.DurableFileJournal(journal_path, dump_path)
    try:
        kept = [reopened[i] for i in range(len(reopened))]
        assert kept == [(b"cmd1", 1, 1), (b"cmd2", 2, 1), (b"cmd3", 3, 1)]
    finally:
        reopened._destroy()


def test_the_snapshot_is_synced_before_the_journal_forgets_entries(
    paths: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal_path, dump_path = paths
    Path(dump_path).write_bytes(b"snapshot")
    journal = durable.DurableFileJournal(journal_path, dump_path)
    events: list[str] = []
    real_fsync_file = durable.fsync_file

    def spy_fsync_file(path: str) -> bool:
        events.append(f"fsync {Path(path).name} with {len(journal)} entries")
        return real_fsync_file(path)

    monkeypatch.setattr(durable, "fsync_file", spy_fsync_file)
    try:
        for i in range(1, 11):
            journal.add(b"c", i, 1)
        before = journal.syncs
        journal.deleteEntriesTo(8)
        # The snapshot was synced while the journal still held every entry; the rewrite
        # of the two kept entries cost one sync, not one per entry.
        assert events == ["fsync raft.dump with 10 entries"]
        assert journal.syncs == before + 1
        assert [journal[i][1] for i in range(len(journal))] == [9, 10]
        events.clear()
        journal.clear()
        assert events == ["fsync raft.dump with 2 entries"]
        assert len(journal) == 0
    finally:
        journal._destroy()


def test_term_and_vote_are_stored_through_a_synced_rename(
    paths: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal_path, dump_path = paths
    journal = durable.DurableFileJournal(journal_path, dump_path)
    synced_dirs: list[str] = []
    real = durable.fsync_directory

    def spy(path: str) -> None:
        synced_dirs.append(path)
        real(path)

    monkeypatch.setattr(durable, "fsync_directory", spy)
    try:
        journal.setCurrentTerm(7, "127.0.0.1:1")
        assert synced_dirs == [str(Path(journal_path).parent)]
        assert not Path(journal_path + ".meta.tmp").exists()
    finally:
        journal._destroy()
    reopened = FileJournal(journal_path)
    try:
        assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (7, "127.0.0.1:1")
    finally:
        reopened._destroy()


def test_check_installed_refuses_a_plain_journal(tmp_path: Path) -> None:
    plain = FileJournal(str(tmp_path / "plain.journal"))

    class FakeSyncObj:
        def raft_log(self) -> FileJournal:
            return plain

    with pytest.raises(durable.JournalHookError, match="not a durable one"):
        durable.check_installed(FakeSyncObj())
    plain._destroy()


@pytest.mark.integration
@pytest.mark.parametrize("fsync", [True, False])
def test_a_replica_in_fsync_mode_syncs_its_journal_for_every_command(
    tmp_path: Path, fsync: bool
) -> None:
    raft_port, grpc_port = reserve_ports(2)
    me = f"127.0.0.1:{raft_port}"
    replica = RaftReplica(
        me,
        [me],
        str(tmp_path),
        PASSWORD,
        secure=True,
        directory={me: ("r1", f"127.0.0.1:{grpc_port}")},
        fsync=fsync,
    )
    try:
        journal = durable.journal_of(replica._sync)
        assert isinstance(journal, durable.DurableFileJournal) is fsync
        wait_until("r1 leads alone", replica.is_leader, 15.0, every_s=0.02)
        before = journal.syncs if fsync else 0
        result = replica.propose(cmd.Barrier("r1")).result(10.0)
        assert result.ok
        if fsync:
            assert journal.syncs > before
    finally:
        replica.stop()
        durable.unregister(str(tmp_path / "raft.journal"))


# ------------------------------------------------------- compaction a crash cannot tear


class Killed(Exception):
    """Stands for the process dying at that point."""


def _filled(path: str, n: int) -> FileJournal:
    journal = FileJournal(path)
    for i in range(1, n + 1):
        journal.add(b"cmd%d" % i, i, 1)
    return journal


def _on_disk(path: str) -> list[int]:
    reopened = FileJournal(path)
    try:
        return [reopened[i][1] for i in range(len(reopened))]
    finally:
        reopened._destroy()


def test_pysyncobj_alone_loses_the_newest_entries_when_killed_while_compacting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "plain.journal")
    journal = _filled(path, 10)
    real_add = FileJournal.add
    added: list[int] = []

    def dying_add(self: FileJournal, command: bytes, idx: int, term: int) -> None:
        if len(added) == 2:
            raise Killed
        added.append(idx)
        real_add(self, command, idx, term)

    monkeypatch.setattr(FileJournal, "add", dying_add)
    with pytest.raises(Killed):
        journal.deleteEntriesTo(4)  # keeps 5..10, rewritten in place
    monkeypatch.undo()
    assert _on_disk(path) == [5, 6]  # 7..10 are gone
    journal._destroy()


@pytest.mark.parametrize("fsync", [False, True], ids=["no-fsync", "fsync"])
def test_a_compaction_killed_before_its_rename_leaves_the_whole_old_journal(
    paths: tuple[str, str], monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    journal_path, dump_path = paths
    cls = durable.DurableFileJournal if fsync else durable.AtomicFileJournal
    journal = cls(journal_path, dump_path)
    for i in range(1, 11):
        journal.add(b"cmd%d" % i, i, 1)

    def killed(*_: object) -> None:
        raise Killed

    monkeypatch.setattr(durable.os, "replace", killed)
    with pytest.raises(Killed):
        journal.deleteEntriesTo(4)
    monkeypatch.undo()
    assert _on_disk(journal_path) == list(range(1, 11))
    journal.deleteEntriesTo(4)
    assert [journal[i][1] for i in range(len(journal))] == [5, 6, 7, 8, 9, 10]
    journal.add(b"cmd11", 11, 2)  # appends go to the new file
    journal._destroy()
    assert _on_disk(journal_path) == [5, 6, 7, 8, 9, 10, 11]


def _snapshot_at(dump_path: str, newest: int, term: int = 1) -> None:
    entries = ((b"cmd%d" % newest, newest, term), (b"cmd%d" % (newest - 1), newest - 1, term))
    write_snapshot(dump_path, ClusterState(), entries)


def test_a_journal_older_than_its_snapshot_is_aligned_so_no_entry_after_it_is_lost(
    paths: tuple[str, str],
) -> None:
    """Killed after the snapshot was renamed into place and before the journal was
    compacted: on opening, the entries the snapshot covers are dropped and the journal
    begins at the snapshot, which is what pysyncobj's loader keeps."""
    journal_path, dump_path = paths
    _filled(journal_path, 10)._destroy()
    _snapshot_at(dump_path, newest=7)
    journal = durable.AtomicFileJournal(journal_path, dump_path)
    try:
        assert [journal[i][1] for i in range(len(journal))] == [6, 7, 8, 9, 10]
        assert journal.compactions == 1
    finally:
        journal._destroy()
    assert _on_disk(journal_path) == [6, 7, 8, 9, 10]


@pytest.mark.parametrize(("newest", "term"), [(7, 2), (12, 1), (2, 1)])
def test_a_journal_is_left_alone_when_its_snapshot_does_not_match_it(
    paths: tuple[str, str], newest: int, term: int
) -> None:
    journal_path, dump_path = paths
    _filled(journal_path, 10)._destroy()
    _snapshot_at(dump_path, newest=newest, term=term)
    journal = durable.AtomicFileJournal(journal_path, dump_path)
    try:
        assert len(journal) == 10 and journal.compactions == 0
    finally:
        journal._destroy()


@pytest.mark.integration
def test_a_replica_killed_between_snapshot_and_compaction_keeps_every_entry(
    tmp_path: Path,
) -> None:
    """A real restart: the snapshot covers the first half of the journal, which still
    holds every entry; the replica comes back with every command after it applied."""
    raft_port, grpc_port = reserve_ports(2)
    me = f"127.0.0.1:{raft_port}"
    directory = {me: ("r1", f"127.0.0.1:{grpc_port}")}
    replica = RaftReplica(me, [me], str(tmp_path), PASSWORD, directory=directory, secure=True)
    try:
        wait_until("r1 leads alone", replica.is_leader, 15.0, every_s=0.02)
        for i in range(6):
            assert replica.propose(cmd.Barrier(f"b{i}")).result(10.0).ok
        journal = durable.journal_of(replica._sync)
        newest, previous = journal[len(journal) - 1], journal[len(journal) - 2]
        at_snapshot = replica.machine.state.applied_commands
        for i in range(6, 12):
            assert replica.propose(cmd.Barrier(f"b{i}")).result(10.0).ok
        later = replica.machine.state.applied_commands - at_snapshot
        last = journal[len(journal) - 1][1]
    finally:
        replica.stop()
    # The snapshot a compaction would have written at that point, renamed into place (a
    # state that counts no command); the journal not compacted yet.
    write_snapshot(str(tmp_path / "raft.dump"), ClusterState(), (newest, previous))
    again = RaftReplica(me, [me], str(tmp_path), PASSWORD, directory=directory, secure=True)
    try:
        log = durable.journal_of(again._sync)
        assert log[0] == previous and log[len(log) - 1][1] >= last
        wait_until("r1 leads again", again.is_leader, 15.0, every_s=0.02)
        wait_until(
            "every command after the snapshot applied",
            lambda: again.machine.state.applied_commands >= later,
            15.0,
            every_s=0.02,
        )
    finally:
        again.stop()
        durable.unregister(str(tmp_path / "raft.journal"))
