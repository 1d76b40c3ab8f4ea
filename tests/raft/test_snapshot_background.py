"""Snapshot files written off the Raft thread by a forked child (log compaction): the file
holds the state as of the entry pysyncobj names, even when applies continue while it is
written; the checker reports the outcome once; a stale temporary file is never renamed
into place; a writer still running when the replica stops is killed and leaves the
previous file."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pysyncobj.config import SERIALIZER_STATE

import synapse_ha.raft.snapshot_file as snapshot_module
from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import apply_tracked, full_copy
from synapse_ha.raft.replicated_state import ReplicatedState
from synapse_ha.raft.snapshot_file import read_snapshot_file, write_snapshot
from tests.core.harness import job, node

ENTRIES = ((b"\x01newest", 9, 2), (b"\x01older", 8, 2))


def _machine(tmp_path: Path) -> ReplicatedState:
    machine = ReplicatedState()
    state = ClusterState()
    apply(state, cmd.RegisterNode(info=node("n1"), now_ms=1))
    apply(state, cmd.SubmitJob(spec=job("a", gpu=8), request_id="r", now_ms=2))
    machine.state = state
    machine.dump_path = str(tmp_path / "raft.dump")
    return machine


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Holds every background write (in the forked child) until the test creates the
    returned file."""
    opened = tmp_path / "gate-open"
    real = snapshot_module.replace_snapshot

    def gated(*args: object) -> None:
        deadline = time.monotonic() + 30
        while not opened.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot_module, "replace_snapshot", gated)
    yield opened
    opened.touch()


def _finish(machine: ReplicatedState) -> None:
    assert machine.dump_write is not None
    assert machine.dump_write.wait(30) is not None, "the snapshot writer did not exit"


def test_the_file_holds_the_state_of_the_named_entry_while_applies_go_on(
    tmp_path: Path, gate: Path
) -> None:
    machine = _machine(tmp_path)
    expected = encode_state(full_copy(machine.state))
    tmp = tmp_path / "raft.dump.tmp"
    machine.start_dump(str(tmp), (ENTRIES[0], ENTRIES[1], set()))
    # An apply right after the serializer returned, as the Raft thread would do next.
    with machine.lock:
        command = cmd.SubmitJob(spec=job("b", gpu=1), request_id="r2", now_ms=3)
        assert apply_tracked(machine.state, command, machine._snapshots.changes).ok
    assert machine.dump_progress() == SERIALIZER_STATE.SERIALIZING
    gate.touch()
    _finish(machine)
    assert machine.dump_progress() == SERIALIZER_STATE.SUCCESS
    assert machine.dump_progress() == SERIALIZER_STATE.NOT_SERIALIZING
    written = read_snapshot_file(str(tmp_path / "raft.dump"))
    assert written.entries == ENTRIES
    assert encode_state(written.state) == expected
    assert "b" not in {j.spec.name for j in written.state.jobs.values()}
    assert not tmp.exists()


def test_a_stale_temporary_file_is_removed_so_it_cannot_replace_the_snapshot(
    tmp_path: Path,
) -> None:
    machine = _machine(tmp_path)
    tmp = tmp_path / "raft.dump.tmp"
    write_snapshot(str(tmp), ClusterState(), ENTRIES)  # left over by an older process
    machine.start_dump(str(tmp), (ENTRIES[0], ENTRIES[1], set()))
    assert not tmp.exists()
    _finish(machine)
    assert machine.dump_progress() == SERIALIZER_STATE.SUCCESS


def test_a_failed_write_is_reported_once_and_keeps_the_previous_file(tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    previous = tmp_path / "raft.dump"
    write_snapshot(str(previous), ClusterState(), ENTRIES)
    before = previous.read_bytes()
    machine.dump_path = str(tmp_path / "missing-dir" / "raft.dump")
    machine.start_dump(str(tmp_path / "t"), (ENTRIES[0], ENTRIES[1], set()))
    _finish(machine)
    assert machine.dump_progress() == SERIALIZER_STATE.FAILED
    assert machine.dump_progress() == SERIALIZER_STATE.NOT_SERIALIZING
    assert previous.read_bytes() == before


def test_a_writer_still_running_when_the_replica_stops_is_killed(
    tmp_path: Path, gate: Path
) -> None:
    machine = _machine(tmp_path)
    previous = tmp_path / "raft.dump"
    write_snapshot(str(previous), ClusterState(), ENTRIES)
    before = previous.read_bytes()
    machine.start_dump(str(tmp_path / "t"), (ENTRIES[0], ENTRIES[1], set()))
    assert machine.dump_write is not None
    pid = machine.dump_write.pid
    machine.stop_dump()
    assert machine.dump_write.exit_code == -9
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
    gate.touch()
    assert machine.dump_progress() == SERIALIZER_STATE.FAILED
    assert previous.read_bytes() == before


def test_the_writer_is_a_child_process_polled_without_blocking(tmp_path: Path, gate: Path) -> None:
    machine = _machine(tmp_path)
    machine.start_dump(str(tmp_path / "t"), (ENTRIES[0], ENTRIES[1], set()))
    assert machine.dump_write is not None
    assert machine.dump_write.pid != os.getpid()
    assert machine.dump_write.poll() is None
    gate.touch()
    _finish(machine)
    assert machine.dump_progress() == SERIALIZER_STATE.SUCCESS
    assert read_snapshot_file(str(tmp_path / "raft.dump")).entries == ENTRIES
