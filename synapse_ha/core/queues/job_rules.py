"""The rules a job spec obeys against the cluster's queues and priority classes (the
rest of a spec's rules are :mod:`synapse_ha.core.spec.validation`'s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from synapse_ha.core.cluster_config import PriorityClass, Queue
from synapse_ha.core.model import JobSpec
from synapse_ha.core.spec.validation import Violation, invalid


def check_job_queue(
    spec: JobSpec, queues: Mapping[str, Queue], classes: Sequence[PriorityClass]
) -> list[Violation]:
    """Every rule ``spec`` breaks against the cluster's queues and priority classes: its
    queue must exist; its class (when it names one) must exist; a queue that lists
    classes admits only jobs naming one of them. The rest of the spec is
    :func:`check_job_spec`'s. Fields are named as in a job spec file (``priority:``
    holds a number or a class name)."""
    out: list[Violation] = []
    queue = queues.get(spec.queue)
    if queue is None:
        known = ", ".join(sorted(queues)) or "none"
        out.append(invalid("queue", f"no queue {spec.queue!r} (queues: {known})"))
    names = [c.name for c in classes]
    if spec.priority_class and spec.priority_class not in names:
        known = ", ".join(sorted(names)) or "none are configured"
        out.append(invalid("priority", f"no priority class {spec.priority_class!r} ({known})"))
    elif queue is not None and queue.priority_classes:
        allowed = ", ".join(queue.priority_classes)
        if spec.priority_class not in queue.priority_classes:
            given = repr(spec.priority_class) if spec.priority_class else "a plain number"
            out.append(
                invalid("priority", f"queue {queue.name} allows the classes {allowed}, not {given}")
            )
    return out
