"""How ``synctl`` shows things: one document per answer, rendered as a table, JSON or YAML.

Every command first turns the API's messages into plain documents (the ``*_document``
functions below); ``-o json`` and ``-o yaml`` print those documents as they are, and
``-o table`` lays the same documents out for people. Scripts should use JSON.

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

A job also has ``queue`` (str), ``priority_class`` (str, "" for a plain number) and
``preemption``: null, or ``{preempted_by, kind, deadline_ms}`` while its attempt is being
preempted (kind reclaim or priority; deadline_ms: when its members are killed).

``explain``: ``{id, state, explanation, reason_code, reason, attempt, fencing_token,
members, queue, preemption}`` (``reason_code`` is the explanation's code) where
each member also has ``rack``, ``topology`` and ``topology_path`` of its node.
``queues``: ``{queues: [{name, cohort, nominal: {gpu, cpu_milli, memory_mib} (null:
no quota), borrowing_limit_gpu, lending_limit_gpu (null: no limit), priority_classes,
used: {gpu, cpu_milli, memory_mib}, borrowed_gpu, lent_gpu, running_jobs, pending_jobs,
pending_gpu, preempting_jobs}], priority_classes: [{name, value, preempts, grace_ms}],
preemption}``. ``queue set``: ``{name, created}``; ``queue delete``: ``{name, deleted}``.
``cluster``: ``{healthy, leader, leader_address, answered_by, nodes, jobs, pending_jobs,
running_jobs, replicas: [{id, role, term, commit_index, last_applied, leader, healthy,
grpc_address, raft_address, error, metrics_url, dashboard_url}]}`` (the two URLs are
empty for a replica that serves no metrics or dashboard).
``submit``: ``{id, request_id, created}`` (with ``--wait``/``--follow`` also ``state``).
``cancel``: ``{id, state, message}``. ``cordon``/``uncordon``/``drain``: ``{id, status}``.

**Terminal safety.** Table output, notes and error lines show text the cluster, a job or
a node controls (reasons, explanations, event details, node addresses, ...). Every
such string goes through :func:`terminal_safe` before it is printed: control characters
(C0 and C1, ESC, DEL, carriage return, backspace), Unicode line separators and
bidirectional controls are written as visible escapes (``\x1b``, ``\r``, ``\u202e``), so
a job cannot retitle, clear or rewrite the operator's terminal, nor hide or reorder text.
JSON is escaped by its encoder, YAML by PyYAML's emitter (``allow_unicode`` off: every
non-printable and non-ASCII character is written as an escape).

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
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml
from tabulate import tabulate  # type: ignore[import-untyped]

from synapse_ha.core.model import DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

OUTPUT_FORMATS = ("table", "json", "yaml")

Document = dict[str, Any]


# ----------------------------------------------------------------------- documents


def resources_document(r: pb.Resources) -> Document:
    return {"gpu": r.gpu, "cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib}


def member_document(m: pb.Member) -> Document:
    return {
        "rank": m.rank,
        "node": m.node_id,
        "gpus": list(m.gpus),
        "state": m.state,
        "exit_code": m.exit_code if m.has_exit_code else None,
    }


def job_document(job: pb.Job) -> Document:
    spec = job.spec
    has_attempt = job.HasField("attempt")
    command: list[str] | None
    if job.redacted:  # another user's job: the cluster withheld command and environment
        command, shell = None, spec.WhichOneof("command") != "argv"
    elif spec.WhichOneof("command") == "argv":
        command, shell = list(spec.argv.args), False
    else:
        command, shell = [spec.shell_command], True
    return {
        "id": job.job_id,
        "name": spec.name,
        "state": job.state,
        "reason": job.reason,
        "reason_code": job.reason_code,
        "retries_used": job.retries_used,
        "requeues": job.requeues,
        "image": spec.image,
        "request_id": job.request_id,
        "owner": job.owner,
        "cancelled_by": job.cancelled_by,
        "redacted": job.redacted,
        "attempt": job.attempt.number if has_attempt else 0,
        "fencing_token": job.attempt.fencing_token if has_attempt else None,
        "replicas": spec.replicas,
        "priority": spec.priority,
        "resources": resources_document(spec.resources),
        "topology": {"required": spec.topology_required, "preferred": spec.topology_preferred},
        "time_limit_ms": spec.time_limit_ms,
        "retries": {
            "max": spec.retries.max,
            "backoff_ms": spec.retries.backoff_ms,
            "max_backoff_ms": spec.retries.max_backoff_ms,
        },
        "command": command,
        "shell": shell,
        "submitted_at_ms": job.submitted_at_ms or None,
        "finished_at_ms": job.finished_at_ms or None,
        "attempt_outcome": job.attempt.outcome if has_attempt else "",
        "members": [member_document(m) for m in job.attempt.members] if has_attempt else [],
        "queue": spec.queue or "default",
        "priority_class": spec.priority_class,
        "preemption": preemption_document(job.attempt) if has_attempt else None,
    }


def ordered_levels(labels: Iterable[str]) -> list[str]:
    """Topology levels from the outermost down: the default levels in their order, then
    any others alphabetically."""
    present = set(labels)
    known = [level for level in DEFAULT_TOPOLOGY_LEVELS if level in present]
    return known + sorted(present - set(known))


def topology_document(labels: Iterable[pb.TopologyLabel]) -> dict[str, str]:
    by_level = {label.level: label.value for label in labels}
    return {level: by_level[level] for level in ordered_levels(by_level)}


def topology_path(topology: Mapping[str, str]) -> str:
    return "/".join(topology.values()) or "-"


def node_document(node: pb.Node) -> Document:
    topology = topology_document(node.topology)
    return {
        "id": node.node_id,
        "address": node.address,
        "status": node.status,
        "status_reason": node.status_reason,
        "topology": topology,
        "topology_path": topology_path(topology),
        "capacity": resources_document(node.capacity),
        "allocated": resources_document(node.allocated),
        "free_gpus": node.capacity.gpu - len(node.allocated_gpus),
        "allocated_gpus": list(node.allocated_gpus),
        "gpu_model": node.gpu_model,
        "registered_at_ms": node.registered_at_ms,
        "last_heartbeat_age_ms": (
            node.last_heartbeat_age_ms if node.last_heartbeat_age_ms >= 0 else None
        ),
        "members_run_as": node.members_run_as,
    }


def explain_document(
    answer: pb.ExplainJobResponse, job: pb.Job, nodes: Sequence[pb.Node]
) -> Document:
    job_doc = job_document(job)
    by_id = {n.node_id: topology_document(n.topology) for n in nodes}
    members = []
    for member in job_doc["members"]:
        topology = by_id.get(member["node"], {})
        members.append(
            {
                **member,
                "rack": topology.get("rack", ""),
                "topology": topology,
                "topology_path": topology_path(topology),
            }
        )
    return {
        "id": answer.job_id,
        "state": answer.state,
        "explanation": answer.explanation,
        "reason_code": answer.reason_code,
        "reason": job.reason,
        "attempt": job_doc["attempt"],
        "fencing_token": job_doc["fencing_token"],
        "members": members,
        "queue": job_doc["queue"],
        "preemption": job_doc["preemption"],
    }


def cluster_document(status: pb.GetClusterStatusResponse) -> Document:
    replicas = [
        {
            "id": r.replica_id,
            "role": r.role,
            "term": r.term,
            "commit_index": r.commit_index,
            "last_applied": r.last_applied,
            "leader": r.leader_id,
            "healthy": r.healthy,
            "grpc_address": r.grpc_address,
            "raft_address": r.raft_address,
            "error": r.error,
            "format_version": r.format_version,
            # Observability
            "metrics_url": r.metrics_url,
            "dashboard_url": r.dashboard_url,
        }
        for r in status.replicas
    ]
    healthy_count = sum(1 for r in replicas if r["healthy"])
    return {
        "healthy": bool(status.leader_id) and healthy_count > len(replicas) // 2,
        "leader": status.leader_id,
        "leader_address": status.leader_address,
        "answered_by": status.answered_by,
        "nodes": status.nodes,
        "jobs": status.jobs,
        "pending_jobs": status.pending_jobs,
        "running_jobs": status.running_jobs,
        "replicas": replicas,
    }


# ---------------------------------------------------------------------- formatting

# What a terminal may act on instead of showing: C0 controls (ESC, CR, BS, BEL among
# them), DEL and C1 controls (CSI, OSC, NEL as single code points), the Unicode line and
# paragraph separators, and the bidirectional controls that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b"}
# ``keep`` for :func:`terminal_safe`
MULTILINE = "\n"  # text whose lines are the cluster's layout (an explanation, a table)
LOG_LINE = "\t"  # a line of a member's output: tabs only move the cursor forward


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str, keep: str = "") -> str:
    """``text`` as it may be printed on a terminal: every character :data:`_UNSAFE`
    names is written as a visible escape (``\\x1b``, ``\\r``, ``\\b``, ``\\u202e``),
    except those in ``keep`` (:data:`MULTILINE`, :data:`LOG_LINE`). The one rule for all
    of synctl's table and text output; idempotent (escapes are printable)."""
    if not _UNSAFE.search(text):
        return text
    if keep:
        return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _UNSAFE.sub(_escape, text)


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else terminal_safe(str(value))


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


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    text: str = tabulate(
        [[_cell(cell) for cell in row] for row in rows],
        headers=list(headers),
        tablefmt="plain",
        disable_numparse=True,
    )
    return text


