"""synctl's job documents (``synctl status``, ``jobs``, ``explain``) and their tables
(see :mod:`synapse_ha.cli.render` for the fields)."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from synapse_ha.cli.render import (
    Document,
    age_text,
    cell_text,
    duration_text,
    resources_document,
    resources_text,
    table,
    time_text,
)
from synapse_ha.cli.render_nodes import topology_document, topology_path
from synapse_ha.cli.terminal import MULTILINE, terminal_safe
from synapse_ha.client.jobs import AttemptView, Checkpoint, Explained, JobView, MemberView
from synapse_ha.client.nodes import NodeView
from synapse_ha.core.health.progress import SOURCE_LOG
from synapse_ha.core.model import JobSpec, JobState
from synapse_ha.core.node_selector import NodeSelector, describe
from synapse_ha.core.replacement import ReplacePolicy
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.core.workflows.windows import resolved
from synapse_ha.rpc.readable import (
    clock,
    iso,
    job_durations,
    relative,
    short_time,
    with_iso,
)


def member_document(m: MemberView) -> Document:
    return {
        "rank": m.rank,
        "node": m.node_id,
        "gpus": list(m.gpus),
        "state": m.state,
        "exit_code": m.exit_code,
        "checkpoint": checkpoint_document(m.checkpoint) if m.checkpoint else None,
        "generation": m.generation,
        "lost": m.lost,
    }


def checkpoint_document(mark: Checkpoint) -> Document:
    """A checkpoint mark: ``{at_ms, step}`` (step null when the mark carried none)."""
    return {"at_ms": mark.at_ms, "step": mark.step}


def checkpoint_text(doc: Mapping[str, Any] | None, now_ms: int) -> str | None:
    """``step 1200, 3m ago`` (or ``3m ago, no step``)."""
    if not doc:
        return None
    ago = f"{age_text(doc['at_ms'], now_ms)} ago"
    return f"{ago}, no step" if doc["step"] is None else f"step {doc['step']}, {ago}"


def job_document(job: JobView, now_ms: int | None = None) -> Document:
    """The job as ``synctl`` shows it; its durations (wait, elapsed, time left) as of
    ``now_ms`` (null without it)."""
    spec, attempt = job.spec, job.attempt
    # Another user's job: the cluster withheld command and environment.
    command = None if job.redacted else list(spec.command)
    doc = {
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
        "attempt": attempt.number if attempt else 0,
        "fencing_token": attempt.fencing_token if attempt else None,
        "replicas": spec.replicas,
        "priority": spec.priority,
        "resources": resources_document(spec.resources),
        "topology": {"required": spec.topology_required, "preferred": spec.topology_preferred},
        "time_limit_ms": spec.time_limit_ms,
        "retries": {
            "max": spec.retries.max_retries,
            "backoff_ms": spec.retries.backoff_ms,
            "max_backoff_ms": spec.retries.max_backoff_ms,
        },
        "command": command,
        "shell": spec.shell,
        "submitted_at_ms": job.submitted_at_ms or None,
        "finished_at_ms": job.finished_at_ms or None,
        "attempt_outcome": attempt.outcome if attempt else "",
        "members": [member_document(m) for m in attempt.members] if attempt else [],
        "queue": spec.queue or "default",
        "priority_class": spec.priority_class,
        "preemption": preemption_document(attempt) if attempt else None,
        "progress": {"timeout_ms": spec.progress.timeout_ms, "source": spec.progress.source}
        if spec.progress
        else None,
        "prestart": prestart_document(spec, job.redacted),
        "dependencies": dependencies_document(spec.dependencies) if spec.dependencies else None,
        "waiting_for": dependencies_document(job.waiting_for),
        "begin_ms": resolved(spec.begin_at_ms, spec.begin_delay_ms, job.submitted_at_ms) or None,
        "deadline_ms": resolved(spec.deadline_at_ms, spec.deadline_delay_ms, job.submitted_at_ms)
        or None,
        "checkpoint": checkpoint_document(attempt.checkpoint)
        if attempt and attempt.checkpoint
        else None,
        "resume_step": job.resume_step,
        "stop_grace_ms": spec.stop_grace_ms,
        "account": spec.account,
        "nodes": nodes_document(spec.nodes) if spec.nodes is not None else None,
        "on_node_failure": replace_document(spec.replace),
        "elastic": {
            "min": spec.elastic.min_replicas,
            "max": spec.replicas,
            "signal": spec.elastic.signal,
        }
        if spec.elastic is not None
        else None,
    }
    return {**with_iso(doc, *_TIMES), **times_document(job, now_ms)}


_TIMES = ("submitted_at_ms", "finished_at_ms")


def replace_document(policy: ReplacePolicy | None) -> Document:
    """``{policy, timeout_ms, signal}``: what a lost member costs the gang (requeue: the
    whole gang; replace: that member, placed again)."""
    if policy is None:
        return {"policy": "requeue", "timeout_ms": None, "signal": None}
    return {"policy": "replace", "timeout_ms": policy.timeout_ms, "signal": policy.signal}


def replace_text(doc: Mapping[str, Any]) -> str | None:
    """``replace (within 5m, then requeue; members told with SIGUSR1)``; None for requeue."""
    if doc["policy"] != "replace":
        return None
    told = f"members told with {doc['signal']}" if doc["signal"] else "members not signalled"
    return f"replace (within {duration_text(doc['timeout_ms'])}, then requeue; {told})"


def nodes_document(nodes: NodeSelector) -> Document:
    """``{features, gpu_model, names, exclude}``: where the job's members may run."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(nodes).items()}


