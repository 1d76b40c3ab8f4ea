"""How an attempt ends and what its job does next (finish, retry after a back-off,
requeue, go back to PENDING after a preemption), shared by every command that ends
one; and what draining nodes become once their members have left."""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable

from synapse_ha.core import lifecycle as lc
from synapse_ha.core.lifecycle import ATTEMPT, NODE, move, move_job
from synapse_ha.core.machine.apply_checkpoints import keep_resume_step
from synapse_ha.core.machine.apply_dependencies import settle
from synapse_ha.core.model import (
    ZERO,
    ClusterState,
    Job,
    JobSpec,
    LostAttempt,
    MemberState,
    NodeStatus,
)
from synapse_ha.core.queues.fairshare import add_usage
from synapse_ha.core.queues.quota import gang_request
from synapse_ha.core.reasons import (
    FAILURE_CODES,
    REQUEUE_CODES,
    Reason,
    ReasonCode,
    reason,
)
from synapse_ha.core.spec.member_limits import reserved_of


def lost_attempt(job: Job, node_id: str) -> LostAttempt:
    """The record kept of the live attempt about to be ended by ``node_id``'s death: its
    ranks' nodes and the ranks already known to have exited 0 (a live attempt's exited
    members all exited 0 by their own program, or it would have ended already)."""
    attempt = job.attempt
    assert attempt is not None
    return LostAttempt(
        number=attempt.number,
        fencing_token=attempt.fencing_token,
        node_id=node_id,
        nodes=tuple(m.node_id for m in attempt.members),
        exited_zero=tuple(
            rank
            for rank, s in enumerate(attempt.member_status)
            if s.state is MemberState.EXITED and s.exit_code == 0
        ),
    )


def end_attempt(
    state: ClusterState, job: Job, event: lc.AttemptEvent, outcome: Reason, now: int
) -> None:
    """Release what the live attempt holds and record how it ended.

    With ``ClusterConfig.hold_until_stopped`` a member not yet confirmed stopped keeps
    its share reserved on its node (``Attempt.held``) until :func:`release_held` frees it:
    its exit is reported or its node declared dead. Otherwise the next gang could be
    bound to a GPU whose old member is still stopping (DESIGN §4)."""
    attempt = job.attempt
    assert attempt is not None
    attempt.state = move(ATTEMPT, attempt.state, event)
    hold = state.config.hold_until_stopped
    reserved = reserved_of(job)
    held: list[int] = []
    # Ranks lost and known stopped freed their share already (core/machine/replacement.py).
    freed = {v.rank for v in attempt.vacancies if v.stopped} if attempt.vacancies else ()
    for member, status in zip(attempt.members, attempt.member_status, strict=True):
        node = state.nodes.get(member.node_id)
        if node is None or member.rank in freed:
            continue
        if hold and status.state is not MemberState.EXITED and node.status is not NodeStatus.DEAD:
            held.append(member.rank)  # still reserved until confirmed stopped
            continue
        node.allocated = node.allocated - reserved
        node.allocated_gpus.difference_update(member.gpus)
    attempt.held = tuple(held)
    master = state.nodes.get(attempt.members[0].node_id)
    if master is not None:
        ports = master.master_ports
        i = bisect.bisect_left(ports, attempt.master_port)
        if i < len(ports) and ports[i] == attempt.master_port:
            del ports[i]
    attempt.ended_at_ms = now
    attempt.outcome = outcome
    keep_resume_step(job)
    # Fair share: the queue's decayed usage grows by what this attempt held, for as long.
    queue = job.spec.queue
    new = queue not in state.queue_history
    state.queue_history[queue] = add_usage(
        state.queue_history.get(queue),
        gang_request(job.spec),
        now - attempt.bound_at_ms,
        now,
        state.config.fair_share_half_life_ms,
    )
    if new:
        state.queue_history = dict(sorted(state.queue_history.items()))