def cpu_text(milli: int) -> str:
    return f"{milli / 1000:g}"


def memory_text(mib: int) -> str:
    if mib == 0:
        return "0"
    for unit, size in (("Ti", 1024 * 1024), ("Gi", 1024)):
        if mib >= size and mib % size == 0:
            return f"{mib // size}{unit}"
    if mib >= 1024:
        return f"{mib / 1024:.1f}Gi"
    return f"{mib}Mi"


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
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ms / 1000))


def age_text(since_ms: int | None, now_ms: int) -> str:
    return "-" if not since_ms else duration_text(max(0, now_ms - since_ms))


def _short(text: str, width: int) -> str:
    """The first line of ``text``, escaped (:func:`terminal_safe`), cut to ``width``.
    Only a newline ends the line: a carriage return or a separator is shown escaped, not
    obeyed, so it cannot hide what follows it."""
    line = terminal_safe(text.split("\n", 1)[0])
    return line if len(line) <= width else line[: width - 3] + "..."


def members_table(members: Sequence[Mapping[str, Any]], with_topology: bool = False) -> str:
    headers = ["RANK", "NODE", "GPUS", "STATE", "EXIT"]
    if with_topology:
        headers[3:3] = ["RACK", "TOPOLOGY"]
    rows = []
    for m in members:
        row: list[object] = [
            m["rank"],
            m["node"],
            ",".join(map(str, m["gpus"])),
            m["state"],
            m["exit_code"],
        ]
        if with_topology:
            row[3:3] = [m["rack"], m["topology_path"]]
        rows.append(row)
    return table(rows, headers)