def times_document(job: JobView, now_ms: int | None) -> Document:
    """``{started_at_ms, started_at, wait_ms, elapsed_ms, time_left_ms}``: when the
    current or last attempt started (its members running, else its bind), and the job's
    durations as of ``now_ms`` (see :func:`~synapse_ha.rpc.readable.job_durations`).
    A job waiting again after an attempt ended waits since its submission."""
    attempt = job.attempt
    started = (attempt.started_at_ms or attempt.bound_at_ms) if attempt else 0
    ended = (attempt.ended_at_ms or job.finished_at_ms) if attempt else job.finished_at_ms
    if job.state == JobState.PENDING:
        started = ended = 0
    doc: Document = {"started_at_ms": started or None, "started_at": iso(started)}
    if now_ms is None:
        return {**doc, "wait_ms": None, "elapsed_ms": None, "time_left_ms": None}
    durations = job_durations(
        submitted_ms=job.submitted_at_ms or None,
        started_ms=started or None,
        ended_ms=ended or None,
        time_limit_ms=job.spec.time_limit_ms,
        now_ms=now_ms,
    )
    return {**doc, **durations}


_KINDS = (("afterok", "after_ok"), ("afterany", "after_any"), ("afternotok", "after_not_ok"))


def dependencies_document(deps: Dependencies) -> dict[str, list[str]]:
    """``{afterok: [...], afterany: [...], afternotok: [...], after: [...]}``: the kinds
    with at least one job, as the job spec names them."""
    by_kind = {name: list(getattr(deps, field)) for name, field in (*_KINDS, ("after", "after"))}
    return {name: ids for name, ids in by_kind.items() if ids}


def dependencies_text(doc: Mapping[str, list[str]] | None) -> str | None:
    """``afterok job-000012, job-000013; after job-000014``."""
    if not doc:
        return None
    return "; ".join(f"{kind} {', '.join(ids)}" for kind, ids in doc.items())


def progress_text(doc: Mapping[str, Any] | None) -> str | None:
    """``30m without a touch of $SYNAPSE_PROGRESS_FILE`` (or ``of output``)."""
    if not doc:
        return None
    what = "output" if doc["source"] == SOURCE_LOG else "a touch of $SYNAPSE_PROGRESS_FILE"
    return f"{duration_text(doc['timeout_ms'])} without {what}"


def prestart_document(spec: JobSpec, redacted: bool) -> Document | None:
    """The job's pre-start check (null: none); its command is null when withheld."""
    p = spec.prestart
    if p is None:
        return None
    return {
        "command": None if redacted else list(p.command),
        "shell": p.shell,
        "timeout_ms": p.timeout_ms,
    }


def prestart_text(doc: Mapping[str, Any] | None) -> str | None:
    """``nvidia-smi -L (timeout 1m)``."""
    if not doc:
        return None
    command = "(withheld)" if doc["command"] is None else shlex.join(doc["command"])
    if doc["shell"] and doc["command"]:
        command = doc["command"][0]
    return f"{command} (timeout {duration_text(doc['timeout_ms'])})"


