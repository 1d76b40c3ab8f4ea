"""The backup file: header with index and checksum, refused when not intact."""

from __future__ import annotations

import json

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.backup import BackupError, decode_backup, encode_backup
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from tests.core.harness import job, node


def _state() -> ClusterState:
    state = ClusterState()
    apply(state, cmd.RegisterNode(info=node("n1"), now_ms=1))
    apply(state, cmd.SubmitJob(spec=job("a", gpu=8), request_id="r", now_ms=2))
    return state


def test_round_trip_keeps_state_index_and_checksum() -> None:
    encoded = encode_state(_state())
    data = encode_backup(encoded, raft_index=42, raft_term=3, replica_id="r1")
    backup = decode_backup(data)
    assert backup.encoded_state == encoded
    assert encode_state(backup.state) == encoded
    assert (backup.header.raft_index, backup.header.raft_term) == (42, 3)
    assert backup.header.replica_id == "r1" and backup.header.size == len(encoded)


def _header_and_body(data: bytes) -> tuple[dict[str, object], bytes]:
    line, _, body = data.partition(b"\n")
    return json.loads(line), body


def _with_header(data: bytes, **changes: object) -> bytes:
    header, body = _header_and_body(data)
    header.update(changes)
    return json.dumps(header).encode() + b"\n" + body


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "corrupt: SHA-256"),
        (lambda d: d[:-3], "truncated"),
        (lambda d: d + b"x", "truncated or padded"),
        (lambda d: b"garbage", "no header line"),
        (lambda d: b"{not json\n" + d, "not JSON"),
        (lambda d: _with_header(d, format="other"), "no format"),
        (lambda d: _with_header(d, v=99), "version 99"),
        (lambda d: _with_header(d, raft_index=-1), "raft_index"),
    ],
)
def test_a_damaged_backup_is_refused_with_what_is_wrong(mangle: object, message: str) -> None:
    data = encode_backup(encode_state(_state()), raft_index=7, raft_term=1, replica_id="r1")
    assert callable(mangle)
    with pytest.raises(BackupError, match=message):
        decode_backup(mangle(data))