def job_table(doc: Mapping[str, Any], now_ms: int) -> str:
    topology = ", ".join(f"{k}: {v}" for k, v in doc["topology"].items() if v)
    fields: list[tuple[str, object]] = [
        ("ID", doc["id"]),
        ("NAME", doc["name"]),
        ("OWNER", doc["owner"]),
        ("STATE", doc["state"]),
        ("REASON", doc["reason"]),
        ("ATTEMPT", doc["attempt"] or None),
        ("FENCING TOKEN", doc["fencing_token"]),
        ("REPLICAS", doc["replicas"]),
        ("RESOURCES", f"{resources_text(doc['resources'])} per member"),
        ("QUEUE", doc["queue"]),
        ("PRIORITY", doc["priority_class"] or doc["priority"]),
        ("PREEMPTED", preemption_text(doc["preemption"])),
        ("TOPOLOGY", topology),
        ("TIME LIMIT", duration_text(doc["time_limit_ms"]) if doc["time_limit_ms"] else None),
        (
            "SUBMITTED",
            f"{time_text(doc['submitted_at_ms'])} ({age_text(doc['submitted_at_ms'], now_ms)} ago)",
        ),
        ("FINISHED", time_text(doc["finished_at_ms"]) if doc["finished_at_ms"] else None),
        ("CANCELLED BY", doc["cancelled_by"] or None),
        ("REQUEST ID", doc["request_id"]),
    ]
    if doc["redacted"]:
        fields.append(("COMMAND", "(withheld: not your job)"))
    lines = [f"{name + ':':<15}{_cell(value)}" for name, value in fields]
    if doc["members"]:
        lines += ["", members_table(doc["members"])]
    return "\n".join(lines)


