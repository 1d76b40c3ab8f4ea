"""What each queue uses, borrows and lends right now: the numbers ``synctl queues`` shows.

A pure function of a state snapshot (DESIGN §8, docs/queues.md):

* ``used``: the resources of the queue's live attempts (every member of a bound or
  running gang), a gang being preempted included until its members are confirmed stopped;
* ``borrowed``: GPUs used beyond the nominal quota, which come from idle quota of other
  queues of its cohort (0 for a queue without a quota), as :mod:`synapse_ha.core.quota`
  counts it;
* ``lent``: of its lendable quota (:meth:`synapse_ha.core.quota.QueueUsage.lendable`:
  idle nominal, at most its lending limit), the part that covers
  what the other queues of its cohort borrow. When several queues could cover the same
  borrowing, the lenders are taken in name order, so the figures are deterministic;
* ``pending``: jobs waiting (PENDING) and the GPUs they need, all members.

And per cohort of the cohort tree (:func:`cohort_usage`, what ``synctl queues --tree``
draws): its nominal (its own and everything below it), what the queues below it use,
and what its subtree borrows from and lends to its parent's pool
(:mod:`synapse_ha.core.cohort_tree`).

Integers only; no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.cluster_config import Cohort
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.quota import QueueUsage as QuotaUsage
from synapse_ha.core.quota import gang_request


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
    running: int = 0
    pending: int = 0
    pending_gpu: int = 0
    preempting: int = 0


def queue_usage(state: ClusterState) -> dict[str, QueueUsage]:
    """Usage of every queue of ``state``, by name (sorted). Used, borrowed and lendable
    are :class:`synapse_ha.core.quota.QueueUsage`'s (the rules the scheduler admits
    by); jobs naming a queue that no longer exists are not counted."""
    quota = QuotaUsage.of(state)
    tallies = {name: _Tally() for name in sorted(state.queues)}
    for job in state.jobs.values():
        tally = tallies.get(job.spec.queue)
        if tally is None:
            continue
        if job.state is JobState.PENDING:
            tally.pending += 1
            tally.pending_gpu += gang_request(job.spec).gpu
            continue
        attempt = job.live_attempt()
        if attempt is None:
            continue
        tally.running += 1
        if attempt.preempted_by:
            tally.preempting += 1
    lent = dict.fromkeys(tallies, 0)
    cohorts: dict[str, list[str]] = {}
    for name, q in sorted(state.queues.items()):
        if q.cohort:
            cohorts.setdefault(q.cohort, []).append(name)
    for cohort in cohorts.values():
        for borrower in cohort:
            need = quota.borrowed(borrower)
            for lender in cohort:
                if need == 0:
                    break
                if lender == borrower:
                    continue
                give = min(need, max(0, quota.lendable(lender) - lent[lender]))
                lent[lender] += give
                need -= give
    out = {}
    for name, t in tallies.items():
        used = quota.used(name)
        out[name] = QueueUsage(
            used_gpu=used.gpu,
            used_cpu_milli=used.cpu_milli,
            used_memory_mib=used.memory_mib,
            borrowed_gpu=quota.borrowed(name),
            lent_gpu=lent[name],
            running_jobs=t.running,
            pending_jobs=t.pending,
            pending_gpu=t.pending_gpu,
            preempting_jobs=t.preempting,
        )
    return out


@dataclass(frozen=True, slots=True)
class CohortUsage:
    """A cohort of the tree now. ``cohort``: its record, or for a name queues use that
    no record defines, a root without anything of its own (``defined`` False)."""

    cohort: Cohort
    defined: bool
    nominal_gpu: int
    used_gpu: int
    borrowed_gpu: int
    lendable_gpu: int


def cohort_usage(state: ClusterState) -> list[CohortUsage]:
    """Every cohort of ``state`` (records, and names queues use), by name."""
    quota = QuotaUsage.of(state)
    tree = quota.tree
    names = set(state.cohorts) | set(tree.members)
    out = []
    for name in sorted(names):
        record = state.cohorts.get(name)
        lends, borrows = tree.cohort_figures(name)
        out.append(
            CohortUsage(
                cohort=record if record is not None else Cohort(name),
                defined=record is not None,
                nominal_gpu=tree.nominal(name),
                used_gpu=tree.subtree_used(name),
                borrowed_gpu=borrows,
                lendable_gpu=lends,
            )
        )
    return out
