"""Preemption: a pending gang marks the live attempts of its victims, verified whole
against the priority and reclaim rules that make thrashing impossible."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import PreemptionKind, PreemptionMode
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.model import ClusterState, Job, JobState
from synapse_ha.core.queues.cohort_tree import root_of
from synapse_ha.core.queues.fair_preemption import fair_share_problem
from synapse_ha.core.queues.quota import (
    QueueUsage,
    charges_members,
    gang_request,
    grace_ms,
    held_request,
    priority_class,
)
from synapse_ha.core.queues.victim_rules import protection_problem
from synapse_ha.core.reasons import ReasonCode, reason


def _preempt(state: ClusterState, c: cmd.Preempt, now: int) -> Result:
    """Mark every victim's live attempt as preempted for ``c.preemptor``, or nothing.

    Verified whole: preemption is on; the preemptor is pending and planned against its
    current attempt count; each victim is named once, is live with the named fencing
    token and not already being preempted; and ``c.kind`` allows each victim:

    * ``PRIORITY``: the preemptor's class ``preempts``; every victim is of the same queue
      and of strictly lower priority.
    * ``RECLAIM``: the preemptor's queue has a quota and a cohort and stays within its
      nominal after taking the gang (counting its other gangs waiting for victims); every
      victim is of another queue of that cohort or of a cohort of the same cohort tree
      (:mod:`synapse_ha.core.queues.cohort_tree`), which is above its nominal and stays at or
      above it once every victim of this command and earlier ones has stopped.
    * ``FAIR_SHARE``: the rules of :mod:`synapse_ha.core.queues.fair_preemption` (a cohort
      with the switch on where the queues meet, borrowing victims kept at or above their
      nominal and at or above the preemptor's share, the gang within its quota after).

    And no victim is within its minimum run time at the command's time, unless the
    command is a reclaim whose preemptor has waited past ``reclaim_wait_max_ms``
    (:mod:`synapse_ha.core.queues.victim_rules`).

    These rules make thrashing impossible: a victim is always of strictly lower
    priority, or of a queue that is borrowing, and a reclaim never takes the preemptor's
    queue above nominal, so a reclaimed gang can never reclaim back; the minimum run
    time bounds how often one gang can be stopped at all.
    """
    found = _preemptor_and_victims(state, c)
    if isinstance(found, Result):
        return found
    preemptor, victims = found
    if c.kind is PreemptionKind.PRIORITY:
        problem = _priority_problem(state, preemptor, victims)
    elif c.kind is PreemptionKind.FAIR_SHARE:
        problem = fair_share_problem(state, preemptor, victims, now)
    else:
        problem = _reclaim_problem(state, preemptor, victims)
    problem = problem or protection_problem(state, preemptor, c.kind, victims, now)
    if problem:
        return error(ResultCode.CONFLICT, problem)
    names = [job.job_id for job in victims]
    for job in victims:
        attempt = job.attempt
        assert attempt is not None
        grace = grace_ms(state.config, job.spec)
        attempt.preempted_by = c.preemptor
        attempt.preemption = c.kind
        attempt.preempt_deadline_ms = now + grace
        job.reason = reason(
            ReasonCode.PREEMPTING,
            preemptor=c.preemptor,
            kind=c.kind.value,
            grace_ms=grace,
            deadline_ms=now + grace,
        )
    preemptor.reason = reason(
        ReasonCode.WAITING_FOR_VICTIMS,
        count=len(victims),
        kind=c.kind.value,
        victims=", ".join(names),
    )
    return ok(
        f"{c.preemptor} preempts {len(victims)} gang(s) ({c.kind.value})",
        job_id=c.preemptor,
        stopped=tuple(names),
    )


def _preemptor_and_victims(state: ClusterState, c: cmd.Preempt) -> tuple[Job, list[Job]] | Result:
    """The preemptor and its victims, once the command names them rightly: preemption
    is on, the preemptor is pending and planned against its current attempt count, each
    victim is named once, is live with the named fencing token and not already being
    preempted. Otherwise the error to return."""
    if state.config.preemption is PreemptionMode.OFF:
        return error(ResultCode.CONFLICT, "preemption is off in the cluster configuration")
    preemptor = state.jobs.get(c.preemptor)
    if preemptor is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.preemptor!r}")
    if preemptor.state is not JobState.PENDING:
        return error(ResultCode.CONFLICT, f"{c.preemptor} is {preemptor.state.value}, not PENDING")
    if preemptor.attempts_made != c.preemptor_attempts_made:
        return error(ResultCode.CONFLICT, f"{c.preemptor}: stale plan")
    if not c.victims:
        return error(ResultCode.INVALID, "victims: at least one is needed")
    names = [v.job_id for v in c.victims]
    if len(set(names)) != len(names):
        return error(ResultCode.INVALID, "victims: a job appears twice")
    if c.preemptor in names:
        return error(ResultCode.INVALID, "victims: the preemptor cannot be its own victim")
    victims: list[Job] = []
    for v in c.victims:
        job = state.jobs.get(v.job_id)
        attempt = job.live_attempt() if job is not None else None
        if job is None or attempt is None or attempt.fencing_token != v.fencing_token:
            return error(
                ResultCode.CONFLICT, f"victim {v.job_id}: token {v.fencing_token} is not live"
            )
        if attempt.preempted_by:
            return error(
                ResultCode.CONFLICT,
                f"victim {v.job_id} is already being preempted by {attempt.preempted_by}",
            )
        victims.append(job)
    return preemptor, victims


def _priority_problem(state: ClusterState, preemptor: Job, victims: list[Job]) -> str:
    """Why a priority preemption of ``victims`` for ``preemptor`` breaks the rules; ""
    if it does not."""
    spec = preemptor.spec
    cls = priority_class(state.config, spec.priority_class)
    if cls is None or not cls.preempts:
        return (
            f"{preemptor.job_id}: its priority class {spec.priority_class or '(none)'} "
            f"does not preempt"
        )
    for job in victims:
        if job.spec.queue != spec.queue:
            return (
                f"victim {job.job_id} is in queue {job.spec.queue}, not {spec.queue}: "
                f"priority preemption stays within one queue"
            )
        if job.spec.priority >= spec.priority:
            return (
                f"victim {job.job_id} has priority {job.spec.priority}, not below {spec.priority}"
            )
    return ""


def _reclaim_problem(state: ClusterState, preemptor: Job, victims: list[Job]) -> str:
    """Why a reclaim of ``victims`` for ``preemptor`` breaks the rules; "" if it does not."""
    spec = preemptor.spec
    queue = state.queues.get(spec.queue)
    if queue is None or queue.gpu is None or not queue.cohort:
        return f"queue {spec.queue} has no quota in a cohort: it cannot reclaim"
    keeps = QueueUsage.kept_after_reclaims(state, besides=preemptor.job_id)
    need = gang_request(spec).gpu
    if not keeps.within_nominal(spec.queue, need):
        return (
            f"queue {spec.queue} would use {keeps.used(spec.queue).gpu + need} of its "
            f"{queue.gpu} nominal GPUs: a reclaim must keep it within its nominal quota"
        )
    tree = root_of(queue.cohort, state.cohorts)
    for job in victims:
        other = state.queues.get(job.spec.queue)
        if (
            job.spec.queue == spec.queue
            or other is None
            or not other.cohort
            or root_of(other.cohort, state.cohorts) != tree
        ):
            return f"victim {job.job_id} is not in another queue of the cohort tree of {tree}"
        attempt = job.live_attempt()
        if attempt is not None:  # what the victim's queue is charged for until it stops
            held = held_request(
                job, attempt, counting_leaving=False, by_members=charges_members(state)
            )
            keeps.remove(job.spec.queue, held)
    for name in sorted({job.spec.queue for job in victims}):
        nominal = state.queues[name].gpu
        if nominal is None or keeps.used(name).gpu < nominal:
            return (
                f"queue {name} would fall below its nominal quota: a reclaim takes only "
                f"what a queue borrows"
            )
    return ""


def _touches_gangs(state: ClusterState, c: cmd.Preempt, changes: Changes) -> None:
    job_and_its_nodes(state, c.preemptor, changes)
    for victim in c.victims:
        job_and_its_nodes(state, victim.job_id, changes)


HANDLERS: dict[type, Handling] = {
    cmd.Preempt: Handling(_preempt, _touches_gangs),
}
