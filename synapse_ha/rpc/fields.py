"""The fields a message and a core value name alike, declared once for both directions of
conversion (:mod:`synapse_ha.rpc.to_proto`, :mod:`synapse_ha.rpc.from_proto`).

Each field table lists the scalar fields copied as they are between a message and a core
value; a field that needs more (a default for 0, a nested message, a oneof) is converted
by hand in both modules. A job-spec field that is one scalar is added to :data:`JOB_SPEC`,
and to :data:`LAUNCH` when the worker launches its members with it. The enum tables pair
a message's values with the core's.

A record whose fields a message names alike, all of them, needs no table:
:func:`to_message` and :func:`from_message` convert it field by field, given only what
needs more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import Message

from synapse_ha.core import commands as cmd
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T")
_D = TypeVar("_D", bound="DataclassInstance")
_M = TypeVar("_M", bound=Message)

# pb.JobSpec and core.model.JobSpec.
JOB_SPEC: tuple[str, ...] = (
    "name",
    "replicas",
    "workdir",
    "priority",
    "topology_required",
    "topology_preferred",
    "time_limit_ms",
    "image",
    "priority_class",
    "begin_at_ms",
    "begin_delay_ms",
    "deadline_at_ms",
    "deadline_delay_ms",
    "array",
    "wait_for_nodes",
    "stop_grace_ms",
    "account",
)
# pb.DesiredMember and core.desired.DesiredMember (the member's place in its gang).
MEMBER: tuple[str, ...] = (
    "job_id",
    "attempt",
    "fencing_token",
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "master_port",
    "owner",
    "generation",
    "membership",
    "membership_signal",
)
# pb.DesiredMember and core.desired.LaunchSpec (what the member is launched with).
LAUNCH: tuple[str, ...] = (
    "shell",
    "workdir",
    "time_limit_ms",
    "image",
    "progress_timeout_ms",
    "progress_source",
    "stop_grace_ms",
)

# pb.MemberReport's kinds and causes and core.commands' (a worker's reports of its members).
REPORT_KINDS: tuple[tuple[int, cmd.MemberEventKind], ...] = (
    (pb.MemberReport.STARTED, cmd.MemberEventKind.STARTED),
    (pb.MemberReport.EXITED, cmd.MemberEventKind.EXITED),
    (pb.MemberReport.CHECKPOINT, cmd.MemberEventKind.CHECKPOINT),
)
EXIT_CAUSES: tuple[tuple[int, cmd.ExitCause], ...] = (
    (pb.MemberReport.PROGRAM, cmd.ExitCause.PROGRAM),
    (pb.MemberReport.FENCED, cmd.ExitCause.FENCED),
    (pb.MemberReport.LOST, cmd.ExitCause.LOST),
    (pb.MemberReport.NODE_CANNOT_RUN, cmd.ExitCause.NODE_CANNOT_RUN),
    (pb.MemberReport.HUNG, cmd.ExitCause.HUNG),
)


def constructor(cls: Callable[..., _T], **tables: tuple[str, ...]) -> Callable[..., _T]:
    """``new(*sources, **rest)``: ``cls(**rest)`` with every field of each table read from
    the positional argument named after it, e.g. ``constructor(pb.JobSpec,
    spec=JOB_SPEC)(spec, env=...)``. Compiled once, as :mod:`dataclasses` compiles an
    ``__init__``, so a conversion through a table costs what one written out does: the
    heartbeat answer's ``desired_to_proto`` is one."""
    for names in tables.values():
        assert all(name.isidentifier() for name in names), names
    reads = (f"{n}={source}.{n}" for source, names in tables.items() for n in names)
    return _compiled(cls, tuple(tables), reads)


def to_message(message: type[_M], value: object, /, **given: Any) -> _M:
    """``message(**given)`` with every other field of the message read from the attribute
    of ``value`` of its name: a sequence fills a repeated field, a mapping a map, and None
    leaves an optional field unset. A field that is a message must be given (None: unset).
    ``TypeError`` when ``value``, a dataclass, lacks a field the message has."""
    key = (message, type(value), frozenset(given))
    new: Callable[..., _M] = _converters.get(key) or _converters.setdefault(key, _writer(*key))
    return new(value, **given)


def from_message(cls: type[_D], msg: Message, /, **given: Any) -> _D:
    """``cls(**given)`` with every other field of the dataclass ``cls`` read from the
    field of ``msg`` of its name: a repeated field as a tuple, a map as a dict, an optional
    field the message does not carry as None. A field that is a message must be given.
    ``TypeError`` when the message lacks a field of ``cls``."""
    key = (cls, type(msg), frozenset(given))
    new: Callable[..., _D] = _converters.get(key) or _converters.setdefault(key, _reader(*key))
    return new(msg, **given)


# The conversions compiled so far, by target type, source type and the fields given.
_converters: dict[tuple[type, type, frozenset[str]], Callable[..., Any]] = {}


def _writer(message: type[Message], source: type, given: frozenset[str]) -> Callable[..., Any]:
    wire = [f for f in message.DESCRIPTOR.fields if f.name not in given]
    _refuse_messages(message, [f for f in wire if not _is_map(f)])
    if dataclasses.is_dataclass(source):
        _refuse_missing(
            source, {f.name for f in dataclasses.fields(source)}, [f.name for f in wire]
        )
    return _compiled(message, ("value",), (f"{f.name}=value.{f.name}" for f in wire))


def _reader(cls: type, message: type[Message], given: frozenset[str]) -> Callable[..., Any]:
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in given]
    wire = message.DESCRIPTOR.fields_by_name
    _refuse_missing(message, set(wire), names)
    reads = []
    for name in names:
        field = wire[name]
        if _is_map(field):
            reads.append(f"{name}=dict(msg.{name})")
            continue
        _refuse_messages(message, [field])
        if field.is_repeated:
            reads.append(f"{name}=tuple(msg.{name})")
        elif field.has_presence:
            reads.append(f"{name}=msg.{name} if msg.HasField({name!r}) else None")
        else:
            reads.append(f"{name}=msg.{name}")
    return _compiled(cls, ("msg",), reads)


def _is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _refuse_messages(message: type[Message], fields: Iterable[Any]) -> None:
    nested = [f.name for f in fields if f.message_type is not None]
    if nested:
        raise TypeError(f"{message.__name__}: give the message fields {', '.join(nested)}")


def _refuse_missing(owner: type, names: set[str], wanted: Iterable[str]) -> None:
    missing = [n for n in wanted if n not in names]
    if missing:
        raise TypeError(f"{owner.__name__} has no field {', '.join(missing)}: give it")


def _compiled(
    cls: Callable[..., _T], params: tuple[str, ...], reads: Iterable[str]
) -> Callable[..., _T]:
    """``new(*params, **rest)`` returning ``cls(<reads>, **rest)``, compiled once."""
    code = f"def new({', '.join(params)}, **rest):\n    return cls({', '.join(reads)}, **rest)\n"
    namespace: dict[str, Any] = {"cls": cls}
    exec(code, namespace)
    new: Callable[..., _T] = namespace["new"]
    return new