def release_held(state: ClusterState, job: Job, rank: int) -> bool:
    """Free the share rank ``rank`` of the job's ended attempt still holds, if it holds
    one: its member is confirmed stopped or its node is dead. True if it held one."""
    attempt = job.attempt
    if attempt is None or rank not in attempt.held:
        return False
    member = attempt.members[rank]
    node = state.nodes.get(member.node_id)
    if node is not None:
        node.allocated = node.allocated - reserved_of(job)
        node.allocated_gpus.difference_update(member.gpus)
    attempt.held = tuple(r for r in attempt.held if r != rank)
    return True


def finish(state: ClusterState, job: Job, event: lc.JobEvent, why: Reason, now: int) -> None:
    """End ``job`` for good (``event`` leads to a final state), and resolve the
    dependencies of the jobs that wait on it (cancelling those that can never run)."""
    _final(state, job, event, why, now)
    settle_dependants(state, job, now)


def settle_dependants(state: ClusterState, job: Job, now: int) -> None:
    """``job`` started or finished: resolve the dependencies of the jobs waiting on it
    (or, for a task, on its array)."""
    if job.dependants or job.array_id:
        cancel = lambda waiting, never: _final(state, waiting, lc.JobEvent.CANCEL, never, now)  # noqa: E731
        settle(state, job, cancel, now)


def _final(state: ClusterState, job: Job, event: lc.JobEvent, why: Reason, now: int) -> None:
    move_job(state, job, event)
    job.reason = why
    job.finished_at_ms = now
    job.lost_attempt = None  # kept only while the job is not final
    job.waiting_for = ()  # a final job waits for nothing (it may be cancelled waiting)


def retry_delay_ms(spec: JobSpec, attempt_number: int, seed: int, job_id: str) -> int:
    """Exponential back-off with full jitter, deterministic for a given seed."""
    policy = spec.retries
    cap = min(policy.max_backoff_ms, policy.backoff_ms * 2 ** min(attempt_number - 1, 40))
    return random.Random(f"{seed}:{job_id}:{attempt_number}").randint(0, max(cap, 0))


def end_attempt_for(state: ClusterState, job: Job, outcome: Reason, seed: int, now: int) -> None:
    """End the live attempt as ``outcome`` says: a disruption requeues the gang, anything
    else is the job's own failure and retries it."""
    if outcome.code in REQUEUE_CODES:
        requeue_attempt(state, job, outcome, now)
    else:
        fail_attempt_and_retry(state, job, outcome, seed, now)


def requeue_attempt(state: ClusterState, job: Job, cause: Reason, now: int) -> None:
    """Stop the whole gang after a disruption it did not cause (node death, fencing, a
    lost member; later preemption) and queue it again as a new attempt.

    The requeue does not touch ``retries.max`` and has no back-off: the gang keeps its
    place in line (its submission order) and may bind again at the next pass, once every
    member of this attempt is confirmed stopped (the fencing rule of
    :func:`unconfirmed_members`). Its locality wait counts from the requeue. A job
    already requeued ``max_requeues`` times fails instead: something about it keeps
    taking its nodes down.
    """
    attempt = job.attempt
    assert attempt is not None
    end_attempt(state, job, lc.AttemptEvent.REQUEUE, cause, now)
    limit = state.config.max_requeues
    if job.requeues >= limit:
        finish(
            state,
            job,
            lc.JobEvent.FAIL,
            reason(
                ReasonCode.FAILED_MAX_REQUEUES,
                cause,
                attempt=attempt.number,
                requeues=job.requeues,
                max_requeues=limit,
            ),
            now,
        )
        return
    job.requeues += 1
    move_job(state, job, lc.JobEvent.REQUEUE)
    job.retry_not_before_ms = now
    job.reason = reason(
        REQUEUE_CODES[cause.code],
        cause,
        attempt=attempt.number,
        requeue=job.requeues,
        max_requeues=limit,
    )


