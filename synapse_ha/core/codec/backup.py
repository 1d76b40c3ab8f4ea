"""The backup file: one consistent state of the cluster, its Raft position and a checksum.

A backup is made by ``synctl cluster snapshot save FILE`` from the leader and read by
``synapse-scheduler --restore FILE``. Its bytes are::

    {"format":"synapse-backup","v":1,"raft_index":..,"raft_term":..,"replica_id":..,
     "size":..,"sha256":".."}\\n
    <the canonical state encoding of synapse_ha.core.codec.versioned>

The header is one JSON line; ``size`` and ``sha256`` are those of the state bytes that
follow it, so a truncated or altered file is refused before anything is restored. Pure
functions over bytes: reading and writing files is the callers' business.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.core.model import ClusterState

BACKUP_FORMAT = "synapse-backup"
BACKUP_VERSION = 1


class BackupError(ValueError):
    """Bytes that are not an intact backup; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class BackupHeader:
    raft_index: int  # the Raft log index the state is the result of
    raft_term: int
    replica_id: str  # the replica (the leader) it was read from
    size: int
    sha256: str  # hex SHA-256 of the state bytes


@dataclass(frozen=True, slots=True)
class Backup:
    header: BackupHeader
    state: ClusterState
    encoded_state: bytes


def encode_backup(encoded_state: bytes, raft_index: int, raft_term: int, replica_id: str) -> bytes:
    header = {
        "format": BACKUP_FORMAT,
        "v": BACKUP_VERSION,
        "raft_index": raft_index,
        "raft_term": raft_term,
        "replica_id": replica_id,
        "size": len(encoded_state),
        "sha256": hashlib.sha256(encoded_state).hexdigest(),
    }
    line = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return line + b"\n" + encoded_state


def decode_backup(data: bytes) -> Backup:
    """The backup in ``data``; raises :class:`BackupError` for anything not intact."""
    line, sep, body = data.partition(b"\n")
    if not sep:
        raise BackupError("not a synapse backup: no header line")
    try:
        raw: Any = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise BackupError("not a synapse backup: the header is not JSON") from None
    if not isinstance(raw, dict) or raw.get("format") != BACKUP_FORMAT:
        raise BackupError(f"not a synapse backup: the header has no format {BACKUP_FORMAT!r}")
    if raw.get("v") != BACKUP_VERSION:
        raise BackupError(
            f"backup format version {raw.get('v')!r} is not one this release reads "
            f"({BACKUP_VERSION}); restore it with the release that wrote it"
        )
    header = _header(raw)
    if len(body) != header.size:
        raise BackupError(
            f"backup is truncated or padded: the header says {header.size} state bytes, "
            f"the file has {len(body)}"
        )
    digest = hashlib.sha256(body).hexdigest()
    if digest != header.sha256:
        raise BackupError(
            f"backup is corrupt: SHA-256 of the state is {digest}, the header says {header.sha256}"
        )
    try:
        state = decode_state(body)
    except CodecError as exc:
        raise BackupError(f"backup state cannot be read: {exc}") from None
    return Backup(header=header, state=state, encoded_state=body)


def _header(raw: dict[str, Any]) -> BackupHeader:
    ints = ("raft_index", "raft_term", "size")
    for name in ints:
        if type(raw.get(name)) is not int or raw[name] < 0:
            raise BackupError(f"backup header: {name} must be a non-negative integer")
    for name in ("replica_id", "sha256"):
        if not isinstance(raw.get(name), str):
            raise BackupError(f"backup header: {name} must be a string")
    return BackupHeader(
        raft_index=raw["raft_index"],
        raft_term=raw["raft_term"],
        replica_id=raw["replica_id"],
        size=raw["size"],
        sha256=raw["sha256"],
    )
