"""The Raft channel's encoding (synapse_ha.raft.wire) and the check of received log
entries (synapse_ha.raft.safe_pickle)."""

from __future__ import annotations

import contextlib
import os
import pickle
from typing import Any

import pysyncobj.pickle as raft_pickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.node import TCPNode

from synapse_ha.raft import safe_pickle, wire
from synapse_ha.raft.safe_pickle import (
    TRUNCATED,
    chunks_problem,
    command_problem,
    is_replicated_call,
    message_problem,
)

APPEND = {
    "type": "append_entries",
    "term": 3,
    "commit_index": 10,
    "entries": [(b"\x00" + raft_pickle.dumps((0, (b"batch",), {})), 11, 3)],
    "prevLogIdx": 10,
    "prevLogTerm": 2,
    "serialized": (b"chunk", True, False),
    "ratio": 0.5,
    "none": None,
    "name": "é",
}


def test_a_message_comes_back_as_it_was_sent() -> None:
    data = wire.frame(APPEND)
    assert wire.frame_length(data[:4]) == len(data) - 4
    decoded = wire.decode(data[4:])
    assert decoded == APPEND
    assert type(decoded["entries"][0]) is tuple  # tuples stay tuples, lists lists
    assert type(decoded["entries"]) is list


@pytest.mark.parametrize(
    "value",
    [{1, 2}, object(), {1: "int key"}, 1 << 64, TCPNode("127.0.0.1:1")],
    ids=["set", "object", "int-key", "big-int", "node"],
)
def test_values_outside_the_schema_are_not_sent(value: Any) -> None:
    with pytest.raises(wire.WireError):
        wire.frame({"v": value})


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"X", "unknown tag"),
        (b"NN", "after the value"),
        (b"s\x00\x00\x00\x05ab", "past the end"),
        (b"s\x00\x00\x00\x02\xff\xfe", "UTF-8"),
        (b"l\xff\xff\xff\xff", "exceeds the limit"),
        (b"l\x00\x00\x00\x09N", "past the end"),
        (b"d\x00\x00\x00\x02\x00\x00\x00\x01aN\x00\x00\x00\x01aN", "duplicate key"),
        (b"i\x00\x01", "truncated"),
        (b"l\x00\x00\x00\x01" * (wire.MAX_DEPTH + 2) + b"N", "nest deeper"),
    ],
)
def test_malformed_payloads_are_refused(payload: bytes, why: str) -> None:
    with pytest.raises(wire.WireError, match=why):
        wire.decode(payload)


def test_nesting_and_frames_are_bounded() -> None:
    wire.decode(wire.encode(_nested(wire.MAX_DEPTH)))
    with pytest.raises(wire.WireError, match="nest deeper"):
        wire.encode(_nested(wire.MAX_DEPTH + 2))
    with pytest.raises(wire.WireError, match="exceeds the limit"):
        wire.frame_length((wire.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_refused(payload: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        wire.decode(payload)


class _Shell:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


class _Node:
    def __reduce__(self) -> tuple[Any, ...]:
        return (TCPNode, (1, 2))


def test_pysyncobj_commands_pass() -> None:
    node = TCPNode("127.0.0.1:7001", replica_id="r1", grpc="127.0.0.1:7101")
    assert command_problem(b"\x02" + raft_pickle.dumps(["add", node.id, node])) is None
    assert command_problem(b"\x00" + raft_pickle.dumps((0, (b"\x00\xff",), {}))) is None
    assert command_problem(b"\x03" + raft_pickle.dumps(2)) is None
    assert command_problem(b"\x01") is None  # a new leader's no-op


@settings(max_examples=200, deadline=None)
@given(
    func_id=st.integers(0, 1 << 31 - 1),
    envelope=st.binary(min_size=1, max_size=300),
    cut=st.integers(0, 400),
    flip=st.integers(0, 255),
)
def test_a_replicated_call_is_recognised_byte_for_byte(
    func_id: int, envelope: bytes, cut: int, flip: int
) -> None:
    """The shortcut for the common pickle accepts what pysyncobj writes for a call with a
    bytes argument, and anything else it accepts, the full check accepts too."""
    data = raft_pickle.dumps((func_id, (envelope,), {}))
    assert is_replicated_call(data)
    assert pickle.loads(data) == (func_id, (envelope,), {})
    changed = bytearray(data)
    changed[cut % len(data)] ^= flip or 1
    for other in (bytes(changed), data[: cut % len(data)], data + b"."):
        if is_replicated_call(other):
            assert _full_check(other) is None
            assert pickle.loads(other)[1:] == ((pickle.loads(other)[1][0],), {})


def _full_check(data: bytes) -> str | None:
    """:func:`safe_pickle.pickle_problem` without its shortcut."""
    shortcut = safe_pickle.is_replicated_call
    safe_pickle.is_replicated_call = lambda _data: False  # type: ignore[assignment]
    try:
        return safe_pickle.pickle_problem(data)
    finally:
        safe_pickle.is_replicated_call = shortcut  # type: ignore[assignment]


def test_other_pickles_are_not_taken_for_a_replicated_call() -> None:
    call = raft_pickle.dumps((3, (b"abc",), {}))
    for other in (
        call.replace(b"latin1", b"utf_8_"),
        call.replace(b"_codecs\nencode", b"posix\nsystem"),
        raft_pickle.dumps((3, (b"abc",), {"a": 1})),
        raft_pickle.dumps((3, ("text",), {})),
        raft_pickle.dumps((3, (b"",), {})),
        raft_pickle.dumps((3, (b"a", b"b"), {})),
    ):
        assert not is_replicated_call(other)


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (b"\x00" + pickle.dumps(_Shell(), protocol=2), "imports posix.system"),
        (b"\x00" + pickle.dumps(_Shell(), protocol=0), "imports posix.system"),
        (b"\x00" + pickle.dumps(_Shell(), protocol=4), "built on its stack"),
        (b"\x00" + pickle.dumps(_Node(), protocol=2), "other than its address"),
        (b"\x00" + b"\x80\x02cpysyncobj.node\nTCPNode\nN}X\x01\x00\x00\x00aK\x01s\x86b.", "class"),
        (b"\x00" + b"\x80\x02cbuiltins\neval\n.", "imports builtins.eval"),
        (b"\x00" + b"\x80\x02X\x01\x00\x00\x00aQ.", "BINPERSID"),
        (b"\x00", "does not load"),
        ("text", "not bytes"),
    ],
)
def test_commands_that_import_or_call_are_refused(command: Any, why: str) -> None:
    problem = command_problem(command)
    assert problem is not None and why in problem


def test_a_message_is_refused_for_any_bad_entry() -> None:
    good = (b"\x01", 2, 1)
    bad = (b"\x00" + pickle.dumps(_Shell(), protocol=2), 3, 1)
    assert message_problem({"type": "append_entries", "entries": [good]}) is None
    assert message_problem({"type": "append_entries", "entries": [good, bad]}) is not None
    assert message_problem({"type": "request_vote", "term": 1}) is None


def test_joined_chunks_are_checked_before_they_are_loaded() -> None:
    entry = raft_pickle.dumps((b"\x00" + raft_pickle.dumps((0, (b"x" * 100,), {})), 5, 2))
    assert chunks_problem(entry) is None
    assert chunks_problem(entry[:50]) == TRUNCATED
    evil = pickle.dumps(_Shell(), protocol=2)
    assert "posix.system" in str(chunks_problem(evil))
    inner = raft_pickle.dumps((b"\x00" + evil, 5, 2))
    assert "posix.system" in str(chunks_problem(inner))
