"""The order in which a pass considers pending gangs (DESIGN §8).

* Gangs that preempted others come first (seq order): they have first claim on what
  their victims free, so no gang later in the pass takes it.
* Between queues: ascending fair share (:func:`synapse_ha.core.fairshare.share`), then
  the head gang's priority and submission order. The share of a queue is recomputed
  after each of its gangs is considered, so gangs placed in this pass count at once and
  the queues interleave.
* Within a queue: priority (higher first), then submission order.

With one queue (or no quotas at all) this is the plain order of
:meth:`ClusterState.pending_jobs`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from synapse_ha.core.fairshare import share
from synapse_ha.core.model import ClusterState, Job
from synapse_ha.core.quota import QueueUsage


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
    half_life = state.config.fair_share_half_life_ms

    def key(name: str) -> tuple[int, int, int, str]:
        head = lines[name][0]
        queue = state.queues.get(name)
        fair = (
            share(queue, state.queue_history.get(name), usage.used(name), now_ms, half_life)
            if queue is not None
            else 0
        )
        return (fair, -head.spec.priority, head.seq, name)

    heap = [key(name) for name in sorted(lines)]
    heapq.heapify(heap)
    while heap:
        name = heapq.heappop(heap)[3]
        line = lines[name]
        yield line.popleft()
        if line:
            heapq.heappush(heap, key(name))
