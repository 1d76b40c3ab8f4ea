"""The error type of spec documents and how their quantities are written: CPU
(``32``, ``0.5``, ``"500m"``), memory (``"256Gi"``, ``"1G"``) and durations (``"10m"``,
``"12h"``), read into the core's integer units (millicores, MiB, milliseconds).
:mod:`synapse_ha.core.spec.document` re-exports all of it; the programs' own configuration files
read their quantities here too."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from synapse_ha.core.spec.validation import (
    MAX_CPU_MILLI,
    MAX_MEMORY_MIB,
    Violation,
    ViolationCode,
    describe,
)

_MEMORY_UNITS_MIB: dict[str, float] = {
    "Ki": 1 / 1024,
    "Mi": 1,
    "Gi": 1024,
    "Ti": 1024**2,
    "Pi": 1024**3,
    "K": 1000 / 1024**2,
    "k": 1000 / 1024**2,
    "M": 1000**2 / 1024**2,
    "G": 1000**3 / 1024**2,
    "T": 1000**4 / 1024**2,
    "P": 1000**5 / 1024**2,
}
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")


class NamesItsViolation:
    """``field``, ``rule`` and ``code`` of the object's ``violation``."""

    __slots__ = ()
    violation: Violation

    @property
    def field(self) -> str:
        return self.violation.field

    @property
    def rule(self) -> str:
        return self.violation.rule

    @property
    def code(self) -> ViolationCode:
        return self.violation.code


class SpecError(NamesItsViolation, ValueError):
    """A job specification (or another document read by a program) broke rules.

    ``violations`` are every rule broken, in the document's order (a file reader sorts
    them by line); ``violation`` is the first. ``field`` is a dotted path such as
    ``resources.memory``; ``rule`` says what is allowed. The message lists them all.
    """

    def __init__(
        self,
        field: str,
        rule: str,
        code: ViolationCode = ViolationCode.INVALID_FIELD,
        *,
        violations: Sequence[Violation] = (),
    ) -> None:
        self.violation = Violation(code, field, rule)
        self.violations: tuple[Violation, ...] = tuple(violations) or (self.violation,)
        super().__init__(describe(self.violations))

    @classmethod
    def of(cls, violations: Sequence[Violation]) -> SpecError:
        """The error for a non-empty list of violations (the first one is ``violation``)."""
        first = violations[0]
        return cls(first.field, first.rule, first.code, violations=violations)


def kind(value: object) -> str:
    """How a value of a document is named in a rule: its type, or ``nothing``."""
    return "nothing" if value is None else type(value).__name__


# ---------------------------------------------------------------------- quantities


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Larger plain numbers are rejected before float conversion, which would overflow.
_MAX_PLAIN_NUMBER = 2**53


def _check_plain_number(value: object, field: str, limit: str) -> None:
    """Reject negative, non-finite and absurdly large numbers (and negative strings)
    before a quantity is converted; ``limit`` says what is allowed."""
    if isinstance(value, str):
        if value.strip().startswith("-"):
            raise SpecError(field, f"must not be negative, got {value!r}")
        return
    if not (is_int(value) or isinstance(value, float)):
        return
    number: float = value  # type: ignore[assignment]
    if isinstance(number, float) and not math.isfinite(number):
        raise SpecError(field, f"must be a finite number, got {number}")
    if number < 0:
        raise SpecError(field, f"must not be negative, got {number}")
    if number > _MAX_PLAIN_NUMBER:
        raise SpecError(field, limit)


def parse_cpu(value: object, field: str = "resources.cpu") -> int:
    """CPU as millicores: ``32``, ``0.5``, ``"2"`` or ``"500m"``."""
    _check_plain_number(value, field, f"must be between 0 and {MAX_CPU_MILLI // 1000} cores")
    if is_int(value) or isinstance(value, float):
        milli = float(value) * 1000  # type: ignore[arg-type]
    elif isinstance(value, str):
        match = _QUANTITY.match(value.strip())
        if match is None or match.group(2) not in ("", "m"):
            raise SpecError(field, f"{value!r} is not a CPU quantity (e.g. 32, 0.5 or 500m)")
        number = float(match.group(1))
        milli = number if match.group(2) == "m" else number * 1000
    else:
        raise SpecError(
            field,
            f"expected a number or a string like 500m, got {kind(value)}",
            ViolationCode.WRONG_TYPE,
        )
    if milli != int(milli):
        raise SpecError(field, f"{value!r} is finer than one millicore")
    result = int(milli)
    if not 0 <= result <= MAX_CPU_MILLI:
        raise SpecError(field, f"must be between 0 and {MAX_CPU_MILLI // 1000} cores")
    return result


def parse_memory(value: object, field: str = "resources.memory") -> int:
    """Memory as MiB: ``"256Gi"``, ``"512Mi"``, ``"1G"``; a bare integer means bytes."""
    _check_plain_number(value, field, "must be between 0 and 1Pi")
    if is_int(value):
        mib = float(value) / (1024 * 1024)  # type: ignore[arg-type]
    elif isinstance(value, str):
        match = _QUANTITY.match(value.strip())
        unit = match.group(2) if match else ""
        if match is None or (unit and unit not in _MEMORY_UNITS_MIB):
            raise SpecError(field, f"{value!r} is not a memory quantity (e.g. 256Gi, 512Mi or 1G)")
        number = float(match.group(1))
        mib = number / (1024 * 1024) if not unit else number * _MEMORY_UNITS_MIB[unit]
    else:
        raise SpecError(
            field, f"expected a string like 256Gi, got {kind(value)}", ViolationCode.WRONG_TYPE
        )
    result = int(-(-mib // 1))  # round up to whole MiB
    if not 0 <= result <= MAX_MEMORY_MIB:
        raise SpecError(field, "must be between 0 and 1Pi")
    return result


def parse_duration(value: object, field: str) -> int:
    """A duration as milliseconds: ``"10s"``, ``"10m"``, ``"12h"``, ``"2d"``, ``"500ms"``;
    a bare number means seconds."""
    _check_plain_number(value, field, "is too long")
    if is_int(value) or isinstance(value, float):
        ms = float(value) * 1000  # type: ignore[arg-type]
    elif isinstance(value, str):
        match = _QUANTITY.match(value.strip())
        if match is None or match.group(2) not in _DURATION_UNITS_MS:
            raise SpecError(field, f"{value!r} is not a duration (e.g. 10s, 10m or 12h)")
        ms = float(match.group(1)) * _DURATION_UNITS_MS[match.group(2)]
    else:
        raise SpecError(
            field, f"expected a duration like 10m, got {kind(value)}", ViolationCode.WRONG_TYPE
        )
    if ms < 0:
        raise SpecError(field, "must not be negative")
    return int(ms)
