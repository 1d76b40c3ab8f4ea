"""Versioned, canonical encoding of commands and of the whole state.

The encoding is JSON with sorted keys and no insignificant whitespace, built from the
dataclasses' type hints: no pickling of arbitrary objects, and the same value always
gives the same bytes, so replicas and snapshots can be compared byte for byte.
``decode(encode(x)) == x`` holds for every command and state.

Decoding checks every field's type against the dataclass and raises :class:`CodecError`
naming the path of the offending field; nothing malformed reaches ``apply``.

Format versions and rolling upgrades. Commands and the state carry a format version
(``"v"``). A replica reads every version in ``READABLE_VERSIONS`` and writes the newest.
What it cannot read — a newer version, a command type it does not know, a field it does
not know (written by a newer release) — it refuses with :class:`UnreadableFormat`, and
the replicated entry point turns that into an error result (never an exception: that
would wedge the log). Such a replica then lacks that change while the others have it, so
the rule for upgrades is: **upgrade every replica before anything uses a new command, a
new field or a new version**. A release keeps writing what the previous release reads
until then (deploy/README.md, "Rolling upgrade"). ``synctl cluster -o json`` shows each
replica's ``format_version`` to check.

"Keeps writing what the previous release reads" is mechanical for added fields: a field
listed in ``_ADDED_FIELDS`` is written only when it differs from its default. A command
or state that does not use a new feature (a job in the ``default`` queue, no preemption)
therefore encodes exactly as the previous release wrote it, and a replica of that release
applies it; one that uses a new feature carries the field, and that replica refuses it
as above.

The compact state. With ``ClusterConfig.compact_state`` on (a replicated setting, so every
replica encodes alike) every dataclass of the state is written as a list of its field
values in declaration order, without the trailing fields that hold their defaults:
the field names, repeated for every job and node, were most of a large state's bytes.
Decoding reads a list where an object is expected by position and fills the defaults
back in. The declaration order is therefore part of the format: a field is only ever
appended, with a default (``tests/core/test_codec_layout.py`` holds every state type to
the layout it had). Turning the compact state on is itself a new field: only once every
replica runs this release.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import json
import types
import typing
from collections.abc import Iterator
from functools import cache
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import Attempt, ClusterConfig, ClusterState, Job, JobSpec, Queue, Token

# Version 2: reasons and attempt outcomes are Reason values (code, params, cause), not
# sentences. Version 1 envelopes still decode: their sentences become TEXT reasons.
COMMAND_VERSION = 2
STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
READABLE_VERSIONS = _READABLE_VERSIONS

_COMMANDS_BY_NAME: dict[str, type] = {t.__name__: t for t in cmd.COMMAND_TYPES}

# Fields added since the previous release (queues, fair share and preemption): written
# only when they differ from their defaults, so that release reads what does not use them.
_ADDED_FIELDS: dict[type, frozenset[str]] = {
    ClusterConfig: frozenset(
        {"priority_classes", "fair_share_half_life_ms", "preemption", "compact_state", "limits"}
    ),
    # Per-identity limits and authorised priority (DESIGN §8).
    Queue: frozenset({"max_priority"}),
    Token: frozenset({"priority_classes", "max_priority"}),
    cmd.CreateToken: frozenset({"priority_classes", "max_priority"}),
    JobSpec: frozenset({"queue", "priority_class"}),
    Attempt: frozenset({"preempted_by", "preemption", "preempt_deadline_ms"}),
    ClusterState: frozenset({"queues", "queue_history"}),
    # Late success reports after a node death (DESIGN §4).
    Job: frozenset({"lost_attempt"}),
}
_ALWAYS = object()  # a field written whatever its value


class CodecError(ValueError):
    """Bytes that are not a valid encoding; the message names the field."""


class UnreadableFormat(CodecError):
    """A valid encoding of a newer release: a format version, a command type or a field
    this release does not know. The message says which and that this replica needs the
    upgrade."""


# ------------------------------------------------------------------------ to plain


_Encoder = typing.Callable[[Any], Any]
_LEAVES = frozenset({str, int, bool, type(None)})  # encoded as they are


def _plain_walker(compact: bool) -> _Encoder:
    """A :func:`to_plain`: with ``compact``, each dataclass is a list of its field values
    without the trailing ones that hold their defaults (what ``ClusterConfig.compact_state``
    writes); without, an object of named fields, leaving out only the fields added since
    the previous release that hold their defaults (``_ADDED_FIELDS``).

    How a value of each type is turned is worked out once per type and kept, so encoding
    costs the values, not the inspection of their types."""
    encoders: dict[type, _Encoder] = {}

    def walk(value: Any) -> Any:
        kind = type(value)
        if kind is str or kind is int or kind is bool or value is None:
            return value  # the common leaves first
        encode = encoders.get(kind)
        if encode is None:
            encode = encoders[kind] = encoder(kind)
        return encode(value)

    def encoder(kind: type) -> _Encoder:
        if issubclass(kind, enum.Enum):
            return lambda value: value.value
        if issubclass(kind, (bool, int, str)):
            return lambda value: value
        if dataclasses.is_dataclass(kind) and compact:
            # Fields in declaration order (the format: only ever appended, with a
            # default); trailing fields at their defaults are left out.
            positions = _layout(kind, compact=True)

            def encode_positional(value: Any) -> list[Any]:
                plain = [getattr(value, name) for name, _ in positions]
                end = len(plain)
                while end and positions[end - 1][1] is not _ALWAYS:
                    if plain[end - 1] != positions[end - 1][1]:
                        break
                    end -= 1
                return [v if type(v) in _LEAVES else walk(v) for v in plain[:end]]

            return encode_positional
        if dataclasses.is_dataclass(kind):
            layout = _layout(kind)

            def encode_dataclass(value: Any) -> dict[str, Any]:
                plain = {}
                for name, default in layout:
                    item = getattr(value, name)
                    if default is _ALWAYS or item != default:
                        plain[name] = item if type(item) in _LEAVES else walk(item)
                return plain

            return encode_dataclass
        if issubclass(kind, (tuple, list)):
            return lambda value: [v if type(v) in _LEAVES else walk(v) for v in value]
        if issubclass(kind, (set, frozenset)):
            return lambda value: sorted(walk(v) for v in value)
        if issubclass(kind, dict):
            return lambda value: {str(k): walk(v) for k, v in value.items()}

        def unsupported(value: Any) -> Any:
            raise CodecError(f"cannot encode a value of type {kind.__name__}")

        return unsupported

    return walk


to_plain = _plain_walker(compact=False)
to_plain.__doc__ = "Turn a dataclass tree into JSON-ready lists, dicts and scalars."
_to_plain_compact = _plain_walker(compact=True)


@cache
def _layout(cls: type, compact: bool = False) -> tuple[tuple[str, Any], ...]:
    """Each field's name, with its default when it is written only if it differs from it
    (every field that has one when ``compact``, else those of ``_ADDED_FIELDS``), else
    ``_ALWAYS``."""
    added = _ADDED_FIELDS.get(cls, frozenset())
    layout = []
    for f in _fields(cls):
        default: Any = _ALWAYS
        if compact or f.name in added:
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
        layout.append((f.name, default))
    return tuple(layout)


@cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(f for f in dataclasses.fields(cls) if f.init)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# ---------------------------------------------------------------------- from plain


def from_plain(tp: Any, data: Any, path: str = "$") -> Any:
    """Rebuild a value of type ``tp`` from :func:`to_plain` output, checking types.

    Each type's checks are worked out once (:func:`_decoder`) and kept, so decoding a
    command costs its fields, not the inspection of its type hints."""
    return _decoder(tp)(data, path)


_Decoder = typing.Callable[[Any, str], Any]


@cache
def _decoder(tp: Any) -> _Decoder:
    """The function that rebuilds a value of type ``tp`` (``from_plain`` for one type)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _union_decoder(typing.get_args(tp))
    if tp is Any:
        return lambda data, path: data
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_decoder(tp)
    if tp is bool or tp is int or tp is str:
        return _scalar_decoder(tp)
    if origin is tuple:
        return _tuple_decoder(typing.get_args(tp))
    if origin in (list, set, frozenset):
        (arg,) = typing.get_args(tp)
        return _collection_decoder(origin, arg)
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        return _dict_decoder(key_tp, value_tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_decoder(tp)

    def unsupported(data: Any, path: str) -> Any:
        raise CodecError(f"{path}: unsupported type {tp!r}")

    return unsupported


def _union_decoder(options: tuple[Any, ...]) -> _Decoder:
    optional = type(None) in options
    others = [o for o in options if o is not type(None)]
    # A union of scalars (int | str) is a type test: no option need fail first.
    scalars = frozenset(others) if all(o in (bool, int, str) for o in others) else frozenset()
    lazy = [_lazy(option) for option in others]

    def decode(data: Any, path: str) -> Any:
        if data is None and optional:
            return None
        if type(data) in scalars:
            return data
        errors = []
        for option in lazy:
            try:
                return option()(data, path)
            except CodecError as exc:
                errors.append(str(exc))
        raise CodecError("; ".join(errors) or f"{path}: no matching type")

    return decode


def _enum_decoder(tp: type[enum.Enum]) -> _Decoder:
    def decode(data: Any, path: str) -> Any:
        try:
            return tp(data)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in tp)
            raise CodecError(f"{path}: {data!r} is not one of {allowed}") from None

    return decode


