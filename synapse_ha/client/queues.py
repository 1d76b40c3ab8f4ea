"""The cluster's queues and cohort tree as the client library hands them out, in core
values: each queue's record (:class:`~synapse_ha.core.cluster_config.Queue`) with its
usage (:class:`~synapse_ha.core.queues.usage.QueueUsage`) and its place in the fair-share
order (:class:`QueueStatus`), the priority classes, and every cohort of the tree
(:class:`~synapse_ha.core.queues.usage.CohortUsage`). Writes take the same records.
Queues and cohorts are changed by admins only; the cluster refuses anyone else.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.cluster_config import Cohort, PriorityClass, Queue
from synapse_ha.core.queues.usage import CohortUsage, QueueUsage
from synapse_ha.rpc import fields, from_proto, to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """A queue with what it uses now and its place in the order the scheduler considers
    queues by: ``fair_share_ppm`` its dominant-resource share in millionths (1000000:
    its decayed past usage and what it holds equal its nominal quota),
    ``cohort_shares_ppm`` the shares of the cohorts above it (outermost first),
    ``fair_share_position`` 1 for the queue considered first."""

    queue: Queue
    usage: QueueUsage
    fair_share_ppm: int
    cohort_shares_ppm: tuple[int, ...]
    fair_share_position: int


@dataclass(frozen=True, slots=True)
class Queues:
    """What ``ListQueues`` answers: the queues by name, the cluster's priority classes,
    its preemption mode (topology | blind | off), how long a reclaim waits before it may
    preempt gangs within their minimum run time, the cohort tree by name and the
    half-life of past usage in the shares."""

    queues: tuple[QueueStatus, ...]
    priority_classes: tuple[PriorityClass, ...]
    preemption: str
    reclaim_wait_max_ms: int
    cohorts: tuple[CohortUsage, ...]
    fair_share_half_life_ms: int


def queue_status_from_proto(s: pb.QueueStatus) -> QueueStatus:
    return fields.from_message(
        QueueStatus,
        s,
        queue=from_proto.queue_from_proto(s.queue),
        usage=fields.from_message(QueueUsage, s.usage),
    )


def cohort_usage_from_proto(s: pb.CohortStatus) -> CohortUsage:
    return fields.from_message(CohortUsage, s, cohort=from_proto.cohort_from_proto(s.cohort))


def queues_from_proto(msg: pb.ListQueuesResponse) -> Queues:
    return fields.from_message(
        Queues,
        msg,
        queues=tuple(queue_status_from_proto(q) for q in msg.queues),
        priority_classes=tuple(fields.from_message(PriorityClass, c) for c in msg.priority_classes),
        cohorts=tuple(cohort_usage_from_proto(c) for c in msg.cohorts),
    )


def list_queues(client: ClusterClient) -> Queues:
    """Every queue with its usage, the priority classes and the cohort tree."""
    return queues_from_proto(client.list_queues())


def set_queue(client: ClusterClient, queue: Queue) -> bool:
    """Create or replace every setting of ``queue``; True when it was created."""
    return bool(client.set_queue(to_proto.queue_to_proto(queue)).created)


def delete_queue(client: ClusterClient, name: str) -> None:
    """Delete a queue; refused for ``default`` and while unfinished jobs name it."""
    client.delete_queue(name)


def set_cohort(client: ClusterClient, cohort: Cohort) -> bool:
    """Create or replace every setting of ``cohort``; True when it was created."""
    request = pb.SetCohortRequest(cohort=to_proto.cohort_to_proto(cohort))
    answer: pb.SetCohortResponse = client.ask("SetCohort", request)
    return bool(answer.created)


def delete_cohort(client: ClusterClient, name: str) -> None:
    """Delete a cohort; refused while another cohort names it as its parent. Not retried
    on an unknown outcome (a retry would answer not found)."""
    request = pb.DeleteCohortRequest(name=name)
    client.ask("DeleteCohort", request, idempotent=False)
