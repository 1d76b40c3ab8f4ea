"""The generic job trace: one CSV line per job, so public traces can be replayed.

The format (docs/simulator.md has the full table) is a CSV file with a header line.
Lines that are empty or start with ``#`` are comments. Columns, in any order:

=====================  ========  ==========================================================
column                 required  meaning
=====================  ========  ==========================================================
``submit_s``           yes       submission time, seconds (decimals allowed) from the start
``queue``              yes       the queue the job is submitted to (a queue name)
``members``            yes       gang size: members that must start together (>= 1)
``gpus_per_member``    yes       whole GPUs per member (0 to 64)
``duration_s``         yes       how long the job runs once started, seconds (> 0)
``user``               no        who submitted it (free text of a-z, 0-9, ``.``, ``_``, ``-``)
``name``               no        a job name (default ``job-<line>``)
``time_limit_s``       no        the job's time limit, seconds; empty or 0: none
``topology_required``  no        a topology level all members must share (e.g. ``rack``)
``topology_preferred`` no        a level the members should share when they can
``priority_class``     no        a priority class name of the cluster (e.g. ``high``)
``priority``           no        an integer priority, used when no class is given
``cpu_milli``          no        CPU per member in millicores (default 8000 per GPU, or 1000)
``memory_mib``         no        memory per member in MiB (default 64 GiB per GPU, or 1 GiB)
``array``              no        Slurm ``--array`` text (``0-99%10``): the line submits an
                                 array, a task per index, each running ``duration_s``
``after_ok``           no        line numbers of earlier lines, separated by ``;``: the job
                                 waits until each of those jobs (or arrays) has succeeded
``checkpoint_s``       no        while it runs, every member marks a checkpoint this often,
                                 seconds of run time (>= 1); empty: never
=====================  ========  ==========================================================

A line named in ``after_ok`` is counted as in error messages (the header is line 1,
comments and empty lines count); it must be a job line above this one, submitted no later.

Every line is checked: a bad line raises :class:`TraceError` naming the line number, the
field and the rule it breaks, and the whole trace is refused (nothing is half-loaded).
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from synapse_ha.core.cluster_config import DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.core.model import JobSpec, Resources
from synapse_ha.core.spec.validation import (
    MAX_GPUS_PER_NODE,
    MAX_REPLICAS,
    NAME_PATTERN,
    check_job_spec,
)
from synapse_ha.core.workflows.dependencies import MAX_DEPENDENCIES
from synapse_ha.sim.workload import openb_pods

REQUIRED = ("submit_s", "queue", "members", "gpus_per_member", "duration_s")
OPTIONAL = (
    "user",
    "name",
    "time_limit_s",
    "topology_required",
    "topology_preferred",
    "priority_class",
    "priority",
    "cpu_milli",
    "memory_mib",
    "array",
    "after_ok",
    "checkpoint_s",
)
COLUMNS = REQUIRED + OPTIONAL
USER_PATTERN = re.compile(r"^[a-z0-9._-]{1,63}$")
MAX_DURATION_S = 366 * 86_400
AFTER_OK_SEPARATOR = ";"
MIN_CHECKPOINT_MS = 1_000  # marks carry whole seconds of run time as their step


class TraceError(ValueError):
    """A trace line that breaks a rule: ``line`` (1-based, the header is line 1),
    ``field`` (a column name, or ``header``) and ``rule`` (what is allowed)."""

    def __init__(self, source: str, line: int, field: str, rule: str) -> None:
        super().__init__(f"{source} line {line}: {field}: {rule}")
        self.source = source
        self.line = line
        self.field = field
        self.rule = rule


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One line of a trace, checked: the job to submit and how long it runs."""

    line: int
    submit_ms: int
    user: str
    spec: JobSpec
    duration_ms: int
    # Lines of the trace (their numbers) whose jobs must succeed before this one runs.
    after_ok: tuple[int, ...] = ()
    # How often its members mark a checkpoint while it runs (ms of run time); 0: never.
    checkpoint_ms: int = 0


def load_trace(
    path: Path, topology_levels: Sequence[str] = DEFAULT_TOPOLOGY_LEVELS
) -> list[TraceJob]:
    """Read and check a trace file (see the module docstring); sorted by submission time,
    then line. Raises :class:`TraceError` for the first bad line, OSError if unreadable."""
    with path.open(newline="") as f:
        return parse_trace(f.read(), source=path.name, topology_levels=topology_levels)