def preemption_document(attempt: AttemptView) -> Document | None:
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


def explain_document(answer: Explained, job: JobView, nodes: Sequence[NodeView]) -> Document:
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
        "checkpoint": job_doc["checkpoint"],
        "resume_step": job_doc["resume_step"],
    }


def members_table(
    members: Sequence[Mapping[str, Any]], now_ms: int, with_topology: bool = False
) -> str:
    """The members, with each one's newest checkpoint mark once one of them has marked."""
    headers = ["RANK", "NODE", "GPUS", "STATE", "EXIT"]
    replaced = any(m.get("generation") for m in members)
    if replaced:
        headers.insert(1, "GEN")
    if with_topology:
        headers[3:3] = ["RACK", "TOPOLOGY"]
    marked = any(m["checkpoint"] for m in members)
    if marked:
        headers.append("CHECKPOINT")
    rows = []
    for m in members:
        row: list[object] = [
            m["rank"],
            m["node"],
            ",".join(map(str, m["gpus"])),
            "lost" if m.get("lost") else m["state"],
            m["exit_code"],
        ]
        if replaced:
            row.insert(1, m["generation"])
        if with_topology:
            row[3:3] = [m["rack"], m["topology_path"]]
        if marked:
            row.append(checkpoint_text(m["checkpoint"], now_ms))
        rows.append(row)
    return table(rows, headers)


def replicas_text(doc: Mapping[str, Any]) -> object:
    """``4``, or of an elastic gang ``2 to 4, elastic (3 now)``."""
    elastic = doc.get("elastic")
    if not elastic:
        return doc["replicas"]
    text = f"{elastic['min']} to {elastic['max']}, elastic"
    if doc["members"]:
        text += f" ({len(doc['members'])} now)"
    return text


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
        ("REPLICAS", replicas_text(doc)),
        ("RESOURCES", f"{resources_text(doc['resources'])} per member"),
        ("QUEUE", doc["queue"]),
        ("ACCOUNT", doc["account"] or None),
        ("PRIORITY", doc["priority_class"] or doc["priority"]),
        ("PREEMPTED", preemption_text(doc["preemption"])),
        ("TOPOLOGY", topology),
        ("NODES", describe(NodeSelector(**doc["nodes"])) if doc["nodes"] else None),
        ("ON NODE FAIL", replace_text(doc["on_node_failure"])),
        ("TIME LIMIT", duration_text(doc["time_limit_ms"]) if doc["time_limit_ms"] else None),
        ("STOP GRACE", duration_text(doc["stop_grace_ms"]) if doc["stop_grace_ms"] else None),
        ("HANG AFTER", progress_text(doc["progress"])),
        ("PRESTART", prestart_text(doc["prestart"])),
        ("CHECKPOINT", checkpoint_text(doc["checkpoint"], now_ms)),
        ("RESUME STEP", doc["resume_step"]),
        ("DEPENDS ON", dependencies_text(doc["dependencies"])),
        ("WAITING FOR", dependencies_text(doc["waiting_for"])),
        ("BEGIN", time_text(doc["begin_ms"]) if doc["begin_ms"] else None),
        ("DEADLINE", time_text(doc["deadline_ms"]) if doc["deadline_ms"] else None),
        *times_fields(doc, now_ms),
        ("CANCELLED BY", doc["cancelled_by"] or None),
        ("REQUEST ID", doc["request_id"]),
    ]
    if doc["redacted"]:
        fields.append(("COMMAND", "(withheld: not your job)"))
    lines = [f"{name + ':':<15}{cell_text(value)}" for name, value in fields]
    if doc["members"]:
        lines += ["", members_table(doc["members"], now_ms)]
    return "\n".join(lines)


def times_fields(doc: Mapping[str, Any], now_ms: int) -> list[tuple[str, object]]:
    """The job's times for ``synctl status``: local times with how long ago, the wait in
    the queue, the elapsed run time and what its time limit leaves."""
    limit = doc["time_limit_ms"]
    left = doc["time_left_ms"]
    waiting = doc["state"] == JobState.PENDING
    fields: list[tuple[str, object]] = [
        ("SUBMITTED", _when(doc["submitted_at_ms"], now_ms)),
        ("STARTED", _when(doc["started_at_ms"], now_ms) if doc["started_at_ms"] else None),
        ("FINISHED", _when(doc["finished_at_ms"], now_ms) if doc["finished_at_ms"] else None),
        ("WAITING" if waiting else "WAITED", _clock_or_none(doc["wait_ms"])),
        ("ELAPSED", _clock_or_none(doc["elapsed_ms"])),
    ]
    if left is not None:
        fields.append(("TIME LEFT", f"{clock(left)} of {clock(limit)}"))
    return fields


