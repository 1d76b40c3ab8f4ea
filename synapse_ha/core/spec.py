"""Job specification documents (DESIGN §6) into a core :class:`JobSpec`.

:func:`parse_job_spec` turns a plain mapping (parsed YAML or JSON, with human quantities
such as ``"500m"``, ``"256Gi"`` or ``"12h"``) into a :class:`ParsedJob`. This module owns
only the document's shape: which fields exist, their types and how quantities and
durations are written. Every rule on the values, and every limit, belongs to
:mod:`synapse_ha.core.validation`, which the parser calls on the spec it built.

Errors are :class:`SpecError`, carrying a :class:`~synapse_ha.core.validation.Violation`
that names the offending field and the rule it broke, so that nothing invalid ever
reaches the replicated log.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from synapse_ha.core.cluster_config import DEFAULT_QUEUE, DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.core.dependencies import Dependencies, DependencyKind
from synapse_ha.core.model import JobSpec, Resources, RetryPolicy
from synapse_ha.core.prestart import DEFAULT_PRESTART_TIMEOUT_MS, Prestart
from synapse_ha.core.progress import SOURCE_FILE, Progress
from synapse_ha.core.validation import (
    MAX_CPU_MILLI,
    MAX_MEMORY_MIB,
    Violation,
    ViolationCode,
    check_job_spec,
    check_request_id,
)
from synapse_ha.core.windows import parse_time

_TOP_FIELDS = frozenset(
    {
        "name",
        "replicas",
        "resources",
        "command",
        "env",
        "workdir",
        "priority",
        "topology",
        "time_limit",
        "retries",
        "request_id",
        "image",
        "queue",
        "progress",
        "prestart",
        "dependencies",
        "array",
        "begin",
        "deadline",
    }
)
_DEPENDENCY_FIELDS = frozenset(str(kind) for kind in DependencyKind)
_PRESTART_FIELDS = frozenset({"command", "timeout"})
_RESOURCE_FIELDS = frozenset({"gpu", "cpu", "memory"})
_TOPOLOGY_FIELDS = frozenset({"required", "preferred"})
_RETRY_FIELDS = frozenset({"max", "backoff", "max_backoff"})
_PROGRESS_FIELDS = frozenset({"timeout", "source"})

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


class SpecError(ValueError):
    """A job specification (or another document read by a program) broke a rule.

    ``violation`` is the first rule broken, as a value; ``violations`` every one found
    (the parser stops at the first malformed field, the rule check reports them all).
    ``field`` is a dotted path such as ``resources.memory``; ``rule`` says what is allowed.
    """

    def __init__(
        self,
        field: str,
        rule: str,
        code: ViolationCode = ViolationCode.INVALID_FIELD,
        *,
        violations: Sequence[Violation] = (),
    ) -> None:
        super().__init__(f"{field}: {rule}")
        self.violation = Violation(code, field, rule)
        self.violations: tuple[Violation, ...] = tuple(violations) or (self.violation,)

    @classmethod
    def of(cls, violations: Sequence[Violation]) -> SpecError:
        """The error for a non-empty list of violations (the first one is its message)."""
        first = violations[0]
        return cls(first.field, first.rule, first.code, violations=violations)

    @property
    def field(self) -> str:
        return self.violation.field

    @property
    def rule(self) -> str:
        return self.violation.rule

    @property
    def code(self) -> ViolationCode:
        return self.violation.code


@dataclass(frozen=True, slots=True)
class ParsedJob:
    spec: JobSpec
    request_id: str  # empty when the document carried none


# ---------------------------------------------------------------------- quantities


def _is_int(value: object) -> bool:
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
    if not (_is_int(value) or isinstance(value, float)):
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
    if _is_int(value) or isinstance(value, float):
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
            f"expected a number or a string like 500m, got {_kind(value)}",
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
    if _is_int(value):
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
            field, f"expected a string like 256Gi, got {_kind(value)}", ViolationCode.WRONG_TYPE
        )
    result = int(-(-mib // 1))  # round up to whole MiB
    if not 0 <= result <= MAX_MEMORY_MIB:
        raise SpecError(field, "must be between 0 and 1Pi")
    return result


def parse_duration(value: object, field: str) -> int:
    """A duration as milliseconds: ``"10s"``, ``"10m"``, ``"12h"``, ``"2d"``, ``"500ms"``;
    a bare number means seconds."""
    _check_plain_number(value, field, "is too long")
    if _is_int(value) or isinstance(value, float):
        ms = float(value) * 1000  # type: ignore[arg-type]
    elif isinstance(value, str):
        match = _QUANTITY.match(value.strip())
        if match is None or match.group(2) not in _DURATION_UNITS_MS:
            raise SpecError(field, f"{value!r} is not a duration (e.g. 10s, 10m or 12h)")
        ms = float(match.group(1)) * _DURATION_UNITS_MS[match.group(2)]
    else:
        raise SpecError(
            field, f"expected a duration like 10m, got {_kind(value)}", ViolationCode.WRONG_TYPE
        )
    if ms < 0:
        raise SpecError(field, "must not be negative")
    return int(ms)


# -------------------------------------------------------------------- whole specs


def parse_job_spec(
    data: object, topology_levels: Sequence[str] | None = DEFAULT_TOPOLOGY_LEVELS
) -> ParsedJob:
    """Validate a plain job document and build the core spec.

    ``topology_levels`` are the cluster's levels above a host; ``host`` is always allowed.
    ``None`` means they are not known here (a client of a cluster whose levels are
    configured there): any well-formed level name passes, and the cluster checks it.
    """
    doc = _mapping(data, "spec", _TOP_FIELDS)
    for field in ("name", "replicas", "command"):
        if field not in doc:
            raise SpecError(field, "is required", ViolationCode.REQUIRED)
    resources = _resources(doc.get("resources", {}))
    command, shell = _command(doc["command"])
    env = _env(doc.get("env", {}))
    topology_doc = _mapping(doc.get("topology", {}), "topology", _TOPOLOGY_FIELDS)
    retries = _retries(doc.get("retries", {}))
    replicas = doc["replicas"]
    if not _is_int(replicas):
        raise SpecError(
            "replicas", f"expected an integer, got {_kind(replicas)}", ViolationCode.WRONG_TYPE
        )
    priority, priority_class = _priority(doc.get("priority", 0))
    spec = JobSpec(
        name=_string(doc["name"], "name"),
        replicas=replicas,
        resources=resources,
        command=command,
        shell=shell,
        env=env,
        workdir=_string(doc.get("workdir", ""), "workdir"),
        priority=priority,
        topology_required=_string(topology_doc.get("required", ""), "topology.required"),
        topology_preferred=_string(topology_doc.get("preferred", ""), "topology.preferred"),
        time_limit_ms=parse_duration(doc["time_limit"], "time_limit") if "time_limit" in doc else 0,
        retries=retries,
        image=_string(doc.get("image", ""), "image"),
        queue=_string(doc.get("queue", DEFAULT_QUEUE), "queue"),
        priority_class=priority_class,
        progress=_progress(doc["progress"]) if "progress" in doc else None,
        prestart=_prestart(doc["prestart"]) if "prestart" in doc else None,
        dependencies=_dependencies(doc["dependencies"]) if "dependencies" in doc else None,
        array=_array(doc["array"]) if "array" in doc else "",
    )
    begin = _moment(doc["begin"], "begin") if "begin" in doc else (0, 0)
    deadline = _moment(doc["deadline"], "deadline") if "deadline" in doc else (0, 0)
    spec = dataclasses.replace(
        spec,
        begin_at_ms=begin[0],
        begin_delay_ms=begin[1],
        deadline_at_ms=deadline[0],
        deadline_delay_ms=deadline[1],
    )
    request_id = _string(doc.get("request_id", ""), "request_id")
    violations = check_job_spec(spec, topology_levels) + check_request_id(request_id)
    if violations:
        raise SpecError.of(violations)
    return ParsedJob(spec=spec, request_id=request_id)


# ------------------------------------------------------------------------ helpers


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _mapping(value: object, field: str, allowed: frozenset[str] | None) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(field, f"expected a mapping, got {_kind(value)}", ViolationCode.WRONG_TYPE)
    for key in value:
        if not isinstance(key, str):
            raise SpecError(
                field, f"keys must be strings, got {_kind(key)}", ViolationCode.WRONG_TYPE
            )
        if allowed is not None and key not in allowed:
            prefix = "" if field == "spec" else f"{field}."
            raise SpecError(
                f"{prefix}{key}",
                f"unknown field (allowed: {', '.join(sorted(allowed))})",
                ViolationCode.UNKNOWN_FIELD,
            )
    return value


def _resources(value: object) -> Resources:
    """``resources:``: GPUs a whole number, CPU and memory as quantities."""
    doc = _mapping(value, "resources", _RESOURCE_FIELDS)
    gpu = doc.get("gpu", 0)
    if not _is_int(gpu):
        raise SpecError(
            "resources.gpu", f"expected an integer, got {_kind(gpu)}", ViolationCode.WRONG_TYPE
        )
    return Resources(
        cpu_milli=parse_cpu(doc.get("cpu", 0)),
        memory_mib=parse_memory(doc.get("memory", 0)),
        gpu=gpu,
    )


def _env(value: object) -> tuple[tuple[str, str], ...]:
    """``env:``: a mapping of names to strings (numbers are written as strings)."""
    env = []
    for key, item in _mapping(value, "env", None).items():
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise SpecError(
                f"env.{key}", f"expected a string, got {_kind(item)}", ViolationCode.WRONG_TYPE
            )
        env.append((str(key), str(item)))
    return tuple(env)


def _retries(value: object) -> RetryPolicy:
    """``retries:``: how many, and the backoff durations (the defaults where absent)."""
    doc = _mapping(value, "retries", _RETRY_FIELDS)
    max_retries = doc.get("max", 0)
    if not _is_int(max_retries):
        raise SpecError(
            "retries.max",
            f"expected an integer, got {_kind(max_retries)}",
            ViolationCode.WRONG_TYPE,
        )
    defaults = RetryPolicy()
    return RetryPolicy(
        max_retries=max_retries,
        backoff_ms=parse_duration(doc.get("backoff", "10s"), "retries.backoff")
        if "backoff" in doc
        else defaults.backoff_ms,
        max_backoff_ms=parse_duration(doc["max_backoff"], "retries.max_backoff")
        if "max_backoff" in doc
        else defaults.max_backoff_ms,
    )


def _progress(value: object) -> Progress:
    """``progress:``: hang detection, ``{timeout: 30m}`` or ``{timeout: 30m, source: log}``
    (the source is ``file`` where absent); the limits are the rule set's."""
    doc = _mapping(value, "progress", _PROGRESS_FIELDS)
    if "timeout" not in doc:
        raise SpecError("progress.timeout", "is required", ViolationCode.REQUIRED)
    return Progress(
        timeout_ms=parse_duration(doc["timeout"], "progress.timeout"),
        source=_string(doc.get("source", SOURCE_FILE), "progress.source"),
    )


