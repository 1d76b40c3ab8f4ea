"""synctl's queues document (``synctl queues``: quotas, usage, borrowing, each queue's
place in the fair-share order, the priority classes and the preemption mode) and its
table (see :mod:`synapse_ha.cli.render` for the fields).

The fair share of a queue is its dominant resource's decayed past usage over one
half-life plus what it holds now, against its nominal quota (1.0: exactly its
entitlement); the scheduler considers the queues lowest first, the shares of the
cohorts above them compared before their own (``order``: 1 is considered first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synapse_ha.cli.render import Document, duration_text, table
from synapse_ha.cli.terminal import MULTILINE, terminal_safe
from synapse_ha.client.queues import Queues, QueueStatus
from synapse_ha.core.queues.fairshare import SHARE_SCALE


def queue_document(status: QueueStatus) -> Document:
    q, u = status.queue, status.usage
    has_quota = any(v is not None for v in (q.gpu, q.cpu_milli, q.memory_mib))
    return {
        "name": q.name,
        "cohort": q.cohort,
        "nominal": {"gpu": q.gpu, "cpu_milli": q.cpu_milli, "memory_mib": q.memory_mib}
        if has_quota
        else None,
        "borrowing_limit_gpu": q.borrowing_limit_gpu,
        "lending_limit_gpu": q.lending_limit_gpu,
        "priority_classes": list(q.priority_classes),
        "min_runtime_ms": q.min_runtime_ms,
        "running_members_per_user": q.running_members_per_user,
        "members_per_node_per_user": q.members_per_node_per_user,
        "default_time_limit_ms": q.default_time_limit_ms,
        "learned_estimates": q.learned_estimates,
        "used": {"gpu": u.used_gpu, "cpu_milli": u.used_cpu_milli, "memory_mib": u.used_memory_mib},
        "borrowed_gpu": u.borrowed_gpu,
        "lent_gpu": u.lent_gpu,
        "running_jobs": u.running_jobs,
        "pending_jobs": u.pending_jobs,
        "pending_gpu": u.pending_gpu,
        "preempting_jobs": u.preempting_jobs,
        "fair_share": {
            "share": status.fair_share_ppm / SHARE_SCALE,
            "cohort_shares": [s / SHARE_SCALE for s in status.cohort_shares_ppm],
            "order": status.fair_share_position,
        },
    }


def queues_document(answer: Queues) -> Document:
    return {
        "queues": [queue_document(q) for q in answer.queues],
        "priority_classes": [
            {
                "name": c.name,
                "value": c.value,
                "preempts": c.preempts,
                "grace_ms": c.grace_ms,
                "min_runtime_ms": c.min_runtime_ms,
            }
            for c in answer.priority_classes
        ],
        "preemption": answer.preemption,
        "reclaim_wait_max_ms": answer.reclaim_wait_max_ms,
        "fair_share_half_life_ms": answer.fair_share_half_life_ms,
    }


def _limit(value: int | None) -> str:
    return "any" if value is None else str(value)


def _user_caps(q: Mapping[str, Any]) -> str:
    """``50 running, 4/node``; ``limits`` for a cap the queue leaves to the cluster."""
    running, per_node = q["running_members_per_user"], q["members_per_node_per_user"]
    if running is None and per_node is None:
        return "limits"
    return (
        f"{'limits' if running is None else running} running, "
        f"{'limits' if per_node is None else per_node}/node"
    )


def _estimate(q: Mapping[str, Any]) -> str:
    """``4h``, ``learned,4h``, ``learned`` or ``-``: how long a job without a time limit
    is expected to run, for backfill (one word: the table splits on spaces)."""
    default = q["default_time_limit_ms"]
    shown = duration_text(default) if default else ""
    if q["learned_estimates"]:
        return f"learned,{shown}" if shown else "learned"
    return shown or "-"


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
                f"{q['fair_share']['share']:.0%}" if nominal is not None else "-",
                q["fair_share"]["order"],
                ",".join(q["priority_classes"]) or "any",
                _estimate(q),
                duration_text(q["min_runtime_ms"]) if q["min_runtime_ms"] else "-",
                _user_caps(q),
            ]
        )
    headers = ["QUEUE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "MAY BORROW"]
    headers += ["MAY LEND", "RUNNING", "PENDING", "SHARE", "ORDER", "CLASSES", "ESTIMATE"]
    headers += ["MIN RUN", "USER CAPS"]
    out = table(rows, headers)
    classes = ", ".join(
        f"{c['name']} {c['value']}{' (preempts)' if c['preempts'] else ''}"
        f" grace {duration_text(c['grace_ms'])}"
        + (f" min run {duration_text(c['min_runtime_ms'])}" if c["min_runtime_ms"] else "")
        for c in doc["priority_classes"]
    )
    wait = duration_text(doc["reclaim_wait_max_ms"])
    half_life = duration_text(doc["fair_share_half_life_ms"])
    tail = (
        f"fair share: the scheduler considers queues in ORDER, lowest SHARE first (past "
        f"usage decayed with half-life {half_life}, plus what a queue holds now, against "
        f"its nominal quota; the shares of its cohorts are compared first)\n"
        f"USER CAPS: a queue's own caps on one user's members (running in the cluster, on "
        f"one node); 'limits': the cluster's (synctl config show)\n"
        f"ESTIMATE: how long a job without a time limit is expected to run, for backfill "
        f"only (never a limit it is stopped at); 'learned': the p90 of alike finished "
        f"runs, from 5 on\n"
        f"priority classes: {classes or 'none'}\npreemption: {doc['preemption']}"
        f" (a reclaim overrides minimum run times after {wait})"
    )
    return f"{out}\n\n{terminal_safe(tail, keep=MULTILINE)}"