def jobs_table(docs: Sequence[Mapping[str, Any]], now_ms: int) -> str:
    rows = [
        [
            d["id"],
            d["name"],
            d["state"],
            d["replicas"],
            d["resources"]["gpu"],
            d["attempt"] or None,
            age_text(d["submitted_at_ms"], now_ms),
            _short(d["reason"], 60),
        ]
        for d in docs
    ]
    return table(rows, ["ID", "NAME", "STATE", "MEMBERS", "GPU/MEMBER", "ATTEMPT", "AGE", "REASON"])


def nodes_table(docs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            d["id"],
            d["status"],
            d["topology_path"],
            f"{d['free_gpus']}/{d['capacity']['gpu']}",
            f"{cpu_text(d['allocated']['cpu_milli'])}/{cpu_text(d['capacity']['cpu_milli'])}",
            f"{memory_text(d['allocated']['memory_mib'])}/"
            f"{memory_text(d['capacity']['memory_mib'])}",
            duration_text(d["last_heartbeat_age_ms"]) + " ago"
            if d["last_heartbeat_age_ms"] is not None
            else None,
            d["address"],
            d["members_run_as"] or None,
        ]
        for d in docs
    ]
    headers = ["NODE", "STATUS", "TOPOLOGY", "FREE GPU", "CPU USED", "MEMORY USED"]
    return table(rows, [*headers, "HEARTBEAT", "ADDRESS", "RUNS AS"])


def explain_table(doc: Mapping[str, Any]) -> str:
    lines = [terminal_safe(f"job {doc['id']} is {doc['state']}")]
    if doc["attempt"]:
        lines[0] += f", attempt {doc['attempt']} (fencing token {doc['fencing_token']})"
    if doc["state"] == "PENDING" or not doc["members"]:
        lines.append(terminal_safe(doc["explanation"], keep=MULTILINE))
    elif doc["reason"] and doc["state"] not in ("SCHEDULED", "RUNNING"):
        lines.append(terminal_safe(doc["reason"]))
    preempted = preemption_text(doc["preemption"])
    if preempted:
        lines.append(terminal_safe(preempted))
    if doc["members"]:
        lines += ["", members_table(doc["members"], with_topology=True)]
    return "\n".join(lines)


def cluster_table(doc: Mapping[str, Any]) -> str:
    leader = doc["leader"] or "none"
    if doc["leader_address"]:
        leader += f" ({doc['leader_address']})"
    head = [
        f"health:  {'healthy' if doc['healthy'] else 'UNHEALTHY'}",
        f"leader:  {terminal_safe(leader)}",
        f"nodes:   {doc['nodes']}    jobs: {doc['jobs']} "
        f"({doc['pending_jobs']} pending, {doc['running_jobs']} running)",
        "",
    ]
    rows = [
        [
            r["id"],
            r["role"],
            r["term"],
            r["commit_index"],
            r["last_applied"],
            "yes" if r["healthy"] else "no",
            r["grpc_address"],
            r["metrics_url"] or "-",
            r["dashboard_url"] or "-",
            r["error"],
        ]
        for r in doc["replicas"]
    ]
    headers = ["REPLICA", "ROLE", "TERM", "COMMIT", "APPLIED", "HEALTHY", "ADDRESS"]
    headers += ["METRICS", "DASHBOARD", "ERROR"]
    return "\n".join(head) + table(rows, headers)


# ------------------------------------------------------------------------- tokens


def created_token_document(answer: pb.CreateTokenResponse, user: str, role: str) -> Document:
    return {
        "id": answer.token_id,
        "token": answer.token,
        "user": user,
        "role": role,
        "expires_at_ms": answer.expires_at_ms or None,
    }


def token_document(token: pb.TokenInfo) -> Document:
    return {
        "id": token.token_id,
        "user": token.user,
        "role": token.role,
        "queues": list(token.queues),
        "created_at_ms": token.created_at_ms or None,
        "created_by": token.created_by,
        "expires_at_ms": token.expires_at_ms or None,
        "revoked_at_ms": token.revoked_at_ms or None,
        "revoked_by": token.revoked_by,
        "priority_classes": list(token.priority_classes),
        "max_priority": token.max_priority,
    }


def tokens_table(docs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            d["id"],
            d["user"],
            d["role"],
            ",".join(d["queues"]) or "-",
            _allowance(d),
            d["created_by"],
            time_text(d["expires_at_ms"]) if d["expires_at_ms"] else "never",
            f"revoked by {d['revoked_by'] or '?'}" if d["revoked_at_ms"] else "live",
        )
        for d in docs
    ]
    headers = ("ID", "USER", "ROLE", "QUEUES", "PRIORITY", "CREATED BY", "EXPIRES", "STATE")
    return table(rows, headers)