_SCALAR_NAMES = {bool: "a boolean", int: "an integer", str: "a string"}


def _scalar_decoder(tp: type) -> _Decoder:
    expected = _SCALAR_NAMES[tp]

    def decode(data: Any, path: str) -> Any:
        if type(data) is not tp:
            raise CodecError(f"{path}: expected {expected}, got {type(data).__name__}")
        return data

    return decode


def _expect(data: Any, kind: type, path: str) -> None:
    if not isinstance(data, kind):
        what = "a list" if kind is list else "an object"
        raise CodecError(f"{path}: expected {what}, got {type(data).__name__}")


# Decoding in two passes, for speed: the fast pass hands every part the path of the
# value that holds it, so no path is formatted for a part that decodes; when a part does
# not, the value decodes its parts again, each with its exact path, and raises what that
# says (decoding is deterministic: the same part fails again, now named exactly).


def _lazy(tp: Any) -> typing.Callable[[], _Decoder]:
    """``_decoder(tp)``, looked up on first use (a type may refer to itself) and then
    kept: looking a typing alias up in the cache hashes it every time."""
    found: list[_Decoder] = []

    def get() -> _Decoder:
        if not found:
            found.append(_decoder(tp))
        return found[0]

    return get


def _tuple_decoder(args: tuple[Any, ...]) -> _Decoder:
    if len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        lazy_item = _lazy(item)

        def decode_items(data: Any, path: str) -> Any:
            _expect(data, list, path)
            each = lazy_item()
            try:
                return tuple([each(v, path) for v in data])
            except CodecError:
                return tuple([each(v, f"{path}[{i}]") for i, v in enumerate(data)])

        return decode_items

    found: list[tuple[_Decoder, ...]] = []  # the items' decoders, looked up on first use

    def decode_fixed(data: Any, path: str) -> Any:
        _expect(data, list, path)
        if len(args) != len(data):
            raise CodecError(f"{path}: expected {len(args)} items, got {len(data)}")
        if not found:
            found.append(tuple(_decoder(a) for a in args))
        decoders = found[0]
        try:
            return tuple([d(v, path) for d, v in zip(decoders, data, strict=True)])
        except CodecError:
            return tuple(
                [d(v, f"{path}[{i}]") for i, (d, v) in enumerate(zip(decoders, data, strict=True))]
            )

    return decode_fixed


