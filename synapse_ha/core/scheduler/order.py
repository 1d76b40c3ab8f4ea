"""The order in which a pass considers pending gangs (DESIGN §8).

* Gangs that preempted others come first (seq order): they have first claim on what
  their victims free, so no gang later in the pass takes it.
* Between queues: ascending fair share (:func:`synapse_ha.core.queues.fairshare.share`), then
  the head gang's priority and submission order. The share of a queue is recomputed
  after each of its gangs is considered, so gangs placed in this pass count at once and
  the queues interleave. In a cohort tree the shares are compared level by level: first
  the shares of the subtrees below the root the two queues are in
  (:func:`synapse_ha.core.queues.fairshare.subtree_share`), then the next level down, and the
  queues' own shares last; so a team that used little goes before a busier team's
  least busy queue. Without cohort records only the queues' own shares count.
* Within a queue: priority (higher first), then submission order.

With one queue (or no quotas at all) this is the plain order of
:meth:`ClusterState.pending_jobs`.

The key between queues is :func:`synapse_ha.core.queues.ordering.queue_key`, which also
gives every queue's place as a pass would begin (what ``ListQueues`` reports).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from synapse_ha.core.model import ClusterState, Job
from synapse_ha.core.queues.ordering import CohortShares, QueueKey, queue_key
from synapse_ha.core.queues.quota import QueueUsage


def ordered_pending(
    state: ClusterState,
    now_ms: int,
    usage: QueueUsage | None,
    first: set[str],
    pending: list[Job] | None = None,
) -> Iterator[Job]:
    """Pending jobs (``pending``, by default :meth:`ClusterState.pending_jobs`) in the
    order the pass considers them. Lazy: ``usage`` may change between two jobs (a gang
    placed) and the next choice sees it."""
    if pending is None:
        pending = state.pending_jobs()
    if first:
        for job in pending:
            if job.job_id in first:
                yield job
        pending = [job for job in pending if job.job_id not in first]
    queues = {job.spec.queue for job in pending}
    if usage is None or len(queues) <= 1:
        yield from pending
        return
    lines: dict[str, deque[Job]] = {}
    for job in pending:
        lines.setdefault(job.spec.queue, deque()).append(job)
    levels = CohortShares(state, usage, now_ms) if state.cohorts else None

    def key(name: str) -> QueueKey:
        return queue_key(state, usage, now_ms, levels, name, lines[name][0])

    heap = [key(name) for name in sorted(lines)]
    heapq.heapify(heap)
    while heap:
        name = heapq.heappop(heap)[-1]
        line = lines[name]
        yield line.popleft()
        if line:
            heapq.heappush(heap, key(name))