def _allowance(d: Mapping[str, Any]) -> str:
    """What a token allows beyond the queues' own priority rules: ``high; up to 50``."""
    parts = [",".join(d["priority_classes"])] if d["priority_classes"] else []
    if d["max_priority"] > 0:
        parts.append(f"up to {d['max_priority']}")
    return "; ".join(parts) or "-"


# ------------------------------------------------------- queues and preemption


def preemption_document(attempt: pb.Attempt) -> Document | None:
    if not attempt.preempted_by:
        return None
    return {
        "preempted_by": attempt.preempted_by,
        "kind": attempt.preemption,
        "deadline_ms": attempt.preempt_deadline_ms or None,
    }


def preemption_text(doc: Mapping[str, Any] | None) -> str | None:
    """``preempted by job 42 (reclaim); members are killed at 12:00:03``."""
    if not doc:
        return None
    text = f"being preempted by job {doc['preempted_by']} ({doc['kind']})"
    if doc["deadline_ms"]:
        text += f"; its members are killed at {time_text(doc['deadline_ms'])} unless they exit"
    return text


def _optional(msg: Any, name: str) -> int | None:
    return int(getattr(msg, name)) if msg.HasField(name) else None


def queue_document(status: pb.QueueStatus) -> Document:
    q, u = status.queue, status.usage
    has_quota = any(q.HasField(n) for n in ("gpu", "cpu_milli", "memory_mib"))
    return {
        "name": q.name,
        "cohort": q.cohort,
        "nominal": {
            "gpu": _optional(q, "gpu"),
            "cpu_milli": _optional(q, "cpu_milli"),
            "memory_mib": _optional(q, "memory_mib"),
        }
        if has_quota
        else None,
        "borrowing_limit_gpu": _optional(q, "borrowing_limit_gpu"),
        "lending_limit_gpu": _optional(q, "lending_limit_gpu"),
        "priority_classes": list(q.priority_classes),
        "used": {"gpu": u.used_gpu, "cpu_milli": u.used_cpu_milli, "memory_mib": u.used_memory_mib},
        "borrowed_gpu": u.borrowed_gpu,
        "lent_gpu": u.lent_gpu,
        "running_jobs": u.running_jobs,
        "pending_jobs": u.pending_jobs,
        "pending_gpu": u.pending_gpu,
        "preempting_jobs": u.preempting_jobs,
    }


def queues_document(answer: pb.ListQueuesResponse) -> Document:
    return {
        "queues": [queue_document(q) for q in answer.queues],
        "priority_classes": [
            {"name": c.name, "value": c.value, "preempts": c.preempts, "grace_ms": c.grace_ms}
            for c in answer.priority_classes
        ],
        "preemption": answer.preemption,
    }


def _limit(value: int | None) -> str:
    return "any" if value is None else str(value)


def queues_table(doc: Mapping[str, Any]) -> str:
    """One row per queue (GPUs), then the priority classes and the preemption mode."""
    rows = []
    for q in doc["queues"]:
        nominal = q["nominal"]["gpu"] if q["nominal"] else None
        rows.append(
            [
                q["name"],
                q["cohort"] or "-",
                "-" if nominal is None else nominal,
                q["used"]["gpu"],
                q["borrowed_gpu"],
                q["lent_gpu"],
                _limit(q["borrowing_limit_gpu"]) if nominal is not None else "-",
                _limit(q["lending_limit_gpu"]) if nominal is not None else "-",
                f"{q['running_jobs']}"
                + (f" ({q['preempting_jobs']} preempting)" if q["preempting_jobs"] else ""),
                f"{q['pending_jobs']} ({q['pending_gpu']} GPU)",
                ",".join(q["priority_classes"]) or "any",
            ]
        )
    headers = ["QUEUE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "MAY BORROW"]
    out = table(rows, [*headers, "MAY LEND", "RUNNING", "PENDING", "CLASSES"])
    classes = ", ".join(
        f"{c['name']} {c['value']}{' (preempts)' if c['preempts'] else ''}"
        f" grace {duration_text(c['grace_ms'])}"
        for c in doc["priority_classes"]
    )
    tail = f"priority classes: {classes or 'none'}\npreemption: {doc['preemption']}"
    return f"{out}\n\n{terminal_safe(tail, keep=MULTILINE)}"
