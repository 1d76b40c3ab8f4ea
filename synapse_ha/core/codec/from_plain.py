"""JSON-ready values back to typed dataclass trees: the read half of the codec.

:func:`from_plain` rebuilds a value of a type from what
:func:`~synapse_ha.core.codec.to_plain.to_plain` (or ``to_plain_compact``) wrote, checking
every field's type against the type hints and raising :class:`CodecError` naming the
path of the offending field; a field or a position this release does not know is
:class:`UnreadableFormat`. Each type's decoder is worked out once and kept, and the
dataclass decoders are generated for speed (a large snapshot holds hundreds of thousands
of records: :mod:`synapse_ha.core.codec.compiled`), with a generic path that names
the exact error.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any

from synapse_ha.core.codec.compiled import Compiler
from synapse_ha.core.codec.decode_errors import CodecError, UnreadableFormat
from synapse_ha.core.codec.to_plain import init_fields


def from_plain(tp: Any, data: Any, path: str = "$") -> Any:
    """Rebuild a value of type ``tp`` from :func:`to_plain` output, checking types.

    Each type's checks are worked out once (:func:`_decoder`) and kept, so decoding a
    command costs its fields, not the inspection of its type hints."""
    return _decoder(tp)(data, path)


def from_plain_compiled(tp: type, data: Any) -> Any:
    """:func:`from_plain` of dataclass ``tp`` by its compiled decoders alone
    (:mod:`synapse_ha.core.codec.compiled`), without the generic path: raises where that
    path would be taken. It shows that the fast path decodes a value whole."""
    return _COMPILER.of(tp).decode(data)


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
    if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: a collection of X
        return _collection_decoder(tuple, args[0])
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
    order = tuple(f.name for f in init_fields(tp))
    names = frozenset(order)
    positional = not any(f.kw_only for f in init_fields(tp))
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

    compiled = _COMPILER.of(tp)  # the fast path, by layout

    def decode(data: Any, path: str) -> Any:
        kind = type(data)
        if kind is list or kind is dict:
            try:
                return compiled[len(data) if kind is list else -1](data)
            except Exception:  # decoded again below, to name the error
                pass
        if isinstance(data, list):  # the compact layout: values in field order
            if len(data) > len(order):
                raise UnreadableFormat(
                    f"{path}: {len(data)} fields where this release knows {len(order)} "
                    f"(from a newer release? upgrade this replica)"
                )
            if positional:
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


_COMPILER = Compiler(lambda tp: _decoder(tp))  # the dataclass decoders' fast path


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
