"""The dashboard's cohort tree (DESIGN §8, docs/queues.md "Hierarchical cohorts"): each
cohort with its nominal, used and borrowed GPUs, the cohorts and queues below it nested
under it, from the ``ListQueues`` answer. Server-rendered HTML, no script."""

from __future__ import annotations

import html

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _limit(msg: pb.Cohort | pb.Queue, name: str) -> str:
    return str(getattr(msg, name)) if msg.HasField(name) else "any"


def render_cohort_tree(answer: pb.ListQueuesResponse) -> str:
    """Nested lists, roots first; empty when the cluster has no cohort."""
    if not answer.cohorts:
        return ""
    below: dict[str, list[str]] = {}
    roots: list[str] = []
    for status in answer.cohorts:
        parent = status.cohort.parent
        (below.setdefault(parent, []) if parent else roots).append(status.cohort.name)
    cohorts = {s.cohort.name: s for s in answer.cohorts}
    queues: dict[str, list[pb.QueueStatus]] = {}
    for q in answer.queues:
        if q.queue.cohort:
            queues.setdefault(q.queue.cohort, []).append(q)

    def item(name: str, depth: int) -> str:
        s = cohorts[name]
        text = (
            f'<li data-cohort="{_e(name)}"><b>{_e(name)}</b> nominal {s.nominal_gpu}, '
            f"used {s.used_gpu}, borrowed {s.borrowed_gpu}"
            f" (may borrow {_limit(s.cohort, 'borrowing_limit_gpu')}, "
            f"may lend {_limit(s.cohort, 'lending_limit_gpu')})"
            + (", fair-sharing preemption" if s.cohort.fair_sharing_preemption else "")
        )
        inner = [item(child, depth + 1) for child in below.get(name, ()) if depth < 16]
        inner += [
            f'<li data-queue="{_e(q.queue.name)}">{_e(q.queue.name)} (queue) nominal '
            f"{q.queue.gpu}, used {q.usage.used_gpu}, borrowed {q.usage.borrowed_gpu}</li>"
            for q in queues.get(name, ())
        ]
        return text + (f"<ul>{''.join(inner)}</ul>" if inner else "") + "</li>"

    return f'<ul id="cohort-tree">{"".join(item(r, 0) for r in roots)}</ul>'
