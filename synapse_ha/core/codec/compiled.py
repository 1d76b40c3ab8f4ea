"""Compiled decoders: the fast path of :mod:`synapse_ha.core.codec.from_plain`.

A large state holds hundreds of thousands of records, and a replica that catches up
decodes all of them before it serves. For each dataclass and each layout it meets (the
compact layout of ``n`` values, or the named layout) a decoder is generated once, as
Python source made from the type hints alone: scalar fields are tested inline
(``type(v) is int``: a bool is not an int), enums looked up in a table of their values,
nested records, tuples, lists and maps of records decoded by their own compiled
decoders, defaults filled in for the fields a layout leaves out, with no per-field
inspection of types and no path formatted at decode time.

A compiled decoder judges nothing: anything it does not expect (a value of the wrong
type, an unknown key or value, too many fields) makes it raise, and the caller decodes
the value again on the generic path, which names the exact field and rule. For valid
input both give equal values.

The record is built without its ``__init__`` where that is the same: a dataclass with
``__slots__``, every field taken by ``__init__`` and no ``__post_init__`` is built as an
instance of a plain class with the same slots (a *twin*), its fields stored, and its
class then set to the dataclass (``__class__`` assignment, which Python allows between
classes of the same layout and checks). A frozen dataclass's ``__init__`` stores each
field through ``object.__setattr__``, several times the cost of a plain store; what it
does is otherwise exactly this. Any other dataclass is built by calling it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any

from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.to_plain import init_fields

Fast = Callable[[Any], Any]  # a compiled decoder: the value, or it raises
Generic = Callable[[Any], Callable[[Any, str], Any]]  # a type's generic decoder


class Mismatch(Exception):
    """Raised by a compiled decoder for a value it does not expect (the generic path
    then decodes the value and names what is wrong)."""


_SCALARS = {bool: "bool", int: "int", str: "str"}
_ABSENT: Any = object()  # a field the named layout leaves out


def _raise_mismatch(_data: Any = None) -> Any:
    raise Mismatch


class Layouts(dict[int, Fast]):
    """The compiled decoders of one dataclass by layout: ``n >= 0`` the compact layout
    with its first ``n`` fields, ``-1`` the named layout. Each is generated when first
    used (a dataclass may refer to itself)."""

    def __init__(self, compiler: Compiler, tp: type) -> None:
        super().__init__()
        self.compiler = compiler
        self.tp = tp

    def __missing__(self, n: int) -> Fast:
        made = self[n] = self.compiler.layout(self.tp, n)
        return made

    def decode(self, data: Any) -> Any:
        return self[len(data) if type(data) is list else -1](data)


def scalar_test(hint: Any, value: str) -> str | None:
    """Python source testing ``value`` against ``hint`` as the generic scalar and union
    decoders do, or None if ``hint`` is not a scalar, an optional scalar or a union of
    scalars."""
    if hint in _SCALARS:
        return f"type({value}) is {_SCALARS[hint]}"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        others = [o for o in options if o is not type(None)]
        if not others or not all(o in _SCALARS for o in others):
            return None
        test = " or ".join(f"type({value}) is {_SCALARS[o]}" for o in others)
        return f"({value} is None or {test})" if type(None) in options else f"({test})"
    return None


def _optional(hint: Any) -> Any:
    """``X`` for ``X | None``, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        others = [o for o in options if o is not type(None)]
        if len(others) == 1 and len(options) == 2:
            return others[0]
    return None


