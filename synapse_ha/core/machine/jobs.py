"""Job commands: submission (idempotent by request id), cancellation, and the
leader's decisions that end a live attempt (start timeout, time limit) or purge
finished jobs."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.feasibility import REFUSES_AT_FORMAT, shortfall
from synapse_ha.core.job_predicates import time_limit_deadline
from synapse_ha.core.machine.apply_dependencies import register as register_dependencies
from synapse_ha.core.machine.apply_dependencies import submission_problem as dependency_problem
from synapse_ha.core.machine.attempts import (
    end_attempt,
    end_attempt_for,
    end_preempted,
    finish,
    requeue_on_request,
    settle_drained,
)
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes, one_job
from synapse_ha.core.model import (
    ArrayJob,
    Attempt,
    ClusterState,
    Job,
    JobSpec,
    JobState,
)
from synapse_ha.core.queues.job_rules import check_job_queue
from synapse_ha.core.queues.quota import priority_class
from synapse_ha.core.reasons import ReasonCode, reason
from synapse_ha.core.spec.member_limits import NO_RULES, rules_in_force
from synapse_ha.core.spec.validation import Violation, check_job_spec, describe
from synapse_ha.core.views import not_started_members, replace_timeout_reason
from synapse_ha.core.workflows.arrays import parse_array, task_id, throttle_reason
from synapse_ha.core.workflows.windows import resolved


def _submit_job(state: ClusterState, c: cmd.SubmitJob, now: int) -> Result:
    if not c.request_id:
        return error(ResultCode.INVALID, "request_id: must not be empty")
    existing = state.request_ids.get(c.request_id)
    if existing is not None:
        return ok("duplicate request: returning the existing job", job_id=existing)
    violations = check_job_spec(c.spec, state.config.topology_levels)
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    spec, problems = _resolve_queue_and_class(state, c.spec)
    if problems:
        return error(ResultCode.INVALID, describe(problems))
    spec = _singleton(state, spec, c.owner)
    problem = (
        dependency_problem(state, spec)
        or _window_problem(spec, now)
        or _never_fits(state, spec)
        or _over_member_cap(state, spec)
    )
    if problem is not None:
        return error(ResultCode.INVALID, f"{problem[0]}: {problem[1]}")
    seq = state.next_job_seq
    job_id = f"job-{seq:06d}"
    state.next_job_seq = seq + 1
    state.request_ids[c.request_id] = job_id
    if spec.array:
        return _submit_array(state, c, spec, job_id, now)
    job = Job(
        job_id=job_id,
        spec=spec,
        request_id=c.request_id,
        seq=seq,
        submitted_at_ms=now,
        owner=c.owner,
    )
    state.jobs[job_id] = job
    _open_window(job)
    register_dependencies(state, [job])
    return ok(f"submitted {job_id}", job_id=job_id, created=True)


def _singleton(state: ClusterState, spec: JobSpec, owner: str) -> JobSpec:
    """A singleton job's spec with every earlier unfinished job of its owner and name
    (array tasks one by one) added to its ``afterany`` (Slurm's ``--dependency=singleton``).
    Every job is looked at, which only singleton submissions pay for."""
    deps = spec.dependencies
    if deps is None or not deps.singleton:
        return spec
    named = {job_id for _, job_id in deps.pairs()}
    earlier = sorted(
        (job.seq, job.job_id)
        for job in state.jobs.values()
        if job.owner == owner
        and job.spec.name == spec.name
        and not job.state.finished
        and job.job_id not in named
    )
    more = tuple(job_id for _, job_id in earlier)
    return dataclasses.replace(
        spec, dependencies=dataclasses.replace(deps, after_any=(*deps.after_any, *more))
    )


def _submit_array(
    state: ClusterState, c: cmd.SubmitJob, spec: JobSpec, array_id: str, now: int
) -> Result:
    """One command, the whole array: its record and a pending job per task, sharing the
    spec (the text was checked with the spec)."""
    plan = parse_array(spec.array)
    seq = state.next_job_seq - 1
    state.arrays[array_id] = ArrayJob(
        array_id=array_id,
        spec=spec,
        request_id=c.request_id,
        seq=seq,
        submitted_at_ms=now,
        indices=plan.indices,
        throttle=plan.throttle,
        owner=c.owner,
    )
    tasks: list[Job] = []
    waits = throttle_reason(state.arrays[array_id])  # past the throttle's first slots
    for index in plan.indices:
        task = Job(
            job_id=task_id(array_id, index),
            spec=spec,
            request_id=c.request_id,
            seq=seq,
            submitted_at_ms=now,
            owner=c.owner,
            array_id=array_id,
            array_index=index,
        )
        if plan.throttle and len(tasks) >= plan.throttle:
            task.reason = waits
        state.jobs[task.job_id] = task
        _open_window(task)
        tasks.append(task)
    register_dependencies(state, tasks)
    return ok(f"submitted array {array_id} of {len(tasks)} task(s)", job_id=array_id, created=True)


def _window_problem(spec: JobSpec, now: int) -> tuple[str, str] | None:
    """A deadline that has passed at submission (or comes before the begin time)."""
    deadline = resolved(spec.deadline_at_ms, spec.deadline_delay_ms, now)
    if deadline and deadline <= now:
        return "deadline", "has already passed"
    if deadline and deadline <= resolved(spec.begin_at_ms, spec.begin_delay_ms, now):
        return "deadline", "must come after begin"
    return None


def _never_fits(state: ClusterState, spec: JobSpec) -> tuple[str, str] | None:
    """A gang no set of the cluster's nodes could ever hold (core/feasibility.py), unless
    it asks to wait for nodes to join; an array's tasks share the spec, so the whole array
    is refused once. Only once every replica refuses it alike (the format floor)."""
    if spec.wait_for_nodes or state.format_floor < REFUSES_AT_FORMAT:
        return None
    short = shortfall(state, spec)
    if short is None:
        return None
    return short.field, (
        f"the job can never fit this cluster: {short.refusal()} (to wait for nodes that will "
        "join, submit it with wait_for_nodes: true, or sbatch --wait-for-nodes)"
    )


def _over_member_cap(state: ClusterState, spec: JobSpec) -> tuple[str, str] | None:
    """A gang with more members than its owner may run at once (core/spec/member_limits.py):
    it could never start, whoever else runs. Arrays count task by task, so a task's own
    gang is what counts."""
    rules = rules_in_force(state)
    if rules is NO_RULES:
        return None
    running_cap, _ = rules.caps(state.queues.get(spec.queue))
    if spec.replicas <= running_cap.allowed:
        return None
    return "replicas", (
        f"the gang has {spec.replicas} members and {running_cap.named()} allows a user "
        f"{running_cap.allowed} running at once: it could never start"
    )


def _open_window(job: Job) -> None:
    """A new job with a begin time is not considered before it."""
    spec = job.spec
    begin = resolved(spec.begin_at_ms, spec.begin_delay_ms, job.submitted_at_ms)
    if begin > job.submitted_at_ms:
        job.retry_not_before_ms = begin
        job.reason = reason(ReasonCode.BEGIN_TIME, at_ms=begin)


def deadline_of(job: Job) -> int:
    """When ``job`` gives up if still pending (0: never)."""
    spec = job.spec
    return resolved(spec.deadline_at_ms, spec.deadline_delay_ms, job.submitted_at_ms)


def _expire_deadline(state: ClusterState, c: cmd.ExpireDeadline, now: int) -> Result:
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    deadline = deadline_of(job)
    if job.state is not JobState.PENDING or not deadline:
        return error(ResultCode.CONFLICT, f"{c.job_id} is {job.state.value}, not waiting")
    if now < deadline:
        return error(ResultCode.CONFLICT, f"{c.job_id} has not reached its deadline")
    finish(state, job, lc.JobEvent.CANCEL, reason(ReasonCode.DEADLINE, at_ms=deadline), now)
    return ok(f"{c.job_id} cancelled at its deadline", job_id=c.job_id)


def _resolve_queue_and_class(state: ClusterState, spec: JobSpec) -> tuple[JobSpec, list[Violation]]:
    """The spec as stored, once :func:`check_job_queue` finds nothing wrong with its queue
    and class: a class's value replaces ``priority``."""
    violations = check_job_queue(spec, state.queues, state.config.priority_classes)
    cls = priority_class(state.config, spec.priority_class) if spec.priority_class else None
    if violations or cls is None:
        return spec, violations
    return dataclasses.replace(spec, priority=cls.value), []


def _cancel_job(state: ClusterState, c: cmd.CancelJob, now: int) -> Result:
    array = state.arrays.get(c.job_id)
    if array is not None:
        return _cancel_array(state, array, c, now)
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    if job.state is JobState.CANCELLED:
        return ok(f"{c.job_id} was already cancelled", job_id=c.job_id)
    if job.state.finished:
        return error(ResultCode.CONFLICT, f"{c.job_id} already finished as {job.state.value}")
    _cancel(state, job, c, now)
    return ok(f"{c.job_id} cancelled", job_id=c.job_id)


def _cancel_array(state: ClusterState, array: ArrayJob, c: cmd.CancelJob, now: int) -> Result:
    """Every unfinished task of the array is cancelled (finished ones keep their end)."""
    unfinished = [
        state.jobs[task]
        for task in array.task_ids()
        if task in state.jobs and not state.jobs[task].state.finished
    ]
    for job in unfinished:
        if not job.state.finished:  # a dependant cancelled on the way stays as it ended
            _cancel(state, job, c, now)
    return ok(f"{c.job_id}: {len(unfinished)} unfinished task(s) cancelled", job_id=c.job_id)


def _cancel(state: ClusterState, job: Job, c: cmd.CancelJob, now: int) -> None:
    attempt = job.live_attempt()
    if attempt is not None:
        end_attempt(
            state, job, lc.AttemptEvent.STOP, reason(ReasonCode.CANCELLED_BY, text=c.reason), now
        )
    finish(state, job, lc.JobEvent.CANCEL, reason(ReasonCode.CANCELLED, text=c.reason), now)
    job.cancelled_by = c.actor
    if attempt is not None:
        settle_drained(state, sorted({m.node_id for m in attempt.members}))


def _requeue_job(state: ClusterState, c: cmd.RequeueJob, now: int) -> Result:
    """Requeue a job that holds nodes, or every task of an array that does."""
    array = state.arrays.get(c.job_id)
    if array is not None:
        live = [
            state.jobs[task]
            for task in array.task_ids()
            if task in state.jobs and state.jobs[task].live_attempt() is not None
        ]
        for task in live:
            _requeue(state, task, c, now)
        return ok(f"{c.job_id}: {len(live)} running task(s) requeued", job_id=c.job_id)
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    if job.state.finished:
        return error(
            ResultCode.CONFLICT,
            f"{c.job_id} already finished as {job.state.value}: submit it again to rerun it",
        )
    if job.live_attempt() is None:
        return error(
            ResultCode.CONFLICT, f"{c.job_id} is {job.state.value}: it holds no nodes to requeue"
        )
    _requeue(state, job, c, now)
    return ok(f"{c.job_id} requeued", job_id=c.job_id)


def _requeue(state: ClusterState, job: Job, c: cmd.RequeueJob, now: int) -> None:
    attempt = job.live_attempt()
    assert attempt is not None
    requeue_on_request(state, job, c.reason, now)
    settle_drained(state, sorted({m.node_id for m in attempt.members}))


def _holding(state: ClusterState, job_id: str, token: int) -> tuple[Job, Attempt] | Result:
    """Job ``job_id`` and its live attempt when that attempt holds fencing ``token``;
    otherwise the error (NOT_FOUND without the job, CONFLICT for another token)."""
    job = state.jobs.get(job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {job_id!r}")
    attempt = job.live_attempt()
    if attempt is None or attempt.fencing_token != token:
        return error(ResultCode.CONFLICT, f"{job_id}: token {token} is not current")
    return job, attempt


def _fail_attempt(state: ClusterState, c: cmd.FailAttempt, now: int) -> Result:
    held = _holding(state, c.job_id, c.fencing_token)
    if isinstance(held, Result):
        return held
    job, attempt = held
    if attempt.preempted_by:
        if c.reason.code is ReasonCode.START_TIMEOUT:
            return error(
                ResultCode.CONFLICT,
                f"{c.job_id} is being preempted; its members stop within their grace period",
            )
        # The attempt was leaving anyway: it ends as preempted, not as a failure.
        end_preempted(state, job, now)
        settle_drained(state, sorted({m.node_id for m in attempt.members}))
        return ok(f"{c.job_id} attempt {attempt.number} ended (preempted)", job_id=c.job_id)
    if c.reason.code is ReasonCode.START_TIMEOUT:
        if not not_started_members(job):
            return error(ResultCode.CONFLICT, f"{c.job_id}: every member has started")
        if not not_started_members(job, now, state.config.start_timeout_ms):
            return error(ResultCode.CONFLICT, f"{c.job_id} has not reached its start timeout")
    if c.reason.code is ReasonCode.REPLACE_TIMEOUT and replace_timeout_reason(job, now) is None:
        return error(
            ResultCode.CONFLICT, f"{c.job_id} has no lost rank waiting past its replace.timeout"
        )
    end_attempt_for(state, job, c.reason, c.jitter_seed, now)
    settle_drained(state, sorted({m.node_id for m in attempt.members}))
    return ok(f"{c.job_id} attempt {attempt.number} failed", job_id=c.job_id)


def _expire_time_limit(state: ClusterState, c: cmd.ExpireTimeLimit, now: int) -> Result:
    held = _holding(state, c.job_id, c.fencing_token)
    if isinstance(held, Result):
        return held
    job, attempt = held
    deadline = time_limit_deadline(job)
    if deadline is None or now < deadline:
        return error(ResultCode.CONFLICT, f"{c.job_id} has not reached its time limit")
    limit = job.spec.time_limit_ms
    nodes = sorted({m.node_id for m in attempt.members})
    end_attempt(
        state, job, lc.AttemptEvent.STOP, reason(ReasonCode.TIME_LIMIT, limit_ms=limit), now
    )
    finish(state, job, lc.JobEvent.FAIL, reason(ReasonCode.FAILED_TIME_LIMIT, limit_ms=limit), now)
    settle_drained(state, nodes)
    return ok(f"{c.job_id} stopped at its time limit", job_id=c.job_id)


def _purge_finished(state: ClusterState, c: cmd.PurgeFinished, now: int) -> Result:
    horizon = now - state.config.retention_ms
    gone = sorted(
        job.job_id
        for job in state.jobs.values()
        if job.state.finished
        and job.finished_at_ms <= horizon
        and not (job.attempt is not None and job.attempt.held)  # kept while it holds
    )
    purged = []
    for job_id in gone:
        job = state.jobs.pop(job_id)
        state.job_state_changed(job)
        purged.append(job)
        if state.request_ids.get(job.request_id) == job_id:
            del state.request_ids[job.request_id]
    for array_id in sorted({job.array_id for job in purged} - {""}):  # gone with its last task
        array = state.arrays[array_id]
        if not any(task in state.jobs for task in array.task_ids()):
            del state.arrays[array_id]
            if state.request_ids.get(array.request_id) == array_id:
                del state.request_ids[array.request_id]
    return ok(f"purged {len(gone)} finished job(s)", purged=tuple(gone))


def _touches_submission(state: ClusterState, c: cmd.SubmitJob, changes: Changes) -> None:
    changes.request_ids = True
    if c.spec.dependencies is not None:  # each job depended on gains a dependant
        changes.jobs.update(job_id for _, job_id in c.spec.dependencies.pairs())
    job_id = state.request_ids.get(c.request_id)
    if job_id is not None:
        changes.jobs.add(job_id)
        array = state.arrays.get(job_id)
        if array is not None:  # made (or named again) by this command
            changes.jobs.update(array.task_ids())


def _touches_cancel(
    state: ClusterState, c: cmd.CancelJob | cmd.RequeueJob, changes: Changes
) -> None:
    """The job and its nodes, or, for an array, every task and its nodes."""
    array = state.arrays.get(c.job_id)
    for job_id in array.task_ids() if array is not None else (c.job_id,):
        job_and_its_nodes(state, job_id, changes)


def _touches_purge(state: ClusterState, c: cmd.PurgeFinished, changes: Changes) -> None:
    changes.request_ids = True
    changes.jobs.update(job.job_id for job in state.jobs.values() if job.state.finished)


HANDLERS: dict[type, Handling] = {
    cmd.SubmitJob: Handling(_submit_job, _touches_submission),
    cmd.CancelJob: Handling(_cancel_job, _touches_cancel),
    cmd.RequeueJob: Handling(_requeue_job, _touches_cancel),
    cmd.FailAttempt: Handling(_fail_attempt, one_job),
    cmd.ExpireTimeLimit: Handling(_expire_time_limit, one_job),
    cmd.ExpireDeadline: Handling(_expire_deadline, one_job),
    cmd.PurgeFinished: Handling(_purge_finished, _touches_purge),
}
