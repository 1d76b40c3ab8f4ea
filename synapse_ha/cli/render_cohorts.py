"""synctl's cohort tree (``synctl queues --tree``): every cohort with the cohorts and
queues below it, each with its nominal GPUs, what it uses and what it borrows (DESIGN §8,
docs/queues.md "Hierarchical cohorts"), as a nested document and as an indented table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synapse_ha.cli.render import Document, cell_text
from synapse_ha.client.queues import Queues, QueueStatus
from synapse_ha.core.queues.usage import CohortUsage


def _cohort_node(status: CohortUsage) -> Document:
    c = status.cohort
    return {
        "name": c.name,
        "kind": "cohort",
        "defined": status.defined,
        "gpu": c.gpu,
        "borrowing_limit_gpu": c.borrowing_limit_gpu,
        "lending_limit_gpu": c.lending_limit_gpu,
        "fair_sharing_preemption": c.fair_sharing_preemption,
        "nominal_gpu": status.nominal_gpu,
        "used_gpu": status.used_gpu,
        "borrowed_gpu": status.borrowed_gpu,
        "lendable_gpu": status.lendable_gpu,
        "children": [],
    }


def _queue_node(status: QueueStatus) -> Document:
    q, u = status.queue, status.usage
    return {
        "name": q.name,
        "kind": "queue",
        "borrowing_limit_gpu": q.borrowing_limit_gpu,
        "lending_limit_gpu": q.lending_limit_gpu,
        "nominal_gpu": q.gpu,
        "used_gpu": u.used_gpu,
        "borrowed_gpu": u.borrowed_gpu,
        "lent_gpu": u.lent_gpu,
    }


def tree_document(answer: Queues) -> Document:
    """``{"tree": roots, "queues": queues in no cohort}``: each cohort with its
    ``children``, the cohorts below it first, then its queues, both by name."""
    nodes = {s.cohort.name: _cohort_node(s) for s in answer.cohorts}
    roots: list[Document] = []
    for status in answer.cohorts:
        parent = status.cohort.parent
        node = nodes[status.cohort.name]
        (nodes[parent]["children"] if parent in nodes else roots).append(node)
    alone: list[Document] = []
    for queue_status in answer.queues:
        queue = _queue_node(queue_status)
        cohort = queue_status.queue.cohort
        home = nodes.get(cohort) if cohort else None
        (home["children"] if home is not None else alone).append(queue)
    return {"tree": roots, "queues": alone}


def _limit(value: int | None) -> str:
    return "any" if value is None else str(value)


def _rows(node: Mapping[str, Any], lead: str, last: bool, top: bool) -> list[list[object]]:
    branch = "" if top else ("`- " if last else "|- ")
    name = node["name"] + ("" if node["kind"] == "cohort" else " (queue)")
    if node["kind"] == "cohort" and not node["defined"]:
        name += " (no record)"
    if node.get("fair_sharing_preemption"):
        name += " (fair-sharing preemption)"
    nominal = node["nominal_gpu"]
    limits = nominal is not None and not (top and node["kind"] == "cohort")
    rows: list[list[object]] = [
        [
            lead + branch + name,
            "-" if nominal is None else nominal,
            node["used_gpu"],
            node["borrowed_gpu"],
            _limit(node["borrowing_limit_gpu"]) if limits else "-",
            _limit(node["lending_limit_gpu"]) if limits else "-",
        ]
    ]
    below = lead + ("" if top else ("   " if last else "|  "))
    children = node.get("children", [])
    for i, child in enumerate(children):
        rows += _rows(child, below, i == len(children) - 1, False)
    return rows


def tree_table(doc: Mapping[str, Any]) -> str:
    """The tree, one row per cohort and queue, indented under its parent; then the
    queues in no cohort."""
    rows: list[list[object]] = []
    for root in doc["tree"]:
        rows += _rows(root, "", True, True)
    for queue in doc["queues"]:
        rows += _rows(queue, "", True, True)
    headers = ["COHORT / QUEUE", "NOMINAL", "USED", "BORROWED", "MAY BORROW", "MAY LEND"]
    # Laid out here rather than by render.table, which would strip the indentation.
    cells = [headers, *[[cell_text(c) for c in row] for row in rows]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )
