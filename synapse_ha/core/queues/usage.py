"""What each queue uses, borrows and lends right now: the numbers ``synctl queues`` shows.

A pure function of a state snapshot (DESIGN §8, docs/queues.md):

* ``used``: the resources of the queue's live attempts (every member of a bound or
  running gang), a gang being preempted included until its members are confirmed stopped;
* ``borrowed``: GPUs used beyond the nominal quota, which come from idle quota of other
  queues of its cohort (0 for a queue without a quota), as :mod:`synapse_ha.core.queues.quota`
  counts it;
* ``lent``: of its lendable quota (:meth:`synapse_ha.core.queues.quota.QueueUsage.lendable`:
  idle nominal, at most its lending limit), the part that covers
  what the other queues of its cohort borrow. When several queues could cover the same
  borrowing, the lenders are taken in name order, so the figures are deterministic;
* ``pending``: jobs waiting (PENDING) and the GPUs they need, all members.

And per cohort of the cohort tree (:func:`cohort_usage`, what ``synctl queues --tree``
draws): its nominal (its own and everything below it), what the queues below it use,
and what its subtree borrows from and lends to its parent's pool
(:mod:`synapse_ha.core.queues.cohort_tree`).

:func:`queues_now` gives all of it and each queue's place in the fair-share order
(:func:`synapse_ha.core.queues.ordering.queue_standings`) from one pass over the jobs:
what ``ListQueues`` answers.

Integers only; no clock (``now_ms`` is given), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.cluster_config import Cohort
from synapse_ha.core.model import ClusterState, Job, JobState, Resources
from synapse_ha.core.queues.ordering import QueueStanding, queue_standings
from synapse_ha.core.queues.quota import QueueUsage as QuotaUsage
from synapse_ha.core.queues.quota import charges_members, count_held, gang_request


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


@dataclass(frozen=True, slots=True)
class QueuesNow:
    """What ``ListQueues`` answers: each queue's usage and standing (by name), and the
    cohorts of the tree (by name)."""

    usage: dict[str, QueueUsage]
    cohorts: list[CohortUsage]
    standings: dict[str, QueueStanding]


def queues_now(state: ClusterState, now_ms: int) -> QueuesNow:
    """Usage (:func:`queue_usage`), cohorts (:func:`cohort_usage`) and each queue's place
    in the order between queues as of ``now_ms``, reading every job once."""
    held: dict[str, Resources] = {}
    tallies = {name: _Tally() for name in sorted(state.queues)}
    heads: dict[str, Job] = {}
    by_members = charges_members(state)
    for job in state.jobs.values():
        count_held(held, job, by_members=by_members)
        _tally(tallies, heads, job)
    quota = QuotaUsage(state.queues, held, state.cohorts)
    return QueuesNow(
        usage=_usage(state, quota, tallies),
        cohorts=_cohorts(state, quota),
        standings=queue_standings(state, quota, now_ms, heads),
    )


def queue_usage(state: ClusterState) -> dict[str, QueueUsage]:
    """Usage of every queue of ``state``, by name (sorted). Used, borrowed and lendable
    are :class:`synapse_ha.core.queues.quota.QueueUsage`'s (the rules the scheduler admits
    by); jobs naming a queue that no longer exists are not counted."""
    tallies = {name: _Tally() for name in sorted(state.queues)}
    for job in state.jobs.values():
        _tally(tallies, {}, job)
    return _usage(state, QuotaUsage.of(state), tallies)


def _head_key(job: Job) -> tuple[int, int, int]:
    """Queue order within a queue, as :meth:`ClusterState.pending_jobs` sorts."""
    return (-job.spec.priority, job.seq, job.array_index)


def _tally(tallies: dict[str, _Tally], heads: dict[str, Job], job: Job) -> None:
    """Count ``job`` in its queue's tally; keep the queue's first pending gang that may
    be placed (no dependency waited for) in ``heads``."""
    tally = tallies.get(job.spec.queue)
    if tally is None:
        return
    if job.state is JobState.PENDING:
        tally.pending += 1
        tally.pending_gpu += gang_request(job.spec).gpu
        head = heads.get(job.spec.queue)
        if not job.waiting_for and (head is None or _head_key(job) < _head_key(head)):
            heads[job.spec.queue] = job
        return
    attempt = job.live_attempt()
    if attempt is None:
        return
    tally.running += 1
    if attempt.preempted_by:
        tally.preempting += 1


def _usage(
    state: ClusterState, quota: QuotaUsage, tallies: dict[str, _Tally]
) -> dict[str, QueueUsage]:
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
    return _cohorts(state, QuotaUsage.of(state))


def _cohorts(state: ClusterState, quota: QuotaUsage) -> list[CohortUsage]:
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
