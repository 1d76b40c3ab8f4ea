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
from synapse_ha.local.launcher import free_ports, wait_until
from synapse_ha.raft import journal as durable
from synapse_ha.raft.replica import RaftReplica

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
    class FakeSyncObj:
        _SyncObj__raftLog = FileJournal(str(tmp_path / "plain.journal"))

    with pytest.raises(durable.JournalHookError, match="not a durable one"):
        durable.check_installed(FakeSyncObj())
    FakeSyncObj._SyncObj__raftLog._destroy()


@pytest.mark.integration
@pytest.mark.parametrize("fsync", [True, False])
def test_a_replica_in_fsync_mode_syncs_its_journal_for_every_command(
    tmp_path: Path, fsync: bool
) -> None:
    raft_port, grpc_port = free_ports(2)
    me = f"127.0.0.1:{raft_port}"
    replica = RaftReplica(
        me,
        [me],
        str(tmp_path),
        "test-password",
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
