"""How ``synctl`` shows things: one document per answer, rendered as a table, JSON or YAML.

Every command first turns the API's messages into plain documents (the ``*_document``
functions of :mod:`~synapse_ha.cli.render_jobs`, :mod:`~synapse_ha.cli.render_nodes`,
:mod:`~synapse_ha.cli.render_cluster`, :mod:`~synapse_ha.cli.render_queues` and
:mod:`~synapse_ha.cli.render_tokens`, each with its tables); ``-o json`` and ``-o yaml``
print those documents as they are (:func:`structured`), and ``-o table`` lays the same
documents out for people (:func:`table` and the quantities' texts here). Scripts should
use JSON.

JSON output is a stable interface (version 1): fields are only ever added, never renamed,
removed or retyped. Quantities are exact integers: CPU in millicores, memory in MiB,
durations and ages in milliseconds, times in milliseconds since the Unix epoch. Absent
values are ``null``.

A **job** (``status``, ``jobs`` → ``{"jobs": [...]}``)::

    id, name, state, reason, request_id       strings; state is PENDING, SCHEDULED,
                                              RUNNING, SUCCEEDED, FAILED or CANCELLED
    reason_code        str    the reason's machine-readable code (e.g. waiting_capacity,
                              requeued_node_dead, failed_exit)
    retries_used, requeues   int   attempts retried after failures; after disruptions
    image              str    container image ("" runs on the host)
    attempt            int    number of the current or last attempt (0: never bound)
    fencing_token      int | null   that attempt's token
    replicas, priority int
    resources          {gpu, cpu_milli, memory_mib}   per member
    topology           {required, preferred}          level names or ""
    time_limit_ms      int    0: none
    retries            {max, backoff_ms, max_backoff_ms}
    command            [str]  one string when shell is true
    shell              bool
    submitted_at_ms, finished_at_ms   int | null
    attempt_outcome    str    "" while the attempt is live
    members            [{rank, node, gpus: [int], state, exit_code: int | null}]
                       of the current or last attempt; state is bound, running or exited
    prestart           {command: [str] | null, shell, timeout_ms} | null
                       the pre-start check (null: none; command null when withheld)

A **node** (``nodes`` → ``{"nodes": [...]}``)::

    id, address, status, status_reason   status is ready, cordoned, draining or dead
    topology           {level: value}    e.g. {"zone": "z1", "block": "b1", "rack": "r1"}
    topology_path      str               e.g. "z1/b1/r1"
    capacity, allocated                  {gpu, cpu_milli, memory_mib}
    free_gpus          int
    allocated_gpus     [int]
    gpu_model          str
    registered_at_ms   int
    last_heartbeat_age_ms   int | null   null when the answering leader has not heard
                                         from the node since its election
    members_run_as     str               "owner" (each job's owner's account) or
                                         "agent:<user>"; "" when the node did not say
    member_isolation   str               "pid-namespace" (each member sees only its own
                                         processes) or "shared" (every member sees every
                                         process of the node); "" when the node did not say
    gpu_faults         [{gpu, code, detail, since_ms}]   unhealthy GPUs (free_gpus leaves
                                         them out); [] when all are healthy
    unfit              [{owner, detail, until_ms}]   owners the node may not run members
                                         of until until_ms (expired entries left out)
    conditions         [{name, message, since_ms}]   checks failing on the node (its
                                         health-check program: name "health-check");
                                         [] when all pass
    spare              bool              kept idle as a hot spare: out of normal
                                         placement, for member replacements
    draining_for       str|null          the job whose gang the node is held draining
                                         for (defragmentation); null when none, or read
                                         from a follower
    draining_until_ms  int|null          when that drain is estimated to complete

A job also has ``queue`` (str), ``priority_class`` (str, "" for a plain number) and
``preemption``: null, or ``{preempted_by, kind, deadline_ms}`` while its attempt is being
preempted (kind reclaim or priority; deadline_ms: when its members are killed), and
``progress``: null, or ``{timeout_ms, source}`` when its members are stopped as hung
after ``timeout_ms`` without progress (source file or log), ``checkpoint``: null, or
``{at_ms, step}``, the attempt's checkpoint mark (the oldest of its members' newest; step
null when none carried one), ``resume_step``: null, or the step the job's next attempt
resumes from, and each member ``checkpoint``: its newest mark, null before its first.

``explain``: ``{id, state, explanation, reason_code, reason, attempt, fencing_token,
members, queue, preemption, checkpoint, resume_step}`` (``reason_code`` is the
explanation's code) where each member also has ``rack``, ``topology`` and
``topology_path`` of its node.
``queues``: ``{queues: [{name, cohort, nominal: {gpu, cpu_milli, memory_mib} (null:
no quota), borrowing_limit_gpu, lending_limit_gpu (null: no limit), priority_classes,
min_runtime_ms, running_members_per_user, members_per_node_per_user (null: the cluster's
limits), default_time_limit_ms (0: none), learned_estimates, used: {gpu, cpu_milli,
memory_mib}, borrowed_gpu, lent_gpu, running_jobs, pending_jobs, pending_gpu,
preempting_jobs}], priority_classes: [{name, value, preempts,
grace_ms, min_runtime_ms}], preemption, reclaim_wait_max_ms}``. ``queue set``: ``{name,
created}``; ``queue delete``: ``{name, deleted}``.
``cluster``: ``{healthy, leader, leader_address, answered_by, nodes, jobs, pending_jobs,
running_jobs, replicas: [{id, role, term, commit_index, last_applied, leader, healthy,
grpc_address, raft_address, error, metrics_url, dashboard_url}]}`` (the two URLs are
empty for a replica that serves no metrics or dashboard).
``submit``: ``{id, request_id, created}`` (with ``--wait``/``--follow`` also ``state``).
``cancel``: ``{id, state, message}``. ``cordon``/``uncordon``/``drain``: ``{id, status}``.
``nodes repair``: ``{id, message, gpu_faults}`` (the faults left).

**Terminal safety.** Table output, notes and error lines print text the cluster, a job
or a node controls only through :func:`~synapse_ha.cli.terminal.terminal_safe`; JSON is
escaped by its encoder, YAML by PyYAML's emitter (see :mod:`synapse_ha.cli.terminal`).

An **error** (on stderr, with the command's exit code)::

    {"error": {code, message, ...}}
    code               str    the cluster's reason (INVALID_FIELD, JOB_NOT_FOUND, CONFLICT,
                              ...; see docs/errors.md), else synctl's own: UNREACHABLE,
                              INTERRUPTED, MEMBER_NOT_FOUND, NOT_STARTED; or the gRPC status
                              name when the cluster gave no reason
    message            str    the sentence that table output prints
    field, rule, violation    INVALID_FIELD: the first offending field, its rule, and the
                              kind of rule (required, unknown_field, wrong_type,
                              invalid_field); file and line for a spec file
    violations         [{field, rule, violation}]   every rule the cluster found broken
    status             str    the gRPC status code name, for errors from the cluster
    other keys                the reason's metadata (job_id, node_id, leader_address, ...)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from tabulate import tabulate  # type: ignore[import-untyped]

from synapse_ha.cli.terminal import terminal_safe
from synapse_ha.core.model import Resources
from synapse_ha.rpc import readable
from synapse_ha.rpc.readable import cpu_text as cpu_text
from synapse_ha.rpc.readable import memory_text as memory_text

OUTPUT_FORMATS = ("table", "json", "yaml")

Document = dict[str, Any]


# ----------------------------------------------------------------------- documents


def resources_document(r: Resources) -> Document:
    return {"gpu": r.gpu, "cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib}


def to_json(document: object) -> str:
    return json.dumps(document, indent=2, sort_keys=False)


def to_yaml(document: object) -> str:
    text: str = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    return text.rstrip("\n")


def error_document(code: str, message: str, **fields: object) -> Document:
    """``{"error": {"code", "message", ...fields}}`` (see the module docstring)."""
    return {"error": {"code": code, "message": message, **fields}}


def structured(document: object, output: str) -> str:
    """The JSON or YAML text of a document."""
    if output == "json":
        return to_json(document)
    if output == "yaml":
        return to_yaml(document)
    raise ValueError(f"not a structured output format: {output!r}")


# ---------------------------------------------------------------------- formatting


def cell_text(value: object) -> str:
    """A table cell: ``-`` for nothing, else the value made terminal-safe."""
    return "-" if value is None or value == "" else terminal_safe(str(value))


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    text: str = tabulate(
        [[cell_text(cell) for cell in row] for row in rows],
        headers=list(headers),
        tablefmt="plain",
        disable_numparse=True,
    )
    return text


def resources_text(r: Mapping[str, int]) -> str:
    return f"{r['gpu']} GPU, {cpu_text(r['cpu_milli'])} CPU, {memory_text(r['memory_mib'])}"


def duration_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 10:
        return f"{seconds:.1f}s"
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def time_text(ms: int | None) -> str:
    """``2026-11-28 22:39:20 CET``: the local time (see :mod:`~synapse_ha.rpc.readable`)."""
    return readable.local_time(ms)


def age_text(since_ms: int | None, now_ms: int) -> str:
    return "-" if not since_ms else duration_text(max(0, now_ms - since_ms))
