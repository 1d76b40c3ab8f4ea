"""Dataclass trees to JSON-ready values: the write half of the codec.

:func:`to_plain` writes each dataclass as an object of named fields (commands, results
and the full state); :func:`to_plain_compact` as a list of its field values in
declaration order, without the trailing ones that hold their defaults (the compact state,
:mod:`synapse_ha.core.codec.versioned`). Either way the fields added since the first format
(:data:`synapse_ha.core.codec.formats.ADDED_FIELDS`) are left out while they hold their
defaults, so what uses no new feature encodes as an older release wrote it. The same
value always gives the same plain value;
:func:`synapse_ha.core.codec.from_plain.from_plain` reads it back.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from functools import cache
from typing import Any

from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.formats import ADDED_FIELDS

_ALWAYS = object()  # a field written whatever its value

_Encoder = typing.Callable[[Any], Any]
_LEAVES = frozenset({str, int, bool, type(None)})  # encoded as they are


def _plain_walker(compact: bool) -> _Encoder:
    """A :func:`to_plain`: with ``compact``, each dataclass is a list of its field values
    without the trailing ones that hold their defaults (what ``ClusterConfig.compact_state``
    writes); without, an object of named fields, leaving out only the fields added since
    the first format that hold their defaults (``ADDED_FIELDS``).

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
to_plain_compact = _plain_walker(compact=True)
to_plain_compact.__doc__ = "Turn a dataclass tree into the compact state's JSON-ready values."


@cache
def _layout(cls: type, compact: bool = False) -> tuple[tuple[str, Any], ...]:
    """Each field's name, with its default when it is written only if it differs from it
    (every field that has one when ``compact``, else those of ``ADDED_FIELDS``), else
    ``_ALWAYS``."""
    added = ADDED_FIELDS.get(cls, {})
    layout = []
    for f in init_fields(cls):
        default: Any = _ALWAYS
        if compact or f.name in added:
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
        layout.append((f.name, default))
    return tuple(layout)


@cache
def init_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of dataclass ``cls`` the codec writes and reads: those ``__init__`` takes."""
    return tuple(f for f in dataclasses.fields(cls) if f.init)