def end_preempted(state: ClusterState, job: Job, now: int) -> None:
    """End a preempted attempt whose members are confirmed stopped (or whose node died):
    its resources are released only now, and the gang goes back to PENDING keeping its
    submission order, counted against neither ``retries.max`` nor ``max_requeues``."""
    attempt = job.attempt
    assert attempt is not None and attempt.preemption is not None
    outcome = reason(
        ReasonCode.PREEMPTED, preemptor=attempt.preempted_by, kind=attempt.preemption.value
    )
    end_attempt(state, job, lc.AttemptEvent.REQUEUE, outcome, now)
    move_job(state, job, lc.JobEvent.REQUEUE)
    job.retry_not_before_ms = now
    job.reason = reason(
        ReasonCode.REQUEUED_PREEMPTED,
        outcome,
        attempt=attempt.number,
        preemptor=attempt.preempted_by,
        kind=attempt.preemption.value,
    )


def requeue_on_request(state: ClusterState, job: Job, text: str, now: int) -> None:
    """Stop the live attempt of ``job`` because its owner or an operator asked for a
    requeue, and queue the job again keeping its submission order: counted against
    neither ``retries.max`` nor ``max_requeues`` (a job that requeues itself before its
    time limit may do so any number of times). The next attempt binds once every member
    of this one is confirmed stopped, as after any requeue."""
    attempt = job.attempt
    assert attempt is not None
    outcome = reason(ReasonCode.REQUEUE_REQUESTED, text=text)
    end_attempt(state, job, lc.AttemptEvent.REQUEUE, outcome, now)
    move_job(state, job, lc.JobEvent.REQUEUE)
    job.retry_not_before_ms = now
    job.reason = reason(ReasonCode.REQUEUED_BY_REQUEST, outcome, attempt=attempt.number)


def fail_attempt_and_retry(state: ClusterState, job: Job, why: Reason, seed: int, now: int) -> None:
    """Stop the whole gang; retry it as a new attempt later, or fail the job for good."""
    end_attempt(state, job, lc.AttemptEvent.FAIL, why, now)
    number = job.attempts_made
    if job.retries_used < job.spec.retries.max_retries:
        delay = retry_delay_ms(job.spec, number, seed, job.job_id)
        job.retries_used += 1
        move_job(state, job, lc.JobEvent.RETRY)
        job.retry_not_before_ms = now + delay
        job.reason = reason(
            ReasonCode.RETRY_BACKOFF,
            why,
            attempt=number,
            retry=job.retries_used,
            retries=job.spec.retries.max_retries,
            backoff_ms=delay,
        )
    else:
        code = FAILURE_CODES.get(why.code, ReasonCode.FAILED_ATTEMPT)
        finish(
            state,
            job,
            lc.JobEvent.FAIL,
            reason(code, why, attempt=number, retries=job.retries_used),
            now,
        )


def settle_drained(state: ClusterState, node_ids: Iterable[str]) -> None:
    """Draining nodes among ``node_ids`` that hold no members any more become cordoned.

    A node holds members while a live attempt has one on it, or an ended attempt has one
    on it not yet confirmed stopped. Called wherever members leave a node.
    """
    for node_id in node_ids:
        node = state.nodes.get(node_id)
        if node is None or node.status is not NodeStatus.DRAINING:
            continue
        if node.allocated != ZERO or node.allocated_gpus or _has_unconfirmed(state, node_id):
            continue
        node.status = move(NODE, node.status, lc.NodeEvent.EMPTIED)


def _has_unconfirmed(state: ClusterState, node_id: str) -> bool:
    # The node index holds every job with a member there not known to have stopped.
    for job_id in state.jobs_on_node(node_id):
        attempt = state.jobs[job_id].attempt
        if attempt is None or attempt.ended_at_ms is None:
            continue
        for member, status in zip(attempt.members, attempt.member_status, strict=True):
            if member.node_id == node_id and status.state is not MemberState.EXITED:
                return True
    return False
