"""The replicated entry point, batch framing and the snapshot file, without a network."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.versioned import decode_state, encode_command, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.views import host_of
from synapse_ha.raft.batch import FrameError, frame, unframe
from synapse_ha.raft.replicated_state import ReplicatedState
from synapse_ha.raft.snapshot_file import read_snapshot, write_snapshot
from tests.core.harness import job, node


def apply_framed(machine: ReplicatedState, items: list[bytes]) -> list[cmd.Result]:
    # ``_doApply`` runs the replicated method locally, as pysyncobj does when applying.
    results: list[cmd.Result] = machine.apply_commands(frame(items), _doApply=True)
    return results


def test_framing_round_trips_and_rejects_garbage() -> None:
    items = [b"", b"a", b"\x00" * 70_000]
    assert unframe(frame(items)) == items
    assert unframe(frame([])) == []
    for bad in (b"", b"nope", frame([b"abc"])[:-1]):
        with pytest.raises(FrameError):
            unframe(bad)


def test_the_replicated_method_applies_in_order_and_never_raises() -> None:
    machine = ReplicatedState()
    submit = cmd.SubmitJob(spec=job("a"), request_id="r1", now_ms=5)
    results = apply_framed(
        machine,
        [
            encode_command(cmd.RegisterNode(info=node("n1"), now_ms=1)),
            b"not json at all",
            b'{"v": 99, "type": "Barrier", "body": {}}',
            encode_command(submit),
            encode_command(submit),
        ],
    )
    codes = [r.code for r in results]
    assert codes == [
        cmd.ResultCode.OK,
        cmd.ResultCode.INVALID,
        cmd.ResultCode.INVALID,
        cmd.ResultCode.OK,
        cmd.ResultCode.OK,
    ]
    assert results[3].job_id == results[4].job_id
    assert list(machine.state.nodes) == ["n1"]
    assert len(machine.state.jobs) == 1
    # A malformed frame applies nothing and answers with no result.
    assert machine.apply_commands(b"garbage", _doApply=True) == []


def test_a_snapshot_restores_the_exact_state(tmp_path: Path) -> None:
    state = ClusterState()
    apply(state, cmd.RegisterNode(info=node("n1"), now_ms=1))
    apply(state, cmd.SubmitJob(spec=job("a", gpu=8), request_id="r", now_ms=2))
    bind = schedule(state, 3).command(3)
    assert bind is not None
    apply(state, bind)
    path = str(tmp_path / "raft.dump")
    entries = ((b"\x01newest", 7, 2), (b"\x01older", 6, 2))
    write_snapshot(path, state, entries)
    restored, restored_entries = read_snapshot(path)
    assert encode_state(restored) == encode_state(state)
    assert restored_entries == entries

    machine = ReplicatedState()
    # A file without a member list stands for the configured members (none here).
    assert machine.read_dump(path) == (entries[0], entries[1], [])
    assert encode_state(machine.state) == encode_state(state)


def test_a_snapshot_is_read_as_the_core_decodes_it_whatever_the_parser_takes(
    tmp_path: Path,
) -> None:
    """The file's state is parsed by msgspec, and what msgspec refuses by the core's
    parser: the state read is the core's decoding either way, and a body that is not a
    state is named as the core names it."""
    state = ClusterState()
    state.config = replace(state.config, compact_state=True)
    apply(state, cmd.RegisterNode(info=node("n1"), now_ms=1))
    for i in range(3):
        apply(state, cmd.SubmitJob(spec=job(f"j{i}", gpu=4), request_id=f"r{i}", now_ms=2))
    bind = schedule(state, 3).command(3)
    assert bind is not None
    apply(state, bind)
    state.last_time_ms = 2**70  # an integer beyond 64 bits is read as one
    entries = ((b"\x01newest", 7, 2), (b"\x01older", 6, 2))
    path = tmp_path / "raft.dump"
    write_snapshot(str(path), state, entries)
    body = encode_state(state)
    assert msgspec.json.decode(body) == json.loads(body)
    restored = read_snapshot(str(path))[0]
    assert restored == decode_state(body) == state
    assert encode_state(restored) == body

    header = path.read_bytes().partition(b"\n")[0] + b"\n"
    # msgspec refuses a NaN, the core's parser takes it and names the field.
    path.write_bytes(header + body.replace(str(2**70).encode(), b"NaN"))
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(path.read_bytes().partition(b"\n")[2])
    with pytest.raises(CodecError, match=r"^state\.last_time_ms: expected an integer, got float"):
        read_snapshot(str(path))
    path.write_bytes(header + body[:-5])
    with pytest.raises(CodecError, match=r"^state: not valid JSON"):
        read_snapshot(str(path))


@pytest.mark.parametrize(
    ("address", "host"),
    [("10.0.0.1:7070", "10.0.0.1"), ("10.0.0.1", "10.0.0.1"), ("[::1]:80", "::1"), ("h", "h")],
)
def test_host_of(address: str, host: str) -> None:
    assert host_of(address) == host