def _priority(value: object) -> tuple[int, str]:
    """``priority:`` is a number (``priority`` itself, no class) or the name of one of
    the cluster's priority classes (``priority_class``; its value is the class's, which
    the cluster knows)."""
    if _is_int(value):
        return value, ""  # type: ignore[return-value]
    if isinstance(value, str):
        return 0, value
    raise SpecError(
        "priority",
        f"expected an integer or a priority class name, got {_kind(value)}",
        ViolationCode.WRONG_TYPE,
    )


def _moment(value: object, field: str) -> tuple[int, int]:
    """``begin:``/``deadline:``: an ISO 8601 time with its zone (``2026-12-01T02:00Z``)
    as (time, 0), or ``+2h``, a delay after the submission, as (0, delay); in ms."""
    text = _string(value, field).strip()
    if text.startswith("+"):
        return 0, parse_duration(text[1:], field)
    at_ms = parse_time(text)
    if at_ms is None:
        raise SpecError(
            field,
            f"{text!r} is neither a time with its zone (2026-12-01T02:00Z) nor a delay (+2h)",
        )
    return at_ms, 0


def _dependencies(value: object) -> Dependencies | None:
    """``dependencies:``, ``{afterok: [job-000012], after: job-000013}``: per kind a job
    id or a list of them; None when every list is empty."""
    doc = _mapping(value, "dependencies", _DEPENDENCY_FIELDS)
    ids: dict[str, tuple[str, ...]] = {}
    for kind, given in doc.items():
        field = f"dependencies.{kind}"
        items = given if isinstance(given, list) else [given]
        ids[kind] = tuple(_string(item, field) for item in items)
    deps = Dependencies(
        after_ok=ids.get(DependencyKind.AFTER_OK, ()),
        after_any=ids.get(DependencyKind.AFTER_ANY, ()),
        after_not_ok=ids.get(DependencyKind.AFTER_NOT_OK, ()),
        after=ids.get(DependencyKind.AFTER, ()),
    )
    return deps if deps.pairs() else None