def parse_trace(
    text: str, source: str = "trace", topology_levels: Sequence[str] = DEFAULT_TOPOLOGY_LEVELS
) -> list[TraceJob]:
    """The jobs of trace ``text`` (a whole CSV document); see :func:`load_trace`."""
    numbered = [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not numbered:
        raise TraceError(
            source,
            1,
            "header",
            f"a header line naming the columns is required: {', '.join(REQUIRED)}",
        )
    header_line, header_text = numbered[0]
    header = [h.strip() for h in next(csv.reader([header_text]))]
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise TraceError(
            source,
            header_line,
            "header",
            f"unknown column {unknown[0]!r}; known: {', '.join(COLUMNS)}",
        )
    missing = [h for h in REQUIRED if h not in header]
    if missing:
        raise TraceError(
            source, header_line, "header", f"required column {missing[0]!r} is missing"
        )
    if len(set(header)) != len(header):
        raise TraceError(source, header_line, "header", "a column is named twice")
    jobs = []
    for number, line in numbered[1:]:
        cells = next(csv.reader(io.StringIO(line)))
        if len(cells) != len(header):
            raise TraceError(
                source, number, "line", f"has {len(cells)} fields, the header names {len(header)}"
            )
        row = dict(zip(header, (cell.strip() for cell in cells), strict=True))
        jobs.append(_job(row, source, number, topology_levels))
    _check_after_ok(jobs, source)
    jobs.sort(key=lambda j: (j.submit_ms, j.line))
    return jobs


def _check_after_ok(jobs: list[TraceJob], source: str) -> None:
    """Every line an ``after_ok`` names is a job line above it, submitted no later (so
    its job exists when the dependant is submitted)."""
    by_line = {j.line: j for j in jobs}
    for job in jobs:
        for line in job.after_ok:
            other = by_line.get(line)
            if other is None:
                rule = f"line {line} is not a job line of the trace"
            elif line >= job.line:
                rule = f"line {line} is not above this line: name earlier lines only"
            elif other.submit_ms > job.submit_ms:
                rule = (
                    f"line {line} is submitted at {_seconds(other.submit_ms)} s, after this "
                    f"line ({_seconds(job.submit_ms)} s): a job waits only for jobs "
                    "submitted no later"
                )
            else:
                continue
            raise TraceError(source, job.line, "after_ok", rule)


def _job(row: dict[str, str], source: str, number: int, topology_levels: Sequence[str]) -> TraceJob:
    def bad(field: str, rule: str) -> TraceError:
        return TraceError(source, number, field, rule)

    def seconds(field: str, *, positive: bool, optional: bool = False) -> int:
        text = row.get(field, "")
        if text == "" and optional:
            return 0
        try:
            value = float(text)
        except ValueError:
            raise bad(field, f"must be a number of seconds, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            rule = "> 0" if positive else ">= 0"
            raise bad(field, f"must be {rule} seconds, got {text!r}")
        if value > MAX_DURATION_S and field != "submit_s":
            raise bad(field, f"must be at most {MAX_DURATION_S} seconds (366 days), got {text!r}")
        return round(value * 1000)

    def integer(field: str, low: int, high: int, default: int | None = None) -> int:
        text = row.get(field, "")
        if text == "" and default is not None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise bad(field, f"must be an integer, got {text!r}") from None
        if not low <= value <= high:
            raise bad(field, f"must be between {low} and {high}, got {value}")
        return value

    submit_ms = seconds("submit_s", positive=False)
    duration_ms = seconds("duration_s", positive=True)
    time_limit_ms = seconds("time_limit_s", positive=False, optional=True)
    checkpoint_ms = seconds("checkpoint_s", positive=True, optional=True)
    if row.get("checkpoint_s", "") and checkpoint_ms < MIN_CHECKPOINT_MS:
        raise bad("checkpoint_s", f"must be at least 1 second, got {row['checkpoint_s']!r}")
    members = integer("members", 1, MAX_REPLICAS)
    gpus = integer("gpus_per_member", 0, MAX_GPUS_PER_NODE)
    cpu = integer("cpu_milli", 1, 10_000_000, default=8_000 * gpus if gpus else 1_000)
    memory = integer("memory_mib", 1, 1 << 30, default=64 * 1024 * gpus if gpus else 1024)
    priority = integer("priority", -1_000_000, 1_000_000, default=0)
    user = row.get("user", "")
    if user and not USER_PATTERN.match(user):
        raise bad("user", f"must be 1 to 63 characters of a-z, 0-9, '.', '_' and '-', got {user!r}")
    queue = row["queue"]
    spec = JobSpec(
        name=row.get("name", "") or f"job-{number}",
        replicas=members,
        resources=Resources(cpu, memory, gpus),
        command=("trace",),
        priority=priority,
        topology_required=row.get("topology_required", ""),
        topology_preferred=row.get("topology_preferred", ""),
        time_limit_ms=time_limit_ms,
        queue=queue,
        priority_class=row.get("priority_class", ""),
        array=row.get("array", ""),
    )
    if not NAME_PATTERN.match(queue) or len(queue) > 63:
        raise bad(
            "queue",
            f"must be a queue name of 1 to 63 characters of a-z, 0-9 and '-', starting and "
            f"ending with a letter or digit, got {queue!r}",
        )
    violations = check_job_spec(spec, topology_levels)
    if violations:
        v = violations[0]
        field = _COLUMN_OF.get(v.field, v.field)
        raise bad(field, v.rule)
    after_ok = _after_ok(row.get("after_ok", ""), bad)
    return TraceJob(number, submit_ms, user, spec, duration_ms, after_ok, checkpoint_ms)


def _after_ok(text: str, bad: Callable[[str, str], TraceError]) -> tuple[int, ...]:
    """The line numbers of an ``after_ok`` cell (each once, in the order given)."""
    if not text:
        return ()
    lines: list[int] = []
    for item in (part.strip() for part in text.split(AFTER_OK_SEPARATOR)):
        if not item.isdigit() or int(item) < 1:
            raise bad(
                "after_ok",
                f"must be line numbers separated by {AFTER_OK_SEPARATOR!r} (e.g. 3;7), "
                f"got {text!r}",
            )
        lines.append(int(item))
    unique = tuple(dict.fromkeys(lines))
    if len(unique) > MAX_DEPENDENCIES:
        raise bad("after_ok", f"names at most {MAX_DEPENDENCIES} lines, got {len(unique)}")
    return unique


# The job spec's field names as trace columns, for messages.
_COLUMN_OF = {
    "name": "name",
    "replicas": "members",
    "resources.gpu": "gpus_per_member",
    "resources.cpu": "cpu_milli",
    "resources.memory": "memory_mib",
    "topology.required": "topology_required",
    "topology.preferred": "topology_preferred",
    "time_limit": "time_limit_s",
    "priority": "priority",
    "array": "array",
}


def write_trace(jobs: Iterable[TraceJob], out: io.TextIOBase | io.StringIO) -> int:
    """Write ``jobs`` in the trace format (every column); returns the number written.
    An ``after_ok`` names the lines of this output its jobs were written on (a line not
    among ``jobs`` is left out)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    listed = list(jobs)
    written_on = {j.line: number for number, j in enumerate(listed, start=2)}
    count = 0
    for j in listed:
        s = j.spec
        after = [str(written_on[line]) for line in j.after_ok if line in written_on]
        writer.writerow(
            (
                _seconds(j.submit_ms),
                s.queue,
                s.replicas,
                s.resources.gpu,
                _seconds(j.duration_ms),
                j.user,
                s.name,
                _seconds(s.time_limit_ms) if s.time_limit_ms else "",
                s.topology_required,
                s.topology_preferred,
                s.priority_class,
                s.priority,
                s.resources.cpu_milli,
                s.resources.memory_mib,
                s.array,
                AFTER_OK_SEPARATOR.join(after),
                _seconds(j.checkpoint_ms) if j.checkpoint_ms else "",
            )
        )
        count += 1
    return count


def _seconds(ms: int) -> str:
    return str(ms // 1000) if ms % 1000 == 0 else f"{ms / 1000:.3f}"


def openb_to_trace(folder: Path, limit: int | None = None) -> list[TraceJob]:
    """The Alibaba "openb" v2023 pod list as trace jobs.

    Conversion: each pod is a one-member job; ``num_gpu`` whole GPUs, and a pod that
    shares a GPU (``gpu_milli`` < 1000) gets one whole GPU, since GPU sharing is not
    modelled. The queue is the pod's QoS class in lower case (``ls``, ``be``,
    ``burstable``, ``guaranteed``), the only tenant-like column the trace has; the user is
    ``openb``. Submission is ``creation_time``; run time is ``deletion_time`` minus
    ``scheduled_time`` (or minus ``creation_time`` for pods never scheduled); pods with no
    run time are left out. CPU and memory are the pod's own.
    """
    jobs = []
    for pod in itertools.islice(openb_pods(folder), limit):
        row = pod.row
        spec = JobSpec(
            name=row["name"],
            replicas=1,
            resources=Resources(
                max(int(row["cpu_milli"]), 1), max(int(row["memory_mib"]), 1), pod.gpus
            ),
            command=("trace",),
            queue=(row["qos"] or "default").lower(),
        )
        jobs.append(TraceJob(pod.line, pod.created_s * 1000, "openb", spec, pod.duration_s * 1000))
    jobs.sort(key=lambda j: (j.submit_ms, j.line))
    return jobs
