"""Dependencies in the state machine (core/workflows/dependencies.py): checked when a job is
submitted, resolved when a job depended on starts or finishes.

A dependency may name a job or an array (met once every task meets it:
:func:`array_outcome`). At submission every job named must exist, and a dependency that
can already never be met is refused (the submission changes nothing). Those already met
are left out of the new job's ``waiting_for``; the job is added to the ``dependants`` of
each job it still waits for. From then on :func:`settle` runs at each start and finish of
a job (from :func:`~synapse_ha.core.machine.attempts.finish` and the first member
report): the jobs waiting on it (or on its array) have the dependency marked met, or are
cancelled when it can never be, and so on down a chain of dependants (a worklist, never
recursion).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from synapse_ha.core.model import ArrayJob, ClusterState, Job, JobSpec, JobState
from synapse_ha.core.reasons import PENDING_FIRST_PASS, Reason, ReasonCode, reason
from synapse_ha.core.workflows.dependencies import DependencyKind, describe_wait


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


def array_outcome(kind: str, tasks: list[Job], changed: Job | None = None) -> Outcome:
    """Whether a dependency of ``kind`` on an array whose tasks are ``tasks`` is met: once
    every task meets it (``after``: every task started; ``afterok``: every task
    succeeded; ``afterany``: every task finished; ``afternotok``: every task finished
    and one did not succeed). ``afterok`` and ``after`` can never be met as soon as one
    task can never meet them.

    ``changed``: the task whose transition asks (None: a full look, at submission). A
    task that made the dependency impossible was looked at by its own transition, so
    after checking ``changed`` the look stops at the first task still on its way."""
    if kind == DependencyKind.AFTER_NOT_OK:
        if any(not task.state.finished for task in tasks):
            return Outcome.WAITING
        ok = all(task.state is JobState.SUCCEEDED for task in tasks)
        return Outcome.NEVER if ok else Outcome.MET
    if changed is not None and outcome(kind, changed) is Outcome.NEVER:
        return Outcome.NEVER
    result = Outcome.MET
    for task in tasks:
        one = outcome(kind, task)
        if one is Outcome.NEVER:
            return Outcome.NEVER
        if one is Outcome.WAITING:
            if changed is not None:
                return Outcome.WAITING
            result = Outcome.WAITING
    return result


def outcome_of(state: ClusterState, kind: str, target_id: str) -> Outcome | None:
    """:func:`outcome` of a dependency on a job or an array; None when neither exists."""
    job = state.jobs.get(target_id)
    if job is not None:
        return outcome(kind, job)
    array = state.arrays.get(target_id)
    if array is None:
        return None
    return array_outcome(kind, _tasks(state, array))


def _tasks(state: ClusterState, array: ArrayJob) -> list[Job]:
    """The array's tasks that still exist (finished ones leave with the retention)."""
    jobs = state.jobs
    return [jobs[task_id] for task_id in array.task_ids() if task_id in jobs]


def submission_problem(state: ClusterState, spec: JobSpec) -> tuple[str, str] | None:
    """``(field, rule)`` when ``spec``'s dependencies refuse the submission in ``state``
    (a job or array that does not exist, or one whose dependency can already never be
    met)."""
    if spec.dependencies is None:
        return None
    for kind, job_id in spec.dependencies.pairs():
        field = f"dependencies.{kind}"
        result = outcome_of(state, kind, job_id)
        if result is None:
            return field, f"no job {job_id} (unknown, or finished and already purged)"
        if result is Outcome.NEVER:
            other = state.jobs.get(job_id)
            said = other.state.value.lower() if other is not None else "has tasks that ended"
            return field, f"{job_id} {said}, so this dependency can never be met"
    return None