def _collection_decoder(origin: Any, arg: Any) -> _Decoder:
    lazy_item = _lazy(arg)

    def decode(data: Any, path: str) -> Any:
        _expect(data, list, path)
        each = lazy_item()
        try:
            return origin([each(v, path) for v in data])
        except CodecError:
            return origin([each(v, f"{path}[{i}]") for i, v in enumerate(data)])

    return decode


def _dict_decoder(key_tp: Any, value_tp: Any) -> _Decoder:
    lazy_key, lazy_value = _lazy(key_tp), _lazy(value_tp)

    def decode(data: Any, path: str) -> Any:
        _expect(data, dict, path)
        key, value = lazy_key(), lazy_value()
        try:
            return {key(k, path): value(v, path) for k, v in data.items()}
        except CodecError:
            return {key(k, f"{path}.key"): value(v, f"{path}.{k}") for k, v in data.items()}

    return decode


def _dataclass_decoder(tp: type) -> _Decoder:
    order = tuple(f.name for f in _fields(tp))
    names = frozenset(order)
    positional = not any(f.kw_only for f in _fields(tp))
    # Field decoders are looked up on first use: a dataclass may refer to itself.
    found: list[tuple[_Decoder, ...]] = []
    found_by_name: list[dict[str, _Decoder]] = []

    def decoders() -> tuple[_Decoder, ...]:
        if not found:
            hints = _hints(tp)
            found.append(tuple(_decoder(hints[name]) for name in order))
        return found[0]

    def decoders_by_name() -> dict[str, _Decoder]:
        if not found_by_name:
            found_by_name.append(dict(zip(order, decoders(), strict=True)))
        return found_by_name[0]

    def build(path: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return tp(*args, **kwargs)
        except TypeError as exc:
            raise CodecError(f"{path}: {exc}") from None

    inlined: dict[int, _Decoder] = {}  # the compact layout's fast path, by length
    keyed: list[_Decoder] = []  # the named layout's fast path

    def decode(data: Any, path: str) -> Any:
        if type(data) is dict:
            if not keyed:
                keyed.append(_inlined_keyed(tp, order, positional))
            try:
                value = keyed[0](data, path)
            except (CodecError, TypeError):
                value = _SLOW  # decoded again below, to raise the exact error
            if value is not _SLOW:
                return value
        elif isinstance(data, list):  # the compact layout: values in field order
            if len(data) > len(order):
                raise UnreadableFormat(
                    f"{path}: {len(data)} fields where this release knows {len(order)} "
                    f"(from a newer release? upgrade this replica)"
                )
            if positional:
                fast = inlined.get(len(data))
                if fast is None:
                    fast = inlined[len(data)] = _inlined_positional(tp, order[: len(data)])
                try:
                    value = fast(data, path)
                except (CodecError, TypeError):
                    value = _SLOW  # decoded again below, to raise the exact error
                if value is not _SLOW:
                    return value
                each = decoders()
                try:
                    values = [d(v, path) for d, v in zip(each, data, strict=False)]
                except CodecError:
                    for name, d, v in zip(order, each, data, strict=False):
                        d(v, f"{path}.{name}")
                    raise
                return build(path, *values)
            data = dict(zip(order, data, strict=False))
        _expect(data, dict, path)
        if not names.issuperset(data):
            unknown = sorted(set(data) - names)
            raise UnreadableFormat(
                f"{path}: unknown field {unknown[0]!r} (from a newer release? upgrade this replica)"
            )
        by_name = decoders_by_name()
        try:
            kwargs = {name: by_name[name](value, path) for name, value in data.items()}
        except CodecError:
            for name, value in data.items():
                by_name[name](value, f"{path}.{name}")
            raise
        return build(path, **kwargs)

    return decode


_SLOW: Any = object()  # a value the inlined decoder leaves to the generic one


def _scalar_test(hint: Any, value: str) -> str | None:
    """Python source testing ``value`` against ``hint`` as the scalar and union decoders
    do (``type(v) is T``: a bool is not an int), or None if ``hint`` is not a scalar or
    an optional scalar."""
    names = {bool: "bool", int: "int", str: "str"}
    if hint in names:
        return f"type({value}) is {names[hint]}"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        others = [o for o in options if o is not type(None)]
        if not others or not all(o in names for o in others):
            return None
        test = " or ".join(f"type({value}) is {names[o]}" for o in others)
        return f"({value} is None or {test})" if type(None) in options else f"({test})"
    return None


def _inlined_positional(tp: type, names: tuple[str, ...]) -> _Decoder:
    """A decoder of ``tp``'s compact layout with exactly the first ``len(names)`` fields,
    made for speed (a large snapshot holds hundreds of thousands of records): scalar
    fields are tested inline, the others decoded by their own decoders, all in one
    generated function. It returns :data:`_SLOW` when a scalar fails its test, and a
    nested decoder or the constructor may raise; the generic path then decodes the value
    again and raises the exact error. For valid input both give equal values."""
    hints = _hints(tp)
    lines, args = [], []
    namespace: dict[str, Any] = {"_tp": tp, "_SLOW": _SLOW}
    tests = []
    for i, name in enumerate(names):
        test = _scalar_test(hints[name], f"v{i}")
        if test is None:
            namespace[f"_d{i}"] = _decoder(hints[name])
            args.append(f"_d{i}(v{i}, path)")
        else:
            tests.append(test)
            args.append(f"v{i}")
    unpack = "".join(f"v{i}, " for i in range(len(names)))
    lines.append("def decode(data, path):")
    if names:
        lines.append(f"    {unpack}= data")
    if tests:
        lines.append(f"    if not ({' and '.join(tests)}):")
        lines.append("        return _SLOW")
    lines.append(f"    return _tp({', '.join(args)})")
    exec("\n".join(lines), namespace)  # source made from the type hints alone
    decode: _Decoder = namespace["decode"]
    return decode


_ABSENT: Any = object()  # a field the named layout leaves out


def _inlined_keyed(tp: type, names: tuple[str, ...], positional: bool) -> _Decoder:
    """A decoder of ``tp``'s named layout (an object of fields, what commands and the
    full state use), made for speed like :func:`_inlined_positional`: each field is
    looked up once, scalar fields are tested inline, the others decoded by their own
    decoders, an absent field takes its default. It returns :data:`_SLOW` for anything
    the generic path must judge (an absent field without a default, a key it does not
    know, a scalar that fails its test); a nested decoder or the constructor may raise.
    For valid input both give equal values."""
    hints = _hints(tp)
    fields = {f.name: f for f in _fields(tp)}
    namespace: dict[str, Any] = {"_tp": tp, "_SLOW": _SLOW, "_ABSENT": _ABSENT}
    lines = ["def decode(data, path):", "    n = len(data)"]
    for i, name in enumerate(names):
        f = fields[name]
        lines.append(f"    v{i} = data.get({name!r}, _ABSENT)")
        lines.append(f"    if v{i} is _ABSENT:")
        if f.default is not dataclasses.MISSING:
            namespace[f"_default{i}"] = f.default
            lines.append(f"        v{i} = _default{i}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory{i}"] = f.default_factory
            lines.append(f"        v{i} = _factory{i}()")
        else:
            lines.append("        return _SLOW")
        lines.append("    else:")
        lines.append("        n -= 1")
        test = _scalar_test(hints[name], f"v{i}")
        if test is None:
            namespace[f"_d{i}"] = _decoder(hints[name])
            lines.append(f"        v{i} = _d{i}(v{i}, path)")
        else:
            lines.append(f"        if not {test}:")
            lines.append("            return _SLOW")
    lines.append("    if n:")
    lines.append("        return _SLOW  # a key that is not a field")
    if positional:
        args = ", ".join(f"v{i}" for i in range(len(names)))
    else:
        args = ", ".join(f"{name}=v{i}" for i, name in enumerate(names))
    lines.append(f"    return _tp({args})")
    exec("\n".join(lines), namespace)  # source made from the type hints alone
    decode: _Decoder = namespace["decode"]
    return decode


# ------------------------------------------------------------------------ envelope


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_JSON = json.JSONDecoder()  # json.loads without its per-call dispatch


def _loads(data: bytes, what: str) -> Any:
    """Our encodings are UTF-8 (``_dumps``); decoded here, not guessed per call."""
    try:
        return _JSON.decode(data.decode() if isinstance(data, (bytes, bytearray)) else data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CodecError(f"{what}: not valid JSON ({exc})") from None


def encode_command(command: cmd.Command) -> bytes:
    """The canonical envelope ``{"v": 1, "type": name, "body": {...}}`` as UTF-8 bytes."""
    return _dumps({"v": COMMAND_VERSION, "type": type(command).__name__, "body": to_plain(command)})


def decode_command(data: bytes) -> cmd.Command:
    envelope = _loads(data, "command")
    if not isinstance(envelope, dict):
        raise CodecError("command: expected an envelope object")
    version = envelope.get("v")
    if type(version) is int and version > max(_READABLE_VERSIONS):
        raise UnreadableFormat(
            f"command: format version {version} is newer than this replica reads "
            f"({', '.join(map(str, _READABLE_VERSIONS))}); upgrade this replica"
        )
    if version not in _READABLE_VERSIONS:
        raise CodecError(f"command: unsupported envelope version {version!r}")
    name = envelope.get("type")
    command_type = _COMMANDS_BY_NAME.get(name) if isinstance(name, str) else None
    if command_type is None:
        raise UnreadableFormat(
            f"command: unknown command type {name!r} (from a newer release? upgrade this replica)"
        )
    body = envelope.get("body")
    if version == 1:
        body = _upgrade_command_v1(str(name), body)
    result: cmd.Command = from_plain(command_type, body, str(name))
    return result


def _text_reason(value: Any) -> Any:
    """A version 1 sentence as a version 2 TEXT reason (anything else as it is, for the
    type check to judge)."""
    if isinstance(value, str):
        return {"code": "text", "params": [["text", value]], "cause": None}
    return value


def _upgrade_command_v1(name: str, body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    body = dict(body)
    if name == "BindPlan" and isinstance(body.get("reasons"), list):
        body["reasons"] = [
            [pair[0], _text_reason(pair[1])] if isinstance(pair, list) and len(pair) == 2 else pair
            for pair in body["reasons"]
        ]
    if name == "FailAttempt" and "reason" in body:
        body["reason"] = _text_reason(body["reason"])
    return body


def _upgrade_state_v1(state: Any) -> Any:
    if not isinstance(state, dict) or not isinstance(state.get("jobs"), dict):
        return state
    jobs = {}
    for job_id, job in state["jobs"].items():
        if isinstance(job, dict):
            job = dict(job)
            if "reason" in job:
                job["reason"] = _text_reason(job["reason"])
            attempt = job.get("attempt")
            made = job.get("attempts_made", 0)
            if isinstance(attempt, dict) and "outcome" in attempt:
                attempt = dict(attempt)
                outcome = attempt["outcome"]
                attempt["outcome"] = None if outcome == "" else _text_reason(outcome)
                # Version 1 kept no attempt state: derive it from the times and the job.
                if attempt.get("ended_at_ms") is None:
                    live = "bound" if attempt.get("started_at_ms") is None else "running"
                    attempt["state"] = live
                else:
                    attempt["state"] = {"SUCCEEDED": "succeeded", "CANCELLED": "stopped"}.get(
                        str(job.get("state")), "failed"
                    )
                job["attempt"] = attempt
            # Version 1 had no requeues: every attempt after the first was a retry.
            if isinstance(made, int) and made > 0:
                pending_retry = job.get("state") == "PENDING"
                job["retries_used"] = made if pending_retry else made - 1
        jobs[job_id] = job
    return {**state, "jobs": jobs}


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a whole state is encoded or decoded.
    Those build hundreds of thousands of containers that are not garbage, and the
    collections their allocations trigger would walk the growing tree again and again: a
    third of the time of a large state's encoding or more. The output is the same either
    way."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def encode_state(state: ClusterState) -> bytes:
    """The whole state, canonical: equal states give equal bytes. Compact (each
    dataclass a list of its field values) once the replicated ``config.compact_state``
    says so; every replica applies the same config, so they still write the same bytes."""
    walk = _to_plain_compact if state.config.compact_state else to_plain
    with _collector_paused():
        return _dumps({"v": STATE_VERSION, "state": walk(state)})


def decode_state(data: bytes) -> ClusterState:
    with _collector_paused():
        return _decode_state(data)


def _decode_state(data: bytes) -> ClusterState:
    envelope = _loads(data, "state")
    version = envelope.get("v") if isinstance(envelope, dict) else None
    if type(version) is int and version > max(_READABLE_VERSIONS):
        raise UnreadableFormat(
            f"state: format version {version} is newer than this replica reads "
            f"({', '.join(map(str, _READABLE_VERSIONS))}); upgrade this replica"
        )
    if not isinstance(envelope, dict) or version not in _READABLE_VERSIONS:
        raise CodecError("state: unsupported snapshot version")
    body = envelope.get("state")
    if envelope.get("v") == 1:
        body = _upgrade_state_v1(body)
    state: ClusterState = from_plain(ClusterState, body, "state")
    return state


def encode_result(result: cmd.Result) -> bytes:
    return _dumps(to_plain(result))


def decode_result(data: bytes) -> cmd.Result:
    result: cmd.Result = from_plain(cmd.Result, _loads(data, "result"), "result")
    return result
