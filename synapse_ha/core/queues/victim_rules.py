"""Who may be a preemption victim, and what preempting it costs (DESIGN §8). Pure.

**Cost.** A victim loses the work done since the point its whole gang can resume from:
its attempt's checkpoint mark (:func:`synapse_ha.core.workflows.checkpoints.attempt_mark`, the
oldest of its members' newest marks) or, without one, the bind of its attempt. The cost
of preempting it now is its GPUs x that time (:func:`lost_gpu_ms`), so the victim search
prefers gangs that have just checkpointed; a gang whose every member marks a checkpoint
during its grace period loses nothing more (its next attempt resumes from that mark).

**Minimum run time** (the anti-thrash rule). A gang is not a victim until it has run
``min_runtime_ms`` since the bind of its attempt: the longer of its priority class's and
its queue's (:func:`protected_until_ms`; 0, the default, protects nothing). It is counted
from the bind, not from the newest mark: a mark makes a gang cheaper to preempt, never
safer, or a gang that checkpoints every few minutes could never be preempted at all. A
requeued victim is protected again for the whole minimum once it is bound anew, so every
attempt of a job makes at least that much progress before any preemption can stop it.

The one exception is a reclaim that has waited too long: a gang reclaiming its queue's
nominal quota that has been queued for ``ClusterConfig.reclaim_wait_max_ms`` (10 min by
default) may preempt gangs still within their minimum (:func:`reclaim_overdue`), so a
queue is never kept below its nominal quota for longer than that by protected
borrowers. A priority or fair-share preemption never overrides the minimum.

The scheduler applies these rules when it searches for victims, and ``apply`` verifies
them again (:func:`protection_problem`) at the command's time, which is never earlier
than the plan's: a protection that had ended when the plan was made has ended at apply.
"""

from __future__ import annotations

from synapse_ha.core.cluster_config import PreemptionKind
from synapse_ha.core.model import Attempt, ClusterState, Job, JobSpec
from synapse_ha.core.queues.quota import priority_class
from synapse_ha.core.workflows.checkpoints import attempt_mark


def resume_point_ms(attempt: Attempt) -> int:
    """Since when a victim's work would be lost: its attempt's mark, else its bind."""
    mark = attempt_mark(attempt.marks, len(attempt.members))
    return attempt.bound_at_ms if mark is None else max(mark.at_ms, attempt.bound_at_ms)


def lost_gpu_ms(attempt: Attempt, gpus: int, now_ms: int) -> int:
    """GPU-milliseconds lost if the gang (``gpus`` in all) of ``attempt`` stops now."""
    return gpus * max(now_ms - resume_point_ms(attempt), 0)


def min_runtime_ms(state: ClusterState, spec: JobSpec) -> int:
    """How long a gang of ``spec`` runs before it may be a victim: the longer of its
    priority class's and its queue's minimum."""
    cls = priority_class(state.config, spec.priority_class)
    own = cls.min_runtime_ms if cls is not None else 0
    queue = state.queues.get(spec.queue)
    return max(own, queue.min_runtime_ms if queue is not None else 0)


def protected_until_ms(state: ClusterState, job: Job, attempt: Attempt) -> int:
    """Until when the gang of ``attempt`` may not be a victim (its bind plus its
    minimum run time)."""
    return attempt.bound_at_ms + min_runtime_ms(state, job.spec)


def pending_since(job: Job) -> int:
    """When the job joined the queue for its next attempt."""
    return max(job.submitted_at_ms, job.retry_not_before_ms)


def reclaim_due_ms(state: ClusterState, preemptor: Job) -> int:
    """From when ``preemptor``'s reclaim may preempt gangs within their minimum run
    time."""
    return pending_since(preemptor) + state.config.reclaim_wait_max_ms


def reclaim_overdue(state: ClusterState, preemptor: Job, now_ms: int) -> bool:
    """Whether ``preemptor``'s reclaim has waited long enough to preempt gangs within
    their minimum run time."""
    return now_ms >= reclaim_due_ms(state, preemptor)


def protection_problem(
    state: ClusterState,
    preemptor: Job,
    kind: PreemptionKind,
    victims: list[Job],
    now_ms: int,
) -> str:
    """Why preempting ``victims`` for ``preemptor`` at ``now_ms`` breaks the minimum
    run time; "" if it does not."""
    if kind is PreemptionKind.RECLAIM and reclaim_overdue(state, preemptor, now_ms):
        return ""
    for job in victims:
        attempt = job.live_attempt()
        if attempt is None:
            continue
        until = protected_until_ms(state, job, attempt)
        if now_ms < until:
            return (
                f"victim {job.job_id} is within its minimum run time for another "
                f"{(until - now_ms + 999) // 1000}s (min_runtime of its class or queue)"
            )
    return ""