def register(state: ClusterState, jobs: list[Job]) -> None:
    """Record the dependencies of new jobs of one submission (one job, or an array's
    tasks, which share their spec): those not met yet in each one's ``waiting_for`` (its
    reason says what it waits for), the jobs in each such job's or array's
    ``dependants``."""
    deps = jobs[0].spec.dependencies if jobs else None
    if deps is None:
        return
    waiting = tuple(
        (kind, job_id)
        for kind, job_id in deps.pairs()
        if outcome_of(state, kind, job_id) is Outcome.WAITING
    )
    if not waiting:
        return
    why = waiting_reason(waiting)
    for job in jobs:
        job.waiting_for = waiting
        job.reason = why
    ids = tuple(job.job_id for job in jobs)
    for target_id in dict.fromkeys(job_id for _, job_id in waiting):
        other: Job | ArrayJob = state.jobs.get(target_id) or state.arrays[target_id]
        other.dependants = (*other.dependants, *ids)


def waiting_reason(waiting: tuple[tuple[str, str], ...]) -> Reason:
    return reason(ReasonCode.DEPENDENCY, waiting=describe_wait(waiting), count=len(waiting))


Cancel = Callable[[Job, Reason], None]
Judge = Callable[[str], Outcome]


def settle(state: ClusterState, changed: Job, cancel: Cancel, now: int) -> None:
    """``changed`` started or finished: resolve the dependencies on it (and on its array,
    for a task) of every job that waits, cancelling (with ``cancel``) those that can
    never run, and then theirs."""
    work = [changed]
    while work:
        job = work.pop()
        for target_id, dependants, judge, said in _targets(state, job):
            for dependant_id in dependants:
                dependant = state.jobs.get(dependant_id)
                if dependant is None or dependant.state is not JobState.PENDING:
                    continue
                kind = _resolve(dependant, target_id, judge, now)
                if kind is None:
                    continue
                why = reason(
                    ReasonCode.DEPENDENCY_NEVER_SATISFIED,
                    job=target_id,
                    kind=kind,
                    state=said(kind),
                )
                cancel(dependant, why)
                work.append(dependant)
            array = state.arrays.get(target_id)
            if array is not None:
                _forget_settled(state, array)


def _targets(
    state: ClusterState, job: Job
) -> list[tuple[str, tuple[str, ...], Judge, Callable[[str], str]]]:
    """What a transition of ``job`` may resolve: dependencies on it, and on its array
    (with how each is judged and how its state is said when it can never be met)."""
    targets: list[tuple[str, tuple[str, ...], Judge, Callable[[str], str]]] = []
    if job.dependants:
        targets.append(
            (
                job.job_id,
                job.dependants,
                lambda kind: outcome(kind, job),
                lambda kind: job.state.value.lower(),
            )
        )
    array = state.arrays.get(job.array_id) if job.array_id else None
    if array is not None and array.dependants:
        # The array's outcome of a kind is the same for every dependant: worked out once,
        # from its tasks looked up only when a dependant asks.
        judged: dict[str, Outcome] = {}
        tasks: list[Job] = []

        def judge(kind: str) -> Outcome:
            if kind not in judged:
                if not tasks:
                    tasks.extend(_tasks(state, array))
                judged[kind] = array_outcome(kind, tasks, job)
            return judged[kind]

        targets.append(
            (
                array.array_id,
                array.dependants,
                judge,
                lambda kind: (
                    "succeeded"
                    if kind == DependencyKind.AFTER_NOT_OK
                    else f"{job.state.value.lower()} in task {job.job_id}"
                ),
            )
        )
    return targets


def _forget_settled(state: ClusterState, array: ArrayJob) -> None:
    """Keep in the array's ``dependants`` only the jobs that still wait on it, so that the
    transitions of its other tasks do not look at them again."""
    jobs = state.jobs
    array.dependants = tuple(
        d
        for d in array.dependants
        if (w := jobs.get(d)) is not None
        and w.state is JobState.PENDING
        and any(target == array.array_id for _, target in w.waiting_for)
    )


def _resolve(dependant: Job, target_id: str, judge: Judge, now: int) -> str | None:
    """Drop ``dependant``'s dependencies on ``target_id`` that are met; the kind of the
    first that never will be, if any (then nothing is changed)."""
    remaining = []
    for kind, job_id in dependant.waiting_for:
        if job_id != target_id:
            remaining.append((kind, job_id))
            continue
        result = judge(kind)
        if result is Outcome.NEVER:
            return kind
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
