"""Framing of a batch of encoded commands into one Raft entry.

Group commit: under load, many proposals wait while the previous entry replicates; they
travel together as one log entry and are applied in order, one ``apply`` each, exactly
as if they had been separate entries. The frame is ``MAGIC`` followed by, for each item,
its length (4 bytes, big-endian) and its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

MAGIC = b"SYNB1"
_LENGTH = struct.Struct(">I")


class FrameError(ValueError):
    """Bytes that are not a valid batch frame."""


def frame(items: Sequence[bytes]) -> bytes:
    parts = [MAGIC]
    for item in items:
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def unframe(data: bytes) -> list[bytes]:
    if not isinstance(data, bytes) or not data.startswith(MAGIC):
        raise FrameError("not a batch frame")
    items = []
    offset = len(MAGIC)
    while offset < len(data):
        if offset + _LENGTH.size > len(data):
            raise FrameError("truncated length")
        (size,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + size > len(data):
            raise FrameError("truncated item")
        items.append(data[offset : offset + size])
        offset += size
    return items
