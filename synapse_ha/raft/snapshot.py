"""The full-dump (snapshot) file format, written with our own codec instead of pickle.

pysyncobj hands a custom serializer the two newest applied log entries and the cluster
membership, but not the replicated objects: the serializer reads the state itself. The
file is one JSON header line (format version and the two log entries, commands in
base64) followed by the canonical state encoding from :mod:`synapse_ha.core.codec`.

The serializer runs synchronously on the Raft thread between two applies, so the state it
reads is exactly the state after the newest entry it is given.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from synapse_ha.core.codec import CodecError, decode_state, encode_state
from synapse_ha.core.model import ClusterState

SNAPSHOT_VERSION = 1

LogEntry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj stores them


def write_snapshot(path: str, state: ClusterState, entries: tuple[LogEntry, LogEntry]) -> None:
    header = {
        "v": SNAPSHOT_VERSION,
        "entries": [
            [base64.b64encode(command).decode("ascii"), index, term]
            for command, index, term in entries
        ],
    }
    body = encode_state(state)
    with open(path, "wb") as f:
        f.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
        f.write(body)
        f.flush()
        os.fsync(f.fileno())


def read_snapshot(path: str) -> tuple[ClusterState, tuple[LogEntry, LogEntry]]:
    """Raises :class:`CodecError` for a file that is not a valid snapshot."""
    with open(path, "rb") as f:
        header_line = f.readline()
        body = f.read()
    try:
        header: Any = json.loads(header_line)
    except ValueError as exc:
        raise CodecError(f"snapshot header: {exc}") from None
    if not isinstance(header, dict) or header.get("v") != SNAPSHOT_VERSION:
        raise CodecError("snapshot header: unsupported version")
    raw = header.get("entries")
    if not isinstance(raw, list) or len(raw) != 2:
        raise CodecError("snapshot header: expected two log entries")
    entries: list[LogEntry] = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or type(item[1]) is not int
            or type(item[2]) is not int
        ):
            raise CodecError("snapshot header: malformed log entry")
        entries.append((base64.b64decode(item[0]), item[1], item[2]))
    return decode_state(body), (entries[0], entries[1])