def _when(ms: int | None, now_ms: int) -> str | None:
    """``2026-11-28 22:39:20 CET (8m47s ago)``."""
    return f"{time_text(ms)} ({relative(ms, now_ms)})" if ms else None


def _clock_or_none(ms: int | None) -> str | None:
    return None if ms is None else clock(ms)


JOBS_HEADERS = [
    "ID",
    "NAME",
    "STATE",
    "MEMBERS",
    "GPU/MEMBER",
    "ATTEMPT",
    "SUBMITTED",
    "WAIT",
    "ELAPSED",
    "LEFT",
    "REASON",
]


def members_text(d: Mapping[str, Any]) -> object:
    """``4``, or of an elastic gang its range and, while it runs, its size: ``3 (2-4)``."""
    elastic = d.get("elastic")
    if not elastic:
        return d["replicas"]
    sizes = f"{elastic['min']}-{elastic['max']}"
    return f"{len(d['members'])} ({sizes})" if d["members"] else sizes


def job_row(d: Mapping[str, Any], now_ms: int) -> list[object]:
    """The job's line in ``synctl jobs`` (:data:`JOBS_HEADERS`)."""
    return [
        d["id"],
        d["name"],
        d["state"],
        members_text(d),
        d["resources"]["gpu"],
        d["attempt"] or None,
        short_time(d["submitted_at_ms"], now_ms),
        _clock_or_none(d.get("wait_ms")),
        _clock_or_none(d.get("elapsed_ms")),
        _clock_or_none(d.get("time_left_ms")),
        _short(d["reason"], 60),
    ]


def jobs_table(docs: Sequence[Mapping[str, Any]], now_ms: int) -> str:
    return table([job_row(d, now_ms) for d in docs], JOBS_HEADERS)


def explain_table(doc: Mapping[str, Any], now_ms: int) -> str:
    lines = [terminal_safe(f"job {doc['id']} is {doc['state']}")]
    if doc["attempt"]:
        lines[0] += f", attempt {doc['attempt']} (fencing token {doc['fencing_token']})"
    if doc["state"] == JobState.PENDING or not doc["members"]:
        lines.append(terminal_safe(doc["explanation"], keep=MULTILINE))
    elif doc["reason"] and doc["state"] not in (JobState.SCHEDULED, JobState.RUNNING):
        lines.append(terminal_safe(doc["reason"]))
    preempted = preemption_text(doc["preemption"])
    if preempted:
        lines.append(terminal_safe(preempted))
    lines += _checkpoint_lines(doc, now_ms)
    if doc["members"]:
        lines += ["", members_table(doc["members"], now_ms, with_topology=True)]
    return "\n".join(lines)


def _checkpoint_lines(doc: Mapping[str, Any], now_ms: int) -> list[str]:
    """Where the gang can resume from: its attempt's checkpoint mark (the oldest of its
    members' newest), and the step its next attempt resumes from."""
    lines = []
    mark = checkpoint_text(doc["checkpoint"], now_ms)
    if mark:
        lines.append(f"checkpoint: {mark} (the oldest of its members' newest marks)")
    elif doc["members"] and any(m["checkpoint"] for m in doc["members"]):
        marked = sum(1 for m in doc["members"] if m["checkpoint"])
        lines.append(f"checkpoint: none yet ({marked} of {len(doc['members'])} members marked)")
    if doc["resume_step"] is not None:
        lines.append(f"a restart resumes from step {doc['resume_step']} ($SYNAPSE_RESUME_STEP)")
    return lines


def _short(text: str, width: int) -> str:
    """The first line of ``text``, escaped (:func:`terminal_safe`), cut to ``width``.
    Only a newline ends the line: a carriage return or a separator is shown escaped, not
    obeyed, so it cannot hide what follows it."""
    line = terminal_safe(text.split("\n", 1)[0])
    return line if len(line) <= width else line[: width - 3] + "..."
