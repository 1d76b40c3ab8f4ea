"""Dependencies in the state machine (core/dependencies.py): checked when a job is
submitted, resolved when a job depended on starts or finishes.

At submission every job named must exist, and a dependency that can already never be
met is refused (the submission changes nothing). Those already met are left out of the
new job's ``waiting_for``; the job is added to the ``dependants`` of each job it still
waits for. From then on :func:`settle` runs at each start and finish of a job (from
:func:`~synapse_ha.core.machine.attempts.finish` and the first member report): the jobs
waiting on it have the dependency marked met, or are cancelled when it can never be, and
so on down a chain of dependants (a worklist, never recursion).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from synapse_ha.core.dependencies import DependencyKind, describe_wait
from synapse_ha.core.model import ClusterState, Job, JobSpec, JobState
from synapse_ha.core.reasons import PENDING_FIRST_PASS, Reason, ReasonCode, reason


class Outcome(enum.Enum):
    WAITING = "waiting"
    MET = "met"
    NEVER = "never"


def outcome(kind: str, other: Job) -> Outcome:
    """Whether a dependency of ``kind`` on ``other`` is met, may still be, or never will."""
    state = other.state
    if kind == DependencyKind.AFTER:
        started = other.attempt is not None and other.attempt.started_at_ms is not None
        if started:
            return Outcome.MET
        return Outcome.NEVER if state.finished else Outcome.WAITING
    if not state.finished:
        return Outcome.WAITING
    if kind == DependencyKind.AFTER_ANY:
        return Outcome.MET
    succeeded = state is JobState.SUCCEEDED
    if kind == DependencyKind.AFTER_OK:
        return Outcome.MET if succeeded else Outcome.NEVER
    return Outcome.NEVER if succeeded else Outcome.MET


def submission_problem(state: ClusterState, spec: JobSpec) -> tuple[str, str] | None:
    """``(field, rule)`` when ``spec``'s dependencies refuse the submission in ``state``
    (a job that does not exist, or one whose dependency can already never be met)."""
    if spec.dependencies is None:
        return None
    for kind, job_id in spec.dependencies.pairs():
        field = f"dependencies.{kind}"
        other = state.jobs.get(job_id)
        if other is None:
            return field, f"no job {job_id} (unknown, or finished and already purged)"
        if outcome(kind, other) is Outcome.NEVER:
            return field, (
                f"{job_id} {other.state.value.lower()}, so this dependency can never be met"
            )
    return None


def register(state: ClusterState, job: Job) -> None:
    """Record a new job's dependencies: those not met yet in its ``waiting_for`` (its
    reason says what it waits for), itself in each such job's ``dependants``."""
    if job.spec.dependencies is None:
        return
    waiting = tuple(
        (kind, job_id)
        for kind, job_id in job.spec.dependencies.pairs()
        if outcome(kind, state.jobs[job_id]) is Outcome.WAITING
    )
    job.waiting_for = waiting
    for job_id in dict.fromkeys(job_id for _, job_id in waiting):
        other = state.jobs[job_id]
        other.dependants = (*other.dependants, job.job_id)
    if waiting:
        job.reason = waiting_reason(waiting)


def waiting_reason(waiting: tuple[tuple[str, str], ...]) -> Reason:
    return reason(ReasonCode.DEPENDENCY, waiting=describe_wait(waiting), count=len(waiting))


Cancel = Callable[[Job, Reason], None]


def settle(state: ClusterState, changed: Job, cancel: Cancel, now: int) -> None:
    """``changed`` started or finished: resolve the dependencies on it of every job that
    waits, cancelling (with ``cancel``) those that can never run, and then theirs."""
    work = [changed]
    while work:
        job = work.pop()
        for dependant_id in job.dependants:
            dependant = state.jobs.get(dependant_id)
            if dependant is None or dependant.state is not JobState.PENDING:
                continue
            never = _resolve(dependant, job, now)
            if never is None:
                continue
            kind, _ = never
            why = reason(
                ReasonCode.DEPENDENCY_NEVER_SATISFIED,
                job=job.job_id,
                kind=kind,
                state=job.state.value.lower(),
            )
            cancel(dependant, why)
            work.append(dependant)


def _resolve(dependant: Job, job: Job, now: int) -> tuple[str, str] | None:
    """Drop ``dependant``'s dependencies on ``job`` that are met; the first that never
    will be, if any (then nothing is changed)."""
    remaining = []
    for kind, job_id in dependant.waiting_for:
        if job_id != job.job_id:
            remaining.append((kind, job_id))
            continue
        result = outcome(kind, job)
        if result is Outcome.NEVER:
            return kind, job_id
        if result is Outcome.WAITING:
            remaining.append((kind, job_id))
    waiting = tuple(remaining)
    if waiting != dependant.waiting_for:
        dependant.waiting_for = waiting
        if waiting:
            dependant.reason = waiting_reason(waiting)
        elif dependant.retry_not_before_ms > now:  # its begin time is still to come
            dependant.reason = reason(ReasonCode.BEGIN_TIME, at_ms=dependant.retry_not_before_ms)
        else:
            dependant.reason = PENDING_FIRST_PASS
    return None
