"""synctl's array documents and tables: an array as one line of ``synctl jobs`` and as
``synctl status ARRAY`` (see :mod:`synapse_ha.cli.render` for the fields)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from synapse_ha.cli.render import (
    Document,
    cell_text,
    resources_document,
    resources_text,
    table,
    time_text,
)
from synapse_ha.cli.render_jobs import (
    JOBS_HEADERS,
    dependencies_document,
    dependencies_text,
    job_row,
)
from synapse_ha.client.jobs import ArrayView
from synapse_ha.core.model import JobState
from synapse_ha.rpc.readable import relative, short_time


def array_document(array: ArrayView) -> Document:
    spec = array.spec
    given = dict(array.task_states)
    counts = {str(s): given[str(s)] for s in JobState if given.get(str(s))}
    return {
        "id": array.array_id,
        "kind": "array",
        "name": spec.name,
        "owner": array.owner,
        "array": spec.array,
        "tasks": array.tasks,
        "throttle": array.throttle or None,
        "task_states": counts,
        "finished": sum(n for s, n in counts.items() if JobState(s).finished),
        "replicas": spec.replicas,
        "resources": resources_document(spec.resources),
        "queue": spec.queue or "default",
        "priority": spec.priority,
        "priority_class": spec.priority_class,
        "dependencies": dependencies_document(spec.dependencies) if spec.dependencies else None,
        "submitted_at_ms": array.submitted_at_ms or None,
        "request_id": array.request_id,
        "redacted": array.redacted,
    }


def states_text(doc: Mapping[str, Any]) -> str:
    """``2 RUNNING, 8 PENDING, 90 SUCCEEDED`` (states in lifecycle order)."""
    return ", ".join(f"{n} {state}" for state, n in doc["task_states"].items()) or "no tasks"


def throttle_text(doc: Mapping[str, Any]) -> str:
    return f"at most {doc['throttle']} at once" if doc["throttle"] else "no throttle"


def array_row(doc: Mapping[str, Any], now_ms: int) -> list[object]:
    """The array's line in ``synctl jobs`` (:data:`~synapse_ha.cli.render_jobs.JOBS_HEADERS`):
    its tasks counted by state as the reason."""
    return [
        doc["id"],
        doc["name"],
        f"ARRAY[{doc['tasks']}]",
        doc["replicas"],
        doc["resources"]["gpu"],
        None,
        short_time(doc["submitted_at_ms"], now_ms),
        None,
        None,
        None,
        f"{states_text(doc)} ({throttle_text(doc)})",
    ]


def lines_table(docs: Sequence[Mapping[str, Any]], now_ms: int) -> str:
    """``synctl jobs``: jobs, and arrays (documents of ``kind`` array) as one line each."""
    rows = [array_row(d, now_ms) if d.get("kind") == "array" else job_row(d, now_ms) for d in docs]
    return table(rows, JOBS_HEADERS)


def array_table(doc: Mapping[str, Any], now_ms: int) -> str:
    fields: list[tuple[str, object]] = [
        ("ID", doc["id"]),
        ("NAME", doc["name"]),
        ("OWNER", doc["owner"]),
        ("ARRAY", f"{doc['array']}: {doc['tasks']} task(s), {throttle_text(doc)}"),
        ("TASKS", states_text(doc)),
        ("REPLICAS", f"{doc['replicas']} per task"),
        ("RESOURCES", f"{resources_text(doc['resources'])} per member"),
        ("QUEUE", doc["queue"]),
        ("PRIORITY", doc["priority_class"] or doc["priority"]),
        ("DEPENDS ON", dependencies_text(doc["dependencies"])),
        (
            "SUBMITTED",
            f"{time_text(doc['submitted_at_ms'])} ({relative(doc['submitted_at_ms'], now_ms)})",
        ),
        ("REQUEST ID", doc["request_id"]),
    ]
    lines = [f"{name + ':':<15}{cell_text(value)}" for name, value in fields]
    lines += [
        "",
        f"Tasks are the jobs {doc['id']}_<index>: synctl jobs --array {doc['id']}, "
        f"synctl logs {doc['id']} --task <index>.",
    ]
    return "\n".join(lines)
