"""Job specification documents (DESIGN §6) into a core :class:`JobSpec`.

:func:`parse_job_spec` turns a plain mapping (parsed YAML or JSON, with human quantities
such as ``"500m"``, ``"256Gi"`` or ``"12h"``) into a :class:`ParsedJob`. This module owns
only the document's shape: which fields exist and their types; how quantities and
durations are written is :mod:`synapse_ha.core.spec.values`. Every rule on the values,
and every limit, belongs to :mod:`synapse_ha.core.spec.validation`, which the parser calls on
the spec it built.

Errors are :class:`SpecError`, carrying every
:class:`~synapse_ha.core.spec.validation.Violation` the document has (each names the offending
field and the rule it broke; an unknown field or value the closest allowed one), so that
one reading reports them all and nothing invalid ever reaches the replicated log.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from synapse_ha.core.cluster_config import DEFAULT_QUEUE, DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.health.prestart import DEFAULT_PRESTART_TIMEOUT_MS, Prestart
from synapse_ha.core.health.progress import SOURCE_FILE, Progress
from synapse_ha.core.model import JobSpec, Resources, RetryPolicy
from synapse_ha.core.node_selector import NodeSelector
from synapse_ha.core.replacement import (
    DEFAULT_MEMBERSHIP_SIGNAL,
    DEFAULT_REPLACE_TIMEOUT_MS,
    REPLACE_KEYS,
    ReplacePolicy,
)
from synapse_ha.core.spec.fields import SPEC_FIELDS
from synapse_ha.core.spec.validation import (
    Violation,
    ViolationCode,
    check_job_spec,
    check_request_id,
    did_you_mean,
)
from synapse_ha.core.spec.values import SpecError as SpecError
from synapse_ha.core.spec.values import is_int as _is_int
from synapse_ha.core.spec.values import kind as _kind
from synapse_ha.core.spec.values import parse_cpu as parse_cpu
from synapse_ha.core.spec.values import parse_duration as parse_duration
from synapse_ha.core.spec.values import parse_memory as parse_memory
from synapse_ha.core.workflows.dependencies import Dependencies, DependencyKind
from synapse_ha.core.workflows.windows import parse_time

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
        "wait_for_nodes",
        "nodes",
        *REPLACE_KEYS,
        *(f.key for f in SPEC_FIELDS),
    }
)
_DEPENDENCY_FIELDS = frozenset({*(str(kind) for kind in DependencyKind), "singleton"})
_PRESTART_FIELDS = frozenset({"command", "timeout"})
_RESOURCE_FIELDS = frozenset({"gpu", "cpu", "memory"})
_TOPOLOGY_FIELDS = frozenset({"required", "preferred"})
_RETRY_FIELDS = frozenset({"max", "backoff", "max_backoff"})
_PROGRESS_FIELDS = frozenset({"timeout", "source"})
_NODES_FIELDS = frozenset({"features", "gpu_model", "names", "exclude"})

_T = TypeVar("_T")
_PLAIN = JobSpec("", 1, Resources(), ())  # the defaults of the fields a document leaves out
# How each kind of spec_fields.SPEC_FIELDS is read.
_READERS: dict[str, Callable[[object, str], Any]] = {
    "duration": parse_duration,
    "text": lambda value, field: _string(value, field),
}


@dataclass(frozen=True, slots=True)
class ParsedJob:
    spec: JobSpec
    request_id: str  # empty when the document carried none


# -------------------------------------------------------------------- whole specs

# What a spec states for each member when it leaves ``resources.cpu`` or
# ``resources.memory`` out: none, so nothing is reserved and nothing limited (a request is
# also the member's limit where the worker enforces limits: a default of a CPU and a GiB
# would throttle and kill a training job that did not say). ``synctl sbatch`` and the
# Python client read their documents here too, so all three apply the same defaults.
DEFAULT_CPU = 0
DEFAULT_MEMORY = 0
DEFAULT_RESOURCES = Resources(cpu_milli=0, memory_mib=0, gpu=0)

# Fields of the mappings nested in a spec, for the hint given for one written at the top.
_NESTED_FIELDS = {
    "resources": _RESOURCE_FIELDS,
    "topology": _TOPOLOGY_FIELDS,
    "retries": _RETRY_FIELDS,
    "progress": _PROGRESS_FIELDS,
    "prestart": _PRESTART_FIELDS,
    "nodes": _NODES_FIELDS,
}


class _Problems:
    """Every rule a document breaks, gathered as it is read, so that one reading reports
    them all."""

    def __init__(self) -> None:
        self.found: list[Violation] = []

    def add(self, field: str, rule: str, code: ViolationCode = ViolationCode.INVALID_FIELD) -> None:
        self.found.append(Violation(code, field, rule))

    def take(self, read: Callable[[], _T], fallback: _T) -> _T:
        """``read()``, or ``fallback`` once the rules it broke are noted."""
        try:
            return read()
        except SpecError as exc:
            self.found.extend(exc.violations)
            return fallback


def parse_job_spec(
    data: object, topology_levels: Sequence[str] | None = DEFAULT_TOPOLOGY_LEVELS
) -> ParsedJob:
    """Validate a plain job document and build the core spec.

    Raises a :class:`SpecError` listing every rule the document breaks, ordered by its
    top-level fields as the document gives them (a field it lacks comes last).
    ``topology_levels`` are the cluster's levels above a host; ``host`` is always allowed.
    ``None`` means they are not known here (a client of a cluster whose levels are
    configured there): any well-formed level name passes, and the cluster checks it.
    """
    problems = _Problems()
    doc = _mapping(data, "spec", _TOP_FIELDS, problems)
    misspelt = _required(data, doc, problems)
    take = problems.take
    resources = take(lambda: _resources(doc.get("resources", {}), problems), DEFAULT_RESOURCES)
    stand_in: tuple[tuple[str, ...], bool] = (("true",), True)
    command, shell = take(lambda: _command(doc.get("command", "true")), stand_in)
    no_env: tuple[tuple[str, str], ...] = ()
    env = take(lambda: _env(doc.get("env", {}), problems), no_env)
    no_topology: Mapping[str, Any] = {}
    topology_doc = take(
        lambda: _mapping(doc.get("topology", {}), "topology", _TOPOLOGY_FIELDS, problems),
        no_topology,
    )
    retries = take(lambda: _retries(doc.get("retries", {}), problems), RetryPolicy())
    fixed: tuple[int, int | None] = (1, None)
    replicas, min_replicas = take(lambda: _replicas(doc.get("replicas", 1), problems), fixed)
    priority, priority_class = take(lambda: _priority(doc.get("priority", 0)), (0, ""))

    def string(field: str, value: object) -> str:
        return take(lambda: _string(value, field), "")

    def optional(field: str, read: Callable[[object], _T], absent: _T) -> _T:
        return take(lambda: read(doc[field]), absent) if field in doc else absent

    spec = JobSpec(
        name=string("name", doc.get("name", "")),
        replicas=replicas,
        resources=resources,
        command=command,
        shell=shell,
        env=env,
        workdir=string("workdir", doc.get("workdir", "")),
        priority=priority,
        topology_required=string("topology.required", topology_doc.get("required", "")),
        topology_preferred=string("topology.preferred", topology_doc.get("preferred", "")),
        time_limit_ms=optional("time_limit", lambda v: parse_duration(v, "time_limit"), 0),
        retries=retries,
        image=string("image", doc.get("image", "")),
        queue=string("queue", doc.get("queue", DEFAULT_QUEUE)),
        priority_class=priority_class,
        progress=optional("progress", lambda v: _progress(v, problems), None),
        prestart=optional("prestart", lambda v: _prestart(v, problems), None),
        dependencies=optional("dependencies", lambda v: _dependencies(v, problems), None),
        array=optional("array", _array, ""),
        wait_for_nodes=optional("wait_for_nodes", _flag, False),
        nodes=optional("nodes", lambda v: _nodes(v, problems), None),
        replace=_replace(doc, problems, elastic=min_replicas is not None),
        elastic=_elastic(doc, min_replicas, problems),
        **{
            f.attr: take(partial(_READERS[f.kind], doc[f.key], f.key), getattr(_PLAIN, f.attr))
            for f in SPEC_FIELDS
            if f.key in doc
        },
    )
    begin = optional("begin", lambda v: _moment(v, "begin"), (0, 0))
    deadline = optional("deadline", lambda v: _moment(v, "deadline"), (0, 0))
    spec = dataclasses.replace(
        spec,
        begin_at_ms=begin[0],
        begin_delay_ms=begin[1],
        deadline_at_ms=deadline[0],
        deadline_delay_ms=deadline[1],
    )
    request_id = string("request_id", doc.get("request_id", ""))
    _raise_problems(data, spec, request_id, topology_levels, problems.found, misspelt)
    return ParsedJob(spec=spec, request_id=request_id)


def _raise_problems(
    data: object,
    spec: JobSpec,
    request_id: str,
    topology_levels: Sequence[str] | None,
    found: list[Violation],
    misspelt: set[str],
) -> None:
    """Raise every problem of the document at once: those found reading it, then the
    rules the spec it gave breaks, except for a field that could not be read (or was
    misspelt), whose stand-in the rules ignore."""
    ruled = [
        v
        for v in check_job_spec(spec, topology_levels) + check_request_id(request_id)
        if not any(_related(v.field, f) for f in [*misspelt, *(f.field for f in found)])
    ]
    violations = found + ruled
    if violations:
        raise SpecError.of(_in_document_order(violations, data))


def _required(data: object, doc: Mapping[str, Any], problems: _Problems) -> set[str]:
    """Note each required field ``doc`` lacks, unless a field of ``data`` is a misspelling
    of it (said once, as the misspelling); the fields misspelt."""
    misspelt = {
        close
        for key in (data if isinstance(data, Mapping) else ())
        if isinstance(key, str) and key not in _TOP_FIELDS
        for close in difflib.get_close_matches(key, sorted(_TOP_FIELDS), n=1)
    }
    for field in ("name", "replicas", "command"):
        if field not in doc and field not in misspelt:
            problems.add(field, "is required", ViolationCode.REQUIRED)
    return misspelt


def _integer(value: object, field: str) -> int:
    if not _is_int(value):
        raise SpecError(field, f"expected an integer, got {_kind(value)}", ViolationCode.WRONG_TYPE)
    return value  # type: ignore[return-value]


def _related(a: str, b: str) -> bool:
    """Whether one field path is the other or lies within it."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith((f"{short}.", f"{short}["))


def _in_document_order(violations: list[Violation], data: object) -> list[Violation]:
    """Ordered by the top-level field each names, as the document gives them; fields it
    lacks last; the order found within one field."""
    keys = list(data) if isinstance(data, Mapping) else []
    position = {key: i for i, key in enumerate(keys)}

    def top(field: str) -> int:
        return position.get(re.split(r"[.\[]", field, maxsplit=1)[0], len(keys))

    return sorted(violations, key=lambda v: top(v.field))


# ------------------------------------------------------------------------ helpers


def _mapping(
    value: object, field: str, allowed: frozenset[str] | None, problems: _Problems | None = None
) -> Mapping[str, Any]:
    """``value`` as a mapping of its well-formed keys. A key that is not a string, or not
    an ``allowed`` field, is a problem noted in ``problems`` (raised when None); not a
    mapping at all raises."""
    if not isinstance(value, Mapping):
        raise SpecError(field, f"expected a mapping, got {_kind(value)}", ViolationCode.WRONG_TYPE)
    noted = _Problems() if problems is None else problems
    kept: dict[str, Any] = {}
    prefix = "" if field == "spec" else f"{field}."
    for key, item in value.items():
        if not isinstance(key, str):
            noted.add(field, f"keys must be strings, got {_kind(key)}", ViolationCode.WRONG_TYPE)
        elif allowed is not None and key not in allowed:
            noted.add(f"{prefix}{key}", _unknown(key, field, allowed), ViolationCode.UNKNOWN_FIELD)
        else:
            kept[key] = item
    if problems is None and noted.found:
        raise SpecError.of(noted.found)
    return kept


def _unknown(key: str, field: str, allowed: frozenset[str]) -> str:
    """The rule for an unknown field: the closest allowed name, or the field of a nested
    mapping it belongs to (a key written at the top, not indented under its parent)."""
    hint = did_you_mean(key, sorted(allowed))
    if not hint and field == "spec":
        parents = sorted(parent for parent, fields in _NESTED_FIELDS.items() if key in fields)
        if parents:
            parent = parents[0]
            return f"unknown field; did you mean `{parent}.{key}`? (indent it under {parent}:)"
    if hint:
        return f"unknown field; {hint}"
    return f"unknown field (allowed: {', '.join(sorted(allowed))})"


def _resources(value: object, problems: _Problems) -> Resources:
    """``resources:``: GPUs a whole number, CPU and memory as quantities (none where
    absent: :data:`DEFAULT_RESOURCES`)."""
    doc = _mapping(value, "resources", _RESOURCE_FIELDS, problems)
    gpu = doc.get("gpu", 0)
    if not _is_int(gpu):
        problems.add(
            "resources.gpu", f"expected an integer, got {_kind(gpu)}", ViolationCode.WRONG_TYPE
        )
        gpu = 0
    return Resources(
        cpu_milli=problems.take(lambda: parse_cpu(doc.get("cpu", DEFAULT_CPU)), 0),
        memory_mib=problems.take(lambda: parse_memory(doc.get("memory", DEFAULT_MEMORY)), 0),
        gpu=gpu,
    )


def _env(value: object, problems: _Problems) -> tuple[tuple[str, str], ...]:
    """``env:``: a mapping of names to strings (numbers are written as strings)."""
    env = []
    for key, item in _mapping(value, "env", None, problems).items():
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            problems.add(
                f"env.{key}", f"expected a string, got {_kind(item)}", ViolationCode.WRONG_TYPE
            )
            continue
        env.append((str(key), str(item)))
    return tuple(env)


def _retries(value: object, problems: _Problems) -> RetryPolicy:
    """``retries:``: how many, and the backoff durations (the defaults where absent)."""
    doc = _mapping(value, "retries", _RETRY_FIELDS, problems)
    defaults = RetryPolicy()
    max_retries = doc.get("max", 0)
    if not _is_int(max_retries):
        problems.add(
            "retries.max",
            f"expected an integer, got {_kind(max_retries)}",
            ViolationCode.WRONG_TYPE,
        )
        max_retries = 0
    backoff = defaults.backoff_ms
    if "backoff" in doc:
        backoff = problems.take(lambda: parse_duration(doc["backoff"], "retries.backoff"), backoff)
    max_backoff = defaults.max_backoff_ms
    if "max_backoff" in doc:
        max_backoff = problems.take(
            lambda: parse_duration(doc["max_backoff"], "retries.max_backoff"), max_backoff
        )
    return RetryPolicy(max_retries=max_retries, backoff_ms=backoff, max_backoff_ms=max_backoff)


def _progress(value: object, problems: _Problems) -> Progress:
    """``progress:``: hang detection, ``{timeout: 30m}`` or ``{timeout: 30m, source: log}``
    (the source is ``file`` where absent); the limits are the rule set's."""
    doc = _mapping(value, "progress", _PROGRESS_FIELDS, problems)
    timeout = 0
    if "timeout" not in doc:
        problems.add("progress.timeout", "is required", ViolationCode.REQUIRED)
    else:
        timeout = problems.take(lambda: parse_duration(doc["timeout"], "progress.timeout"), 0)
    source = problems.take(lambda: _string(doc.get("source", SOURCE_FILE), "progress.source"), "")
    return Progress(timeout_ms=timeout, source=source)


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


def _dependencies(value: object, problems: _Problems) -> Dependencies | None:
    """``dependencies:``, ``{afterok: [job-000012], after: job-000013, singleton: true}``:
    per kind a job id or a list of them; None when every list is empty and it is no
    singleton."""
    doc = dict(_mapping(value, "dependencies", _DEPENDENCY_FIELDS, problems))
    singleton = doc.pop("singleton", False)
    if not isinstance(singleton, bool):
        problems.add("dependencies.singleton", f"expected true or false, got {_kind(singleton)}")
        singleton = False
    ids: dict[str, tuple[str, ...]] = {}
    for kind, given in doc.items():
        field = f"dependencies.{kind}"
        items = given if isinstance(given, list) else [given]
        texts = []
        for item in items:
            try:
                texts.append(_string(item, field))
            except SpecError as exc:
                problems.found.extend(exc.violations)
        ids[kind] = tuple(texts)
    deps = Dependencies(
        after_ok=ids.get(DependencyKind.AFTER_OK, ()),
        after_any=ids.get(DependencyKind.AFTER_ANY, ()),
        after_not_ok=ids.get(DependencyKind.AFTER_NOT_OK, ()),
        after=ids.get(DependencyKind.AFTER, ()),
        singleton=singleton,
    )
    return deps if deps.pairs() or singleton else None


def _nodes(value: object, problems: _Problems) -> NodeSelector | None:
    """``nodes:``, ``{features: "a100&ib", gpu_model: a100, names: [gpu01], exclude:
    [gpu07]}`` (core/node_selector.py): a name list may be one string; None when the
    mapping selects every node."""
    doc = _mapping(value, "nodes", _NODES_FIELDS, problems)
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("names", "exclude"):
        given = doc.get(key, [])
        items = given if isinstance(given, list) else [given]
        texts = []
        for item in items:
            try:
                texts.append(_string(item, f"nodes.{key}"))
            except SpecError as exc:
                problems.found.extend(exc.violations)
        lists[key] = tuple(texts)
    selector = NodeSelector(
        features=_string(doc.get("features", ""), "nodes.features"),
        gpu_model=_string(doc.get("gpu_model", ""), "nodes.gpu_model"),
        names=lists["names"],
        exclude=lists["exclude"],
    )
    return selector if selector else None


def _replicas(value: object, problems: _Problems) -> tuple[int, int | None]:
    """``replicas: 8`` (a fixed gang: ``(8, None)``) or ``replicas: {min: 4, max: 8}`` (an
    elastic gang, core/elastic.py: ``(8, 4)``)."""
    if not isinstance(value, Mapping):
        return _integer(value, "replicas"), None
    for key in value:
        if key not in ("min", "max"):
            problems.add(f"replicas.{key}", "unknown field; replicas takes min and max")
    missing = [key for key in ("min", "max") if key not in value]
    for key in missing:
        problems.add(f"replicas.{key}", "is required", ViolationCode.REQUIRED)
    if missing:
        return 1, None
    most = problems.take(lambda: _integer(value["max"], "replicas.max"), 1)
    fewest = problems.take(lambda: _integer(value["min"], "replicas.min"), None)
    return most, fewest


def _elastic(
    doc: Mapping[str, Any], min_replicas: int | None, problems: _Problems
) -> ElasticPolicy | None:
    """An elastic gang's policy: its ``min`` and the ``membership_signal`` its members
    get when it grows or shrinks; None for a fixed gang."""
    if min_replicas is None:
        return None
    return ElasticPolicy(min_replicas, _signal(doc, problems))


def _signal(doc: Mapping[str, Any], problems: _Problems) -> str:
    """``membership_signal``: ``SIGUSR1`` (the default), ``usr2``, ``none``..."""
    if "membership_signal" not in doc:
        return DEFAULT_MEMBERSHIP_SIGNAL
    text = problems.take(lambda: _string(doc["membership_signal"], "membership_signal"), "")
    signal = "" if text.lower() == "none" else text.upper()
    if signal and not signal.startswith("SIG"):
        signal = "SIG" + signal
    return signal


def _replace(doc: Mapping[str, Any], problems: _Problems, *, elastic: bool) -> ReplacePolicy | None:
    """``on_node_failure: replace`` (or ``requeue``, the default), with its optional
    ``replace_timeout`` (a duration) and ``membership_signal`` (``SIGUSR1``, ``none``...),
    which only a replacing or an elastic job may give."""
    policy = problems.take(
        lambda: _string(doc.get("on_node_failure", "requeue"), REPLACE_KEYS[0]), ""
    )
    if policy not in ("requeue", "replace"):
        problems.add(REPLACE_KEYS[0], "must be requeue (the default) or replace")
        return None
    if policy == "requeue":
        for key in REPLACE_KEYS[1:]:
            if key in doc and not (elastic and key == "membership_signal"):
                problems.add(key, "needs on_node_failure: replace")
        return None
    timeout = DEFAULT_REPLACE_TIMEOUT_MS
    if "replace_timeout" in doc:
        timeout = problems.take(
            lambda: parse_duration(doc["replace_timeout"], "replace_timeout"), 0
        )
    return ReplacePolicy(timeout, _signal(doc, problems))


def _flag(value: object) -> bool:
    if isinstance(value, bool):  # wait_for_nodes: true or false
        return value
    raise SpecError("wait_for_nodes", f"expected true or false, got {_kind(value)}")


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
        wrong = [
            Violation(ViolationCode.WRONG_TYPE, f"{field}[{i}]", "expected a non-empty string")
            for i, part in enumerate(value)
            if not isinstance(part, str) or not part
        ]
        if wrong:
            raise SpecError.of(wrong)
        return tuple(value), False
    raise SpecError(
        field, "expected a string or a non-empty list of strings", ViolationCode.WRONG_TYPE
    )


def _prestart(value: object, problems: _Problems) -> Prestart:
    """``prestart:``: a command (string or list, as ``command``), or a mapping of
    ``command`` and ``timeout`` (default 60s)."""
    if not isinstance(value, Mapping):
        command, shell = _command(value, "prestart")
        return Prestart(command, shell)
    doc = _mapping(value, "prestart", _PRESTART_FIELDS, problems)
    if "command" not in doc:
        raise SpecError("prestart.command", "is required", ViolationCode.REQUIRED)
    command, shell = _command(doc["command"], "prestart.command")
    timeout = (
        parse_duration(doc["timeout"], "prestart.timeout")
        if "timeout" in doc
        else DEFAULT_PRESTART_TIMEOUT_MS
    )
    return Prestart(command, shell, timeout)
