"""Raft pieces of membership and restore, without a network: the member list in the
snapshot file, the deserializer's members, and seeding a restored data directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.raft.replicated_state import ReplicatedState
from synapse_ha.raft.restore import RestoreError, seed_restored_state
from synapse_ha.raft.snapshot_file import SnapshotMember, read_snapshot_file, write_snapshot
from tests.core.harness import job, node

ENTRIES = ((b"\x01newest", 9, 2), (b"\x01older", 8, 2))
MEMBERS = [
    SnapshotMember("127.0.0.1:7012", "r2", "127.0.0.1:7102"),
    SnapshotMember("127.0.0.1:7011", "r1", "127.0.0.1:7101"),
]


def _state() -> ClusterState:
    state = ClusterState()
    apply(state, cmd.RegisterNode(info=node("n1"), now_ms=1))
    apply(state, cmd.SubmitJob(spec=job("a", gpu=8), request_id="r", now_ms=2))
    return state


def test_the_member_list_round_trips_sorted_by_address(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.dump")
    write_snapshot(path, _state(), ENTRIES, MEMBERS)
    snap = read_snapshot_file(path)
    assert snap.members == tuple(sorted(MEMBERS, key=lambda m: m.raft))
    assert snap.entries == ENTRIES
    # The header keeps the previous format version: older replicas still read it.
    header = json.loads(Path(path).read_bytes().partition(b"\n")[0])
    assert header["v"] == 1


def test_a_file_without_members_stands_for_the_configured_ones(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.dump")
    write_snapshot(path, _state(), ENTRIES)
    assert read_snapshot_file(path).members is None
    machine = ReplicatedState()
    assert machine.read_dump(path)[2] == []


def test_the_deserializer_gives_pysyncobj_nodes_that_carry_id_and_grpc(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.dump")
    write_snapshot(path, _state(), ENTRIES, MEMBERS)
    machine = ReplicatedState()
    newest, previous, nodes = machine.read_dump(path)
    assert (newest, previous) == ENTRIES
    described = sorted((n.id, n.replica_id, n.grpc) for n in nodes)
    assert described == sorted((m.raft, m.replica_id, m.grpc) for m in MEMBERS)
    assert encode_state(machine.state) == encode_state(_state())


def test_the_serializer_writes_the_members_it_is_given(tmp_path: Path) -> None:
    source = str(tmp_path / "a.dump")
    write_snapshot(source, _state(), ENTRIES, MEMBERS)
    machine = ReplicatedState()
    newest, previous, nodes = machine.read_dump(source)
    target = str(tmp_path / "b.dump")
    machine.write_dump(target, (newest, previous, set(nodes)))
    assert read_snapshot_file(target).members == read_snapshot_file(source).members


@pytest.mark.parametrize("members", [[], "r1", [["a", "b"]], [["a", "b", 3]]])
def test_a_malformed_member_list_is_refused(tmp_path: Path, members: object) -> None:
    path = tmp_path / "raft.dump"
    write_snapshot(str(path), _state(), ENTRIES)
    line, _, body = path.read_bytes().partition(b"\n")
    header = json.loads(line)
    header["members"] = members
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)
    with pytest.raises(CodecError, match="member"):
        read_snapshot_file(str(path))


def test_seeding_a_restore_writes_a_one_member_snapshot(tmp_path: Path) -> None:
    me = SnapshotMember("127.0.0.1:7011", "r1", "127.0.0.1:7101")
    seed_restored_state(str(tmp_path), _state(), 1, me)
    snap = read_snapshot_file(str(tmp_path / "raft.dump"))
    assert snap.members == (me,)
    assert encode_state(snap.state) == encode_state(_state())
    # Above index 1, so that new members must take the snapshot, never entries.
    assert snap.entries[1][1] >= 2 and snap.entries[0][1] == snap.entries[1][1] + 1
    with pytest.raises(RestoreError, match="already holds"):
        seed_restored_state(str(tmp_path), _state(), 1, me)


def test_a_command_of_a_newer_release_becomes_an_error_result_not_an_exception() -> None:
    from synapse_ha.raft.batch import frame

    machine = ReplicatedState()
    newer = b'{"v": 3, "type": "Barrier", "body": {}}'
    unknown = b'{"v": 2, "type": "AddQueue", "body": {"name": "a"}}'
    results = machine.apply_commands(frame([newer, unknown]), _doApply=True)
    assert [r.code for r in results] == [cmd.ResultCode.INVALID, cmd.ResultCode.INVALID]
    assert "upgrade this replica" in results[0].message
    assert "unknown command type 'AddQueue'" in results[1].message
    assert encode_state(machine.state) == encode_state(ClusterState())