def _array(value: object) -> str:
    """``array:``: Slurm's text (``"0-99%10"``), or a single index as a number."""
    if _is_int(value):
        return str(value)
    return _string(value, "array").strip()


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise SpecError(field, f"expected a string, got {_kind(value)}", ViolationCode.WRONG_TYPE)
    return value


def _command(value: object, field: str = "command") -> tuple[tuple[str, ...], bool]:
    if isinstance(value, str):
        if not value.strip():
            raise SpecError(field, "must not be empty")
        return (value,), True
    if isinstance(value, list) and value:
        for i, part in enumerate(value):
            if not isinstance(part, str) or not part:
                raise SpecError(
                    f"{field}[{i}]", "expected a non-empty string", ViolationCode.WRONG_TYPE
                )
        return tuple(value), False
    raise SpecError(
        field, "expected a string or a non-empty list of strings", ViolationCode.WRONG_TYPE
    )


def _prestart(value: object) -> Prestart:
    """``prestart:``: a command (string or list, as ``command``), or a mapping of
    ``command`` and ``timeout`` (default 60s)."""
    if not isinstance(value, Mapping):
        command, shell = _command(value, "prestart")
        return Prestart(command, shell)
    doc = _mapping(value, "prestart", _PRESTART_FIELDS)
    if "command" not in doc:
        raise SpecError("prestart.command", "is required", ViolationCode.REQUIRED)
    command, shell = _command(doc["command"], "prestart.command")
    timeout = (
        parse_duration(doc["timeout"], "prestart.timeout")
        if "timeout" in doc
        else DEFAULT_PRESTART_TIMEOUT_MS
    )
    return Prestart(command, shell, timeout)