def _is_dataclass(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


def _by_value(tp: type[enum.Enum]) -> dict[Any, enum.Enum]:
    return {member.value: member for member in tp}


class _Source:
    """Python source of one generated function and the names it refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"Mismatch": Mismatch}

    def name(self, value: Any) -> str:
        name = f"_n{len(self.names)}"
        self.names[name] = value
        return name

    def function(self) -> Fast:
        exec("\n".join(self.lines), self.names)  # source made from the type hints alone
        made: Fast = self.names["decode"]
        return made


class Compiler:
    """Generates and keeps the compiled decoders; ``generic`` gives a type's generic
    decoder, used for the types the compiler does not inline (a union of records)."""

    def __init__(self, generic: Generic) -> None:
        self.generic = generic
        self.layouts: dict[type, Layouts] = {}
        self.fast: dict[Any, Fast] = {}

    def of(self, tp: type) -> Layouts:
        """The compiled decoders of dataclass ``tp``."""
        found = self.layouts.get(tp)
        if found is None:
            found = self.layouts[tp] = Layouts(self, tp)
        return found

    def value(self, hint: Any) -> Fast:
        """A compiled decoder of any value of type ``hint``."""
        found = self.fast.get(hint)
        if found is None:
            found = self.fast[hint] = self._value(hint)
        return found

    def _value(self, hint: Any) -> Fast:
        if hint is Any:
            return lambda data: data
        if _is_dataclass(hint):
            return self.of(hint).decode
        src = _Source()
        src.lines.append("def decode(v):")
        if not self._emit(src, hint, "v", "    ", whole=True):
            return _generic(self.generic(hint))
        src.lines.append("    return v")
        return src.function()

    def _emit(self, src: _Source, hint: Any, var: str, indent: str, whole: bool = False) -> bool:
        """Append statements that check ``var`` against ``hint`` and replace it by its
        decoded value. A type the compiler does not inline is decoded by a call of its
        value decoder, or, with ``whole`` (that decoder being made), left to the generic
        decoder: False."""
        test = scalar_test(hint, var)
        if test is not None:
            src.lines.append(f"{indent}if not {test}: raise Mismatch")
            return True
        inner = _optional(hint)
        if inner is not None:
            src.lines.append(f"{indent}if {var} is not None:")
            return self._emit(src, inner, var, indent + "    ", whole)
        expr = self._expr(src, hint, var)
        if expr is not None:
            if expr != var:
                src.lines.append(f"{indent}{var} = {expr}")
            return True
        if self._emit_container(src, hint, var, indent):
            return True
        if whole:
            return False
        src.lines.append(f"{indent}{var} = {src.name(self.value(hint))}({var})")
        return True

    def _expr(self, src: _Source, hint: Any, var: str) -> str | None:
        """An expression decoding ``var`` of a record, enum or ``Any`` type, else None."""
        if hint is Any:
            return var
        if _is_dataclass(hint):
            return f"{src.name(self.of(hint))}[len({var}) if type({var}) is list else -1]({var})"
        if _is_enum(hint):
            return f"{src.name(_by_value(hint))}[{var}]"
        return None

    def _emit_container(self, src: _Source, hint: Any, var: str, indent: str) -> bool:
        """:meth:`_emit` for tuples, lists, sets and maps with string keys; False for
        any other type."""
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        add = src.lines.append
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            items = [f"{var}_{i}" for i in range(len(args))]
            add(f"{indent}if type({var}) is not list or len({var}) != {len(args)}: raise Mismatch")
            add(f"{indent}{', '.join(items)}, = {var}")
            self._emit_fields(src, list(args), items, indent)
            add(f"{indent}{var} = ({', '.join(items)},)")
            return True
        if origin is dict and args[0] is str:
            add(f"{indent}if type({var}) is not dict: raise Mismatch")
            add(f"{indent}for k in {var}:")
            add(f"{indent}    if type(k) is not str: raise Mismatch")
            self._emit_items(src, args[1], var, indent, "dict", ".values()")
            return True
        if origin in (tuple, list, set, frozenset):
            add(f"{indent}if type({var}) is not list: raise Mismatch")
            self._emit_items(src, args[0], var, indent, src.name(origin), "")
            return True
        return False

    def _emit_items(
        self, src: _Source, hint: Any, var: str, indent: str, kind: str, values: str
    ) -> None:
        """The items of a list (``values`` "") or the values of a map (".values()") as
        ``kind`` (a collection type, or "dict")."""
        add, item, out = src.lines.append, f"{var}_x", f"{var}_out"
        test = scalar_test(hint, item)
        expr = self._expr(src, hint, item)
        if test is not None:
            add(f"{indent}for {item} in {var}{values}:")
            add(f"{indent}    if not {test}: raise Mismatch")
            add(f"{indent}{var} = {kind}({var})")
        elif expr is not None and values:
            add(f"{indent}{var} = {{k: {expr} for k, {item} in {var}.items()}}")
        elif expr is not None:
            add(f"{indent}{var} = {kind}([{expr} for {item} in {var}])")
        elif values:
            add(f"{indent}{out} = {{}}")
            add(f"{indent}for k, {item} in {var}.items():")
            self._emit(src, hint, item, indent + "    ")
            add(f"{indent}    {out}[k] = {item}")
            add(f"{indent}{var} = {out}")
        else:
            add(f"{indent}{out} = []")
            add(f"{indent}for {item} in {var}:")
            self._emit(src, hint, item, indent + "    ")
            add(f"{indent}    {out}.append({item})")
            add(f"{indent}{var} = {kind}({out})")

    def layout(self, tp: type, n: int) -> Fast:
        """The compiled decoder of ``tp``'s compact layout with its first ``n`` fields
        (``n >= 0``) or of its named layout (``n == -1``)."""
        fields = init_fields(tp)
        if n > len(fields):
            return _raise_mismatch  # the generic path says: from a newer release
        hints = typing.get_type_hints(tp)
        src = _Source()
        add = src.lines.append
        add("def decode(data):")
        values = [f"v{i}" for i in range(len(fields))]
        if n >= 0:
            add("    if type(data) is not list: raise Mismatch")
            if n:
                add(f"    {', '.join(values[:n])}, = data")
            self._emit_fields(src, [hints[f.name] for f in fields[:n]], values[:n], "    ")
            for i, f in enumerate(fields[n:], start=n):
                default = self._default(src, f)
                if default is None:
                    return _raise_mismatch  # a field without a default left out
                values[i] = default
        else:
            add("    if type(data) is not dict: raise Mismatch")
            add("    n = len(data)")
            for i, f in enumerate(fields):
                add(f"    v{i} = data.get({f.name!r}, _ABSENT)")
                add(f"    if v{i} is _ABSENT:")
                default = self._default(src, f)
                add("        raise Mismatch" if default is None else f"        v{i} = {default}")
                add("    else:")
                add("        n -= 1")
                self._emit(src, hints[f.name], f"v{i}", "        ")
            add("    if n: raise Mismatch  # a key that is not a field")
            src.names["_ABSENT"] = _ABSENT
        _construct(src, tp, fields, values)
        return src.function()

    def _emit_fields(
        self, src: _Source, hints: list[Any], variables: list[str], indent: str
    ) -> None:
        """:meth:`_emit` for each of ``variables``, the scalar tests joined in one."""
        tests = []
        for hint, var in zip(hints, variables, strict=True):
            test = scalar_test(hint, var)
            if test is None:
                self._emit(src, hint, var, indent)
            else:
                tests.append(test)
        if tests:
            src.lines.append(f"{indent}if not ({' and '.join(tests)}): raise Mismatch")

    def _default(self, src: _Source, f: dataclasses.Field[Any]) -> str | None:
        """An expression of the default of field ``f``, None if it has none. A default
        made by a dataclass whose fields all have defaults is built as decoding an empty
        compact layout of it builds it."""
        if f.default is not dataclasses.MISSING:
            return src.name(f.default)
        factory: Any = f.default_factory
        if factory is dataclasses.MISSING:
            return None
        if _is_dataclass(factory) and all(_has_default(g) for g in init_fields(factory)):
            return f"{src.name(self.of(factory)[0])}({src.name([])})"
        return f"{src.name(factory)}()"


def _generic(decoder: Callable[[Any, str], Any]) -> Fast:
    """A compiled decoder that is ``decoder`` (a generic one) and raises Mismatch."""

    def decode(data: Any) -> Any:
        try:
            return decoder(data, "$")
        except CodecError:
            raise Mismatch from None

    return decode


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _construct(
    src: _Source, tp: type, fields: tuple[dataclasses.Field[Any], ...], values: list[str]
) -> None:
    """Append the statements building the record from the expressions ``values`` (see
    the module's docstring on twins)."""
    twin = _twin(tp)
    add = src.lines.append
    if twin is None:
        names = ", ".join(f"{f.name}={v}" for f, v in zip(fields, values, strict=True))
        add(f"    return {src.name(tp)}({names})")
        return
    add(f"    o = {src.name(twin)}()")
    for f, v in zip(fields, values, strict=True):
        add(f"    o.{f.name} = {v}")
    add(f"    o.__class__ = {src.name(tp)}")
    add("    return o")


def _twin(tp: type) -> type | None:
    """A plain class with the slots of dataclass ``tp``, whose instances may become
    ``tp``'s by ``__class__`` assignment; None where building ``tp`` without its
    ``__init__`` would not be the same as with it."""
    slots = tp.__dict__.get("__slots__")
    params = getattr(tp, "__dataclass_params__", None)
    if (
        slots is None
        or params is None
        or not params.init
        or hasattr(tp, "__post_init__")
        or tp.__bases__ != (object,)
        or len(init_fields(tp)) != len(dataclasses.fields(tp))
        or tuple(slots) != tuple(f.name for f in dataclasses.fields(tp))
    ):
        return None
    twin = type(f"_{tp.__name__}Twin", (), {"__slots__": tuple(slots)})
    try:
        twin().__class__ = tp  # the layouts differ: TypeError
    except TypeError:
        return None
    return twin
