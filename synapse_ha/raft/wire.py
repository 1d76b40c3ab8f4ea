"""The encoding of Raft messages on the TLS channel (:mod:`synapse_ha.raft.tls_transport`):
a small tagged binary format of exactly the values pysyncobj's messages hold, with strict
bounds, never pickle.

A value is one tag byte followed by its body:

* ``N`` None, ``T`` True, ``F`` False;
* ``i`` an integer, 8 bytes signed big-endian (Raft's terms and indexes);
* ``f`` a float, 8 bytes IEEE 754 big-endian;
* ``s`` a string (4-byte length, then UTF-8), ``b`` bytes (4-byte length, then the bytes);
* ``l`` a list and ``t`` a tuple (4-byte count, then the items);
* ``d`` a dict with string keys (4-byte count, then key and value for each, keys as
  their body without a tag).

A frame is a 4-byte big-endian length followed by one value of that many bytes; a frame
holds at most :data:`MAX_FRAME_BYTES`, values nest at most :data:`MAX_DEPTH` deep, and a
container holds at most :data:`MAX_ITEMS` items. Anything else (an unknown tag, a length
past the frame's end, bytes left over, invalid UTF-8, a duplicate key) is a
:class:`WireError`, and the channel closes the connection it came on.
"""

from __future__ import annotations

import struct
from typing import Any

# A Raft message holds at most a batch of entries (pysyncobj splits larger ones into
# chunks of appendEntriesBatchSizeBytes), so frames stay far below this.
MAX_FRAME_BYTES = 32 << 20
MAX_DEPTH = 16
MAX_ITEMS = 1 << 20
LENGTH = struct.Struct(">I")
_INT = struct.Struct(">q")
_FLOAT = struct.Struct(">d")
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


class WireError(ValueError):
    """A value that cannot be encoded, or bytes that are not one well-formed value."""


def frame(message: Any) -> bytes:
    """``message`` encoded, behind its length."""
    out = bytearray(LENGTH.size)
    _encode(message, out, 0)
    size = len(out) - LENGTH.size
    if size > MAX_FRAME_BYTES:
        raise WireError(f"a message of {size} bytes exceeds the frame limit {MAX_FRAME_BYTES}")
    LENGTH.pack_into(out, 0, size)
    return bytes(out)


def frame_length(header: bytes) -> int:
    """The payload length a frame's 4-byte header announces; :class:`WireError` past the
    limit."""
    (size,) = LENGTH.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise WireError(f"a frame of {size} bytes exceeds the limit {MAX_FRAME_BYTES}")
    return int(size)


def encode(value: Any) -> bytes:
    """One value's encoding (a frame's payload)."""
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def decode(payload: bytes) -> Any:
    """The one value ``payload`` holds, all of it; :class:`WireError` otherwise."""
    if len(payload) > MAX_FRAME_BYTES:
        raise WireError(f"a payload of {len(payload)} bytes exceeds the limit")
    view = memoryview(payload)
    try:
        value, end = _decode(view, 0, 0)
    except (struct.error, IndexError) as exc:
        raise WireError(f"truncated value: {exc}") from exc
    if end != len(payload):
        raise WireError(f"{len(payload) - end} bytes after the value")
    return value


def _encode(value: Any, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"values nest deeper than {MAX_DEPTH}")
    kind = type(value)
    if value is None:
        out += b"N"
    elif value is True:
        out += b"T"
    elif value is False:
        out += b"F"
    elif kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise WireError(f"integer {value} does not fit in 64 bits")
        out += b"i"
        out += _INT.pack(value)
    elif kind is float:
        out += b"f"
        out += _FLOAT.pack(value)
    elif kind is str:
        data = value.encode()
        out += b"s"
        out += LENGTH.pack(len(data))
        out += data
    elif kind is bytes or kind is bytearray:
        out += b"b"
        out += LENGTH.pack(len(value))
        out += value
    elif kind is list or kind is tuple:
        _check_count(len(value))
        out += b"l" if kind is list else b"t"
        out += LENGTH.pack(len(value))
        for item in value:
            _encode(item, out, depth + 1)
    elif kind is dict:
        _check_count(len(value))
        out += b"d"
        out += LENGTH.pack(len(value))
        for key, item in value.items():
            if type(key) is not str:
                raise WireError(f"dict key {key!r} is not a string")
            data = key.encode()
            out += LENGTH.pack(len(data))
            out += data
            _encode(item, out, depth + 1)
    else:
        raise WireError(f"a value of type {kind.__name__} cannot be sent")


def _check_count(count: int) -> None:
    if count > MAX_ITEMS:
        raise WireError(f"a container of {count} items exceeds the limit {MAX_ITEMS}")


def _decode(view: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise WireError(f"values nest deeper than {MAX_DEPTH}")
    tag = view[pos]
    pos += 1
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x69:  # i
        return _INT.unpack_from(view, pos)[0], pos + 8
    if tag == 0x66:  # f
        return _FLOAT.unpack_from(view, pos)[0], pos + 8
    if tag == 0x73:  # s
        return _text(view, pos)
    if tag == 0x62:  # b
        data, pos = _span(view, pos)
        return bytes(data), pos
    if tag == 0x6C or tag == 0x74:  # l, t
        return _sequence(view, pos, depth, tag == 0x74)
    if tag == 0x64:  # d
        return _mapping(view, pos, depth)
    raise WireError(f"unknown tag {tag:#04x} at byte {pos - 1}")


def _span(view: memoryview, pos: int) -> tuple[memoryview, int]:
    (size,) = LENGTH.unpack_from(view, pos)
    pos += LENGTH.size
    end = pos + size
    if end > len(view):
        raise WireError(f"a length of {size} runs past the end of the frame")
    return view[pos:end], end


def _text(view: memoryview, pos: int) -> tuple[str, int]:
    data, pos = _span(view, pos)
    try:
        return str(data, "utf-8"), pos
    except UnicodeDecodeError as exc:
        raise WireError(f"invalid UTF-8 in a string: {exc}") from exc


def _count(view: memoryview, pos: int) -> tuple[int, int]:
    (count,) = LENGTH.unpack_from(view, pos)
    _check_count(count)
    if count > len(view) - pos:  # every item takes at least one byte
        raise WireError(f"a count of {count} runs past the end of the frame")
    return int(count), pos + LENGTH.size


def _sequence(view: memoryview, pos: int, depth: int, as_tuple: bool) -> tuple[Any, int]:
    count, pos = _count(view, pos)
    items = []
    for _ in range(count):
        item, pos = _decode(view, pos, depth + 1)
        items.append(item)
    return (tuple(items) if as_tuple else items), pos


def _mapping(view: memoryview, pos: int, depth: int) -> tuple[dict[str, Any], int]:
    count, pos = _count(view, pos)
    result: dict[str, Any] = {}
    for _ in range(count):
        key, pos = _text(view, pos)
        if key in result:
            raise WireError(f"duplicate key {key!r}")
        result[key], pos = _decode(view, pos, depth + 1)
    return result, pos
