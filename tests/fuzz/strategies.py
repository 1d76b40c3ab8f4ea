"""Hypothesis strategies built from protobuf descriptors, for any request message.

:func:`message_strategy` walks a message descriptor and draws a value for a random subset
of its fields: scalars over their whole range (and the edges), strings and bytes that are
empty, odd (NUL, path traversal, control and non-ASCII characters) or huge, repeated fields
that are empty, short or long, enums with numbers no version of the schema defines,
nested messages (to a bounded depth) and map fields. Nothing is specific to one message,
so a method added to a service is fuzzed without a change here.

:func:`request_methods` lists every method of every service of the given file
descriptors, with its input message class and whether it streams.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor as d
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

# A huge value must still fit in one gRPC message (4 MiB by default) with everything else.
HUGE_STRING = 200_000
LONG_LIST = 2_000
MAX_DEPTH = 3

_INT_RANGES: dict[int, tuple[int, int]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

ODD_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "../../etc/passwd",
    "/",
    "-",
    "*",
    "%s%n",
    "\u202e\u0000\ud7ff",
    "é" * 64,
    "\n\r\t",
    "syn_000000000000_x",
    "default",
    "admin",
    "r1",
    "127.0.0.1:1",
    "999999999999999999999",
    "-1",
    "1e309",
    "NaN",
]


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({lo, hi, 0, 1, -1 if lo < 0 else 0, min(hi, 2**31 - 1), max(lo, -(2**31))})
    return st.one_of(
        st.sampled_from(edges),
        st.integers(-1000, 1000).filter(lambda v: lo <= v <= hi),
        st.integers(lo, hi),
    )


def strings() -> st.SearchStrategy[str]:
    """Short random text, odd strings, and now and then a huge one."""
    return st.one_of(
        st.text(max_size=40),
        st.sampled_from(ODD_STRINGS),
        st.builds(
            lambda c, n: c * n,
            st.sampled_from(["a", "é", "\x00", "/"]),
            st.sampled_from([256, 4096, HUGE_STRING]),
        ),
    )


def blobs() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=64),
        st.builds(lambda n: b"\xff" * n, st.sampled_from([4096, HUGE_STRING])),
    )


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in _INT_RANGES:
        return _ints(*_INT_RANGES[t])
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        width = 32 if t == FieldDescriptor.TYPE_FLOAT else 64
        return st.floats(width=width, allow_nan=True, allow_infinity=True)
    if t == FieldDescriptor.TYPE_STRING:
        return strings()
    if t == FieldDescriptor.TYPE_BYTES:
        return blobs()
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        # Open enums (proto3) carry any int32: numbers no version defines included.
        return st.one_of(st.sampled_from(known), _ints(-(2**31), 2**31 - 1))
    raise AssertionError(f"no strategy for field type {t} ({field.full_name})")


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _repeated(field: FieldDescriptor) -> bool:
    # ``label`` is deprecated in newer protobuf releases in favour of ``is_repeated``.
    repeated = getattr(field, "is_repeated", None)
    if repeated is None:
        return bool(field.label == FieldDescriptor.LABEL_REPEATED)
    return bool(repeated)


def _lists(element: st.SearchStrategy[Any], simple: bool) -> st.SearchStrategy[list[Any]]:
    short = st.lists(element, max_size=4)
    if not simple:
        return short
    # A long list repeats one drawn element: cheap to generate, large on the wire.
    long = st.builds(lambda v, n: [v] * n, element, st.sampled_from([100, LONG_LIST]))
    return st.one_of(short, short, long)


def _field_value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if _is_map(field):
        key = field.message_type.fields_by_name["key"]
        value = field.message_type.fields_by_name["value"]
        return st.dictionaries(_scalar(key), _single(value, depth + 1), max_size=4)
    single = _single(field, depth)
    if _repeated(field):
        return _lists(single, field.type != FieldDescriptor.TYPE_MESSAGE)
    return single


def _single(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_strategy(field.message_type, depth + 1)
    return _scalar(field)


def _fill(message: Message, values: dict[str, Any]) -> Message:
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif _repeated(field):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for v in value:
                    target.add().CopyFrom(v)
            else:
                target.extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def message_strategy(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type ``desc`` with a random subset of fields set (none past
    ``MAX_DEPTH`` levels of nesting). In a oneof, the last field set wins, as on the wire."""
    cls = GetMessageClass(desc)
    if depth > MAX_DEPTH:
        return st.just(cls())
    optional = {f.name: _field_value(f, depth) for f in desc.fields}
    return st.builds(
        lambda values: _fill(cls(), values), st.fixed_dictionaries({}, optional=optional)
    )


@dataclass(frozen=True)
class Method:
    """One RPC: its full path, its request class and how it streams."""

    service: str
    name: str
    request: type[Message]
    response: type[Message]
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def input(self) -> Descriptor:
        return self.request.DESCRIPTOR


def request_methods(files: Iterable[FileDescriptor]) -> list[Method]:
    """Every method of every service of ``files``, in file and declaration order."""
    methods = []
    for file in files:
        for service in file.services_by_name.values():
            for m in service.methods:
                assert isinstance(m, d.MethodDescriptor)
                methods.append(
                    Method(
                        service.full_name,
                        m.name,
                        GetMessageClass(m.input_type),
                        GetMessageClass(m.output_type),
                        bool(m.client_streaming),
                        bool(m.server_streaming),
                    )
                )
    return methods


def mutation_strategy(seed: Message, max_fields: int = 2) -> st.SearchStrategy[Message]:
    """``seed`` (a valid request) with one or two of its fields, at any depth, replaced
    by a random value: requests that get past the first checks and break a later one."""
    paths = list(_field_paths(seed.DESCRIPTOR, (), 0))

    def apply(changes: list[tuple[tuple[FieldDescriptor, ...], Any]]) -> Message:
        message = type(seed)()
        message.CopyFrom(seed)
        for path, value in changes:
            target = message
            for f in path[:-1]:
                target = getattr(target, f.name)
            last = path[-1]
            target.ClearField(last.name)
            _fill(target, {last.name: value})
        return message

    change = st.sampled_from(paths).flatmap(
        lambda path: st.tuples(st.just(path), _field_value(path[-1], len(path)))
    )
    return st.lists(change, min_size=1, max_size=max_fields).map(apply)


def _field_paths(
    desc: Descriptor, prefix: tuple[FieldDescriptor, ...], depth: int
) -> Iterable[tuple[FieldDescriptor, ...]]:
    for f in desc.fields:
        path = (*prefix, f)
        yield path
        if f.type == FieldDescriptor.TYPE_MESSAGE and not _repeated(f) and depth < MAX_DEPTH:
            yield from _field_paths(f.message_type, path, depth + 1)
