"""What each queue uses, borrows and lends right now: the numbers ``synctl queues`` shows.

A pure function of a state snapshot (DESIGN §8, docs/queues.md):

* ``used``: the resources of the queue's live attempts (every member of a bound or
  running gang), a gang being preempted included until its members are confirmed stopped;
* ``borrowed``: GPUs used beyond the nominal quota, which come from idle quota of other
  queues of its cohort (0 for a queue without a quota);
* ``lent``: of its idle nominal quota (at most its lending limit), the part that covers
  what the other queues of its cohort borrow. When several queues could cover the same
  borrowing, the lenders are taken in name order, so the figures are deterministic;
* ``pending``: jobs waiting (PENDING) and the GPUs they need, all members.

Integers only; no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.model import ClusterState, JobState, Queue


@dataclass(frozen=True, slots=True)
class QueueUsage:
    used_gpu: int = 0
    used_cpu_milli: int = 0
    used_memory_mib: int = 0
    borrowed_gpu: int = 0
    lent_gpu: int = 0
    running_jobs: int = 0
    pending_jobs: int = 0
    pending_gpu: int = 0
    preempting_jobs: int = 0


@dataclass(slots=True)
class _Tally:
    gpu: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    running: int = 0
    pending: int = 0
    pending_gpu: int = 0
    preempting: int = 0


def lendable_gpu(queue: Queue, used_gpu: int) -> int:
    """Idle nominal GPUs ``queue`` may lend: min(lending limit, max(0, nominal - used))."""
    if queue.gpu is None:
        return 0
    idle = max(0, queue.gpu - used_gpu)
    return idle if queue.lending_limit_gpu is None else min(queue.lending_limit_gpu, idle)


def queue_usage(state: ClusterState) -> dict[str, QueueUsage]:
    """Usage of every queue of ``state``, by name (sorted). Jobs naming a queue that no
    longer exists are not counted."""
    tallies = {name: _Tally() for name in sorted(state.queues)}
    for job in state.jobs.values():
        tally = tallies.get(job.spec.queue)
        if tally is None:
            continue
        spec = job.spec
        if job.state is JobState.PENDING:
            tally.pending += 1
            tally.pending_gpu += spec.resources.gpu * spec.replicas
            continue
        attempt = job.live_attempt()
        if attempt is None:
            continue
        members = len(attempt.members)
        tally.running += 1
        tally.gpu += spec.resources.gpu * members
        tally.cpu_milli += spec.resources.cpu_milli * members
        tally.memory_mib += spec.resources.memory_mib * members
        if attempt.preempted_by:
            tally.preempting += 1
    borrowed = {
        name: max(0, tallies[name].gpu - q.gpu) if q.gpu is not None else 0
        for name, q in state.queues.items()
    }
    lent = dict.fromkeys(tallies, 0)
    cohorts: dict[str, list[str]] = {}
    for name, q in sorted(state.queues.items()):
        if q.cohort:
            cohorts.setdefault(q.cohort, []).append(name)
    for cohort in cohorts.values():
        for borrower in cohort:
            need = borrowed[borrower]
            for lender in cohort:
                if need == 0:
                    break
                if lender == borrower:
                    continue
                queue = state.queues[lender]
                free = lendable_gpu(queue, tallies[lender].gpu) - lent[lender]
                give = min(need, max(0, free))
                lent[lender] += give
                need -= give
    return {
        name: QueueUsage(
            used_gpu=t.gpu,
            used_cpu_milli=t.cpu_milli,
            used_memory_mib=t.memory_mib,
            borrowed_gpu=borrowed.get(name, 0),
            lent_gpu=lent[name],
            running_jobs=t.running,
            pending_jobs=t.pending,
            pending_gpu=t.pending_gpu,
            preempting_jobs=t.preempting,
        )
        for name, t in tallies.items()
    }
