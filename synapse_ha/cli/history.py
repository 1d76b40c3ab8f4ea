"""``synctl history``, ``synctl usage`` and ``synctl events``.

Like Slurm's ``sacct`` (finished jobs, beyond the replicated state's retention window),
``sreport`` (GPU-hours per user or queue and day) and a cluster event feed. Every replica
holds the same history and events, so these read from whichever replica answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import click

from synapse_ha.cli import render, terminal
from synapse_ha.cli.app import Settings, emit, now_ms, output_option, with_settings
from synapse_ha.cli.render_jobs import checkpoint_document
from synapse_ha.client import history as client_history
from synapse_ha.client.history import ClusterEvent, FinishedAttempt, FinishedJob, Usage
from synapse_ha.rpc import readable
from synapse_ha.rpc.readable import with_iso

MS_PER_HOUR = 3_600_000


def parse_since(value: str, now_ms: int, option: str = "--since") -> int:
    """A point in time as epoch milliseconds: a duration back from now (``7d``,
    ``12h``, ``30m``) or a UTC date or time (``2024-10-01``, ``2024-10-01T12:00``)."""
    moment = readable.parse_moment(value, now_ms, option)
    if moment is None:
        raise click.BadParameter(
            f"{value!r} is neither a duration back from now (7d, 12h) nor a UTC date or time "
            "(2024-10-01, 2024-10-01T12:00)",
            param_hint=option,
        )
    return moment


# -------------------------------------------------------------------- documents


def attempt_document(a: FinishedAttempt) -> dict[str, Any]:
    return with_iso(
        {
            "attempt": a.number,
            "fencing_token": a.fencing_token,
            "state": a.state,
            "nodes": list(a.nodes),
            "gpus": a.gpus,
            "bound_at_ms": a.bound_at_ms,
            "started_at_ms": a.started_at_ms or None,
            "ended_at_ms": a.ended_at_ms,
            "gpu_seconds": a.gpu_ms / 1000,
            "outcome_code": a.outcome_code,
            "outcome": a.outcome,
        },
        "bound_at_ms",
        "started_at_ms",
        "ended_at_ms",
    )


def history_document(j: FinishedJob) -> dict[str, Any]:
    """A finished job. ``id`` is its id as in ``synctl jobs``; ``job_id`` the same, kept
    for scripts written before. ``wait_ms``: submission to first start; ``elapsed_ms``:
    first start to end (every attempt and the gaps between them)."""
    started = j.started_at_ms or None
    doc = {
        "id": j.job_id,
        "job_id": j.job_id,
        "name": j.name,
        "owner": j.owner,
        "queue": j.queue,
        "state": j.state,
        "reason_code": j.reason_code,
        "reason": j.reason,
        "submitted_at_ms": j.submitted_at_ms,
        "started_at_ms": j.started_at_ms or None,
        "finished_at_ms": j.finished_at_ms,
        "attempts": j.attempts,
        "retries_used": j.retries_used,
        "requeues": j.requeues,
        "gpus_per_attempt": j.gpus_per_attempt,
        "gpu_seconds": j.gpu_ms / 1000,
        "nodes": list(j.nodes),
        "cancelled_by": j.cancelled_by,
        "replicas": j.replicas,
        "resources": render.resources_document(j.resources),
        "attempt_list": [attempt_document(a) for a in j.attempt_list],
        "checkpoint": checkpoint_document(j.checkpoint) if j.checkpoint else None,
        "resume_step": j.resume_step,
        "wait_ms": max(0, started - j.submitted_at_ms) if started and j.submitted_at_ms else None,
        "elapsed_ms": max(0, j.finished_at_ms - started) if started and j.finished_at_ms else None,
    }
    return with_iso(doc, "submitted_at_ms", "started_at_ms", "finished_at_ms")


HISTORY_HEADERS = (
    "ID",
    "NAME",
    "USER",
    "QUEUE",
    "STATE",
    "ATT",
    "SUBMITTED",
    "WAIT",
    "ELAPSED",
    "ENDED",
    "GPU-H",
    "NODES",
)


def history_table(docs: Sequence[Mapping[str, Any]], now_ms: int) -> str:
    """Finished jobs, times local (``short_time`` against ``now_ms``)."""
    rows = [
        (
            d["id"],
            d["name"],
            d["owner"],
            d["queue"],
            d["state"],
            d["attempts"],
            readable.short_time(d["submitted_at_ms"], now_ms),
            readable.clock(d["wait_ms"]),
            readable.clock(d["elapsed_ms"]),
            readable.short_time(d["finished_at_ms"], now_ms),
            f"{d['gpu_seconds'] / 3600:.2f}",
            ",".join(d["nodes"][:4]) + (",..." if len(d["nodes"]) > 4 else ""),
        )
        for d in docs
    ]
    headers = HISTORY_HEADERS
    return render.table(rows, headers) if rows else "no finished jobs match"


def usage_document(answer: Usage) -> dict[str, Any]:
    return {
        "by": answer.by,
        "since_ms": answer.since_ms,
        "until_ms": answer.until_ms,
        "rows": [
            {
                answer.by: r.key,
                "day": r.day,
                "gpu_hours": round(r.gpu_ms / MS_PER_HOUR, 6),
                "attempts": r.attempts,
            }
            for r in answer.rows
        ],
        "total_gpu_hours": round(sum(r.gpu_ms for r in answer.rows) / MS_PER_HOUR, 6),
    }


def usage_table(doc: Mapping[str, Any]) -> str:
    by = doc["by"]
    rows = [(r["day"], r[by], f"{r['gpu_hours']:.2f}", r["attempts"]) for r in doc["rows"]]
    if not rows:
        return "no GPU usage in that period"
    body = render.table(rows, ("DAY", by.upper(), "GPU-HOURS", "ATTEMPTS"))
    return f"{body}\ntotal: {doc['total_gpu_hours']:.2f} GPU-hours"


def event_document(e: ClusterEvent) -> dict[str, Any]:
    doc: dict[str, Any] = {"index": e.index, "kind": e.kind, "time_ms": e.time_ms}
    for name in ("job_id", "job_name", "owner", "queue", "node_id", "leader_id"):
        value = getattr(e, name)
        if value:
            doc[name] = value
    if e.attempt:
        doc["attempt"] = e.attempt
    if e.nodes:
        doc["nodes"] = list(e.nodes)
    if e.reason_code:
        doc["reason_code"] = e.reason_code
    if e.detail:
        doc["detail"] = e.detail
    return doc


EVENT_HEADER = ("INDEX", "TIME", "KIND", "SUBJECT", "DETAIL")


def event_line(d: Mapping[str, Any]) -> str:
    """One event as a line under :func:`event_header`; every part the cluster, a job or
    a node wrote is escaped (:func:`~synapse_ha.cli.terminal.terminal_safe`), newlines
    included."""
    safe = terminal.terminal_safe
    subject = safe(d.get("job_id") or d.get("node_id") or d.get("leader_id") or "-")
    extra = []
    if "attempt" in d:
        extra.append(f"attempt {d['attempt']}")
    if "nodes" in d:
        extra.append("on " + safe(",".join(d["nodes"])))
    if "detail" in d:
        extra.append(safe(d["detail"]))
    return _event_columns(
        str(d["index"]), render.time_text(d["time_ms"]), safe(d["kind"]), subject, "; ".join(extra)
    )


def event_header() -> str:
    """The column names above :func:`event_line` lines."""
    return _event_columns(*EVENT_HEADER)


def _event_columns(index: str, when: str, kind: str, subject: str, detail: str) -> str:
    # Fixed widths: a followed stream prints line by line, so no table can size them.
    return f"{index:>14}  {when:<23}  {kind:<15} {subject:<12} {detail}".rstrip()


# --------------------------------------------------------------------- commands


@click.command()
@click.option("--user", default="", help="Only this user's jobs (users see only their own).")
@click.option("--queue", default="", help="Only jobs of this queue.")
@click.option("--node", default="", help="Only jobs with an attempt on this node.")
@click.option(
    "--since",
    default=None,
    help="Finished since: a duration back from now (7d, 12h) or a UTC date (2024-10-01).",
)
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=1000, show_default=True)
@output_option
@with_settings
def history(
    settings: Settings,
    user: str,
    queue: str,
    node: str,
    since: str | None,
    limit: int,
) -> None:
    """Finished jobs, newest first, kept by every replica after the cluster state
    forgets them (like sacct).

    \b
    Examples:
      synctl history --since 1d
      synctl history --user alice --node w7 -o json
    """
    now = now_ms()
    since_ms = parse_since(since, now) if since else 0
    found = client_history.list_history(
        settings.client(), user=user, queue=queue, node_id=node, since_ms=since_ms, limit=limit
    )
    docs = [history_document(j) for j in found]
    emit(settings, {"jobs": docs}, lambda: history_table(docs, now))


@click.command()
@click.option(
    "--by",
    type=click.Choice(["user", "queue", "account"]),
    default="user",
    show_default=True,
    help="Sum per user, queue or account (sbatch --account).",
)
@click.option(
    "--since",
    default="7d",
    show_default=True,
    help="Start of the period: a duration back from now or a UTC date.",
)
@click.option("--until", default=None, help="End of the period (default now); as --since.")
@output_option
@with_settings
def usage(settings: Settings, by: str, since: str, until: str | None) -> None:
    """GPU-hours per user or queue and UTC day, from ended attempts (like sreport).
    An attempt counts from its bind to its end (its GPUs were nobody else's); one that
    spans midnight is split between the days. Users see only their own usage.

    \b
    Examples:
      synctl usage --by user --since 7d
      synctl usage --by queue --since 2024-10-01 --until 2024-11-01 -o json
    """
    now = now_ms()
    since_ms = parse_since(since, now)
    until_ms = parse_since(until, now, "--until") if until else 0
    answer = client_history.get_usage(settings.client(), by, since_ms, until_ms)
    doc = usage_document(answer)
    emit(settings, doc, lambda: usage_table(doc))


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new events (Ctrl-C stops).")
@click.option(
    "--since",
    "since_index",
    type=click.IntRange(min=0),
    default=0,
    help="Only events after this index (as printed); 0: the oldest the replica holds.",
)
@output_option
@with_settings
def events(settings: Settings, follow: bool, since_index: int) -> None:
    """What happens in the cluster: jobs submitted, bound, started, exited, failed,
    requeued, cancelled; nodes registered, cordoned, drained, dead; leader changes.

    Each event has an index, the same on every replica; pass the last one seen to
    --since to resume without missing anything the replica still holds (an index older
    than that fails with EVENTS_EXPIRED). With -o json and -f, one JSON object a line.

    \b
    Examples:
      synctl events
      synctl events -f --since 3932160
    """
    stream = client_history.watch_events(
        settings.client(), since_index, follow=follow, reconnect_s=settings.timeout
    )
    if follow:
        if settings.output == "table":
            click.echo(event_header())
        for event in stream:
            doc = event_document(event)
            if settings.output == "table":
                click.echo(event_line(doc))
            else:
                click.echo(json.dumps(doc))
        return
    docs = [event_document(e) for e in stream]
    last = docs[-1]["index"] if docs else since_index
    emit(
        settings,
        {"events": docs, "last_index": last},
        lambda: "\n".join([event_header(), *map(event_line, docs)]) if docs else "no events",
    )


HISTORY_COMMANDS = (history, usage, events)
