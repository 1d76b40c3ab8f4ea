"""Member reports: starts and exits of members as their workers report them, at least
once, checked against the fencing token, and their checkpoint marks; the attempt's
outcome they decide; and the late success of an attempt its node's death had already
ended."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.lifecycle import ATTEMPT, MEMBER, move, move_job
from synapse_ha.core.machine.apply_checkpoints import report_mark
from synapse_ha.core.machine.apply_health import mark_unfit, started_here
from synapse_ha.core.machine.attempts import (
    end_attempt,
    end_attempt_for,
    end_preempted,
    finish,
    release_held,
    settle_dependants,
    settle_drained,
)
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.machine.replacement import confirm_vacated
from synapse_ha.core.model import (
    Attempt,
    AttemptState,
    ClusterState,
    Job,
    JobState,
    MemberState,
    MemberStatus,
)
from synapse_ha.core.reasons import Reason, ReasonCode, reason


def _report_members(state: ClusterState, c: cmd.ReportMembers, now: int) -> Result:
    if c.node_id not in state.nodes:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    accepted = stale = 0
    touched: set[str] = set()
    reported: dict[str, Job] = {}  # jobs whose members may have stopped
    for event in c.events:
        job = state.jobs.get(event.job_id)
        if job is not None and event.kind is cmd.MemberEventKind.EXITED:
            reported[job.job_id] = job
        if event.kind is cmd.MemberEventKind.CHECKPOINT:
            if job is not None and report_mark(job, c.node_id, event, now):
                accepted += 1
            else:
                stale += 1
            continue
        if (
            job is not None
            and job.attempt is not None
            and job.attempt.vacancies
            and confirm_vacated(state, job, c.node_id, event, now)
        ):
            accepted += 1  # the old member of a rank being placed again, or given back
            touched.add(c.node_id)
            if succeed_when_shrunk(state, job, now):
                touched.update(m.node_id for m in job.attempt.members)
            continue
        late = job is not None and _count_late_exit(state, job, c.node_id, event, now, touched)
        if job is not None and (_confirm_stopped(state, job, c.node_id, event, now) or late):
            accepted += 1
            touched.add(c.node_id)
            continue
        attempt = job.live_attempt() if job is not None else None
        if job is None or attempt is None or not _is_member_of(attempt, event, c.node_id):
            stale += 1
            continue
        accepted += 1
        status = attempt.member_status[event.rank]
        if status.state is MemberState.EXITED:
            continue  # already known; reports are at-least-once
        if attempt.preempted_by and event.kind is cmd.MemberEventKind.EXITED:
            ended = _preempted_member_exited(state, job, attempt, event, now)
        else:
            ended = _live_member_event(state, c, job, attempt, event, now)
        if ended:
            touched.update(m.node_id for m in attempt.members)
    for job in reported.values():
        state.job_state_changed(job)  # the node index forgets a finished job's last exit
    settle_drained(state, sorted(touched))
    return ok(
        f"{accepted} event(s) accepted, {stale} stale", accepted_events=accepted, stale_events=stale
    )


def _preempted_member_exited(
    state: ClusterState, job: Job, attempt: Attempt, event: cmd.MemberEvent, now: int
) -> bool:
    """A member of a preempted attempt exited: that confirms it stopped, never the
    job's failure; once all have, the attempt ends (in success when all exited 0 by
    themselves before the preemption reached them). Whether the attempt ended."""
    _exited(attempt.member_status[event.rank], _preempted_exit_code(event), now)
    if not all(s.state is MemberState.EXITED for s in attempt.member_status):
        return False
    if attempt.state is AttemptState.RUNNING and all(
        s.exit_code == 0 for s in attempt.member_status
    ):
        _succeed_before_preemption(job, attempt, now, state)
    else:
        end_preempted(state, job, now)
    return True


def _live_member_event(
    state: ClusterState,
    c: cmd.ReportMembers,
    job: Job,
    attempt: Attempt,
    event: cmd.MemberEvent,
    now: int,
) -> bool:
    """A member of the live attempt started or exited: the attempt and the job run from
    its first report; a failing or disrupted exit ends the attempt (retried or
    requeued), the last of all-zero exits ends it in success. Whether the attempt
    ended."""
    status = attempt.member_status[event.rank]
    if status.started_at_ms is None:
        status.started_at_ms = now
    if attempt.started_at_ms is None:
        attempt.started_at_ms = now
    if attempt.state is AttemptState.BOUND:
        attempt.state = move(ATTEMPT, attempt.state, lc.AttemptEvent.START)
    if job.state is JobState.SCHEDULED:
        move_job(state, job, lc.JobEvent.START)
        job.reason = reason(ReasonCode.RUNNING, attempt=attempt.number)
        settle_dependants(state, job, now)  # ``after`` dependencies are met now
    if event.kind is cmd.MemberEventKind.STARTED:
        status.state = move(MEMBER, status.state, lc.MemberEvent.START)
        if state.format_floor < _RAN_RESETS_FORMAT:
            started_here(state, c.node_id)
        return False
    _exited(status, event.exit_code, now)
    if state.format_floor >= _RAN_RESETS_FORMAT and event.cause in _PROGRAM_RAN:
        started_here(state, c.node_id)
    if event.cause is not cmd.ExitCause.PROGRAM or event.exit_code != 0:
        if event.cause is cmd.ExitCause.NODE_CANNOT_RUN:
            mark_unfit(state, c.node_id, job.owner, event.detail, now)
        outcome = _exit_outcome(job, c.node_id, event)
        end_attempt_for(state, job, outcome, c.jitter_seed, now)
        return True
    if all(s.state is MemberState.EXITED and s.exit_code == 0 for s in attempt.member_status):
        _succeed(
            state, job, attempt, reason(ReasonCode.SUCCEEDED, members=len(attempt.members)), now
        )
        return True
    return False


def _is_member_of(attempt: Attempt, event: cmd.MemberEvent, node_id: str) -> bool:
    """Whether ``event`` is of a member of ``attempt`` (its fencing token, a rank it has)
    placed on ``node_id``."""
    return (
        attempt.fencing_token == event.fencing_token
        and 0 <= event.rank < len(attempt.members)
        and attempt.members[event.rank].node_id == node_id
        and attempt.members[event.rank].generation == event.generation
    )


def _exited(status: MemberStatus, exit_code: int, now: int) -> None:
    """A member's exit, with its code, recorded at ``now``."""
    status.state = move(MEMBER, status.state, lc.MemberEvent.EXIT)
    status.exit_code = exit_code
    status.finished_at_ms = now


def _succeed(state: ClusterState, job: Job, attempt: Attempt, why: Reason, now: int) -> None:
    """Every member of ``attempt``, the job's live one, exited 0: the attempt succeeds,
    and the job with ``why``."""
    outcome = reason(ReasonCode.ALL_EXITED_ZERO, members=len(attempt.members))
    end_attempt(state, job, lc.AttemptEvent.SUCCEED, outcome, now)
    finish(state, job, lc.JobEvent.SUCCEED, why, now)


def succeed_when_shrunk(state: ClusterState, job: Job, now: int) -> bool:
    """An elastic gang whose members left after it gave back its top ranks all exited 0
    (they did while the ranks given back still ran, and the last of those just stopped):
    the attempt succeeds, as it would have had they exited after. From format
    :data:`SHRUNK_SUCCEEDS_FORMAT`; before, such an attempt stayed running. Whether it
    ended."""
    attempt = job.live_attempt()
    if (
        state.format_floor < SHRUNK_SUCCEEDS_FORMAT
        or attempt is None
        or attempt.preempted_by
        or attempt.vacancies
        or attempt.state is not AttemptState.RUNNING
        or not attempt.member_status
        or not all(
            s.state is MemberState.EXITED and s.exit_code == 0 for s in attempt.member_status
        )
    ):
        return False
    _succeed(state, job, attempt, reason(ReasonCode.SUCCEEDED, members=len(attempt.members)), now)
    return True


# An elastic gang whose remaining members all exited 0 while the ranks it gave back still
# ran succeeds once the last of those stops; before this format it stayed running. The
# rule changes what replicas apply, so it waits for every replica to read the format.
SHRUNK_SUCCEEDS_FORMAT = 17

# From format 3 a node's run of start failures ends when a member's program ran there to
# its exit (a member reported started may still fail its node's pre-start check); before,
# when a member reported started. The rule changes what replicas apply, so it waits for
# every replica to read format 3.
_RAN_RESETS_FORMAT = 3
_PROGRAM_RAN = frozenset({cmd.ExitCause.PROGRAM, cmd.ExitCause.HUNG})

_EXIT_OUTCOMES = {
    cmd.ExitCause.PROGRAM: ReasonCode.MEMBER_EXITED,
    cmd.ExitCause.FENCED: ReasonCode.MEMBER_FENCED,
    cmd.ExitCause.LOST: ReasonCode.MEMBER_LOST,
    cmd.ExitCause.NODE_CANNOT_RUN: ReasonCode.NODE_CANNOT_RUN,
    cmd.ExitCause.HUNG: ReasonCode.MEMBER_HUNG,
}


def _exit_outcome(job: Job, node_id: str, event: cmd.MemberEvent) -> Reason:
    """How a member's failing or disrupted exit ends its attempt; a hung member's names
    the job's progress timeout."""
    progress = job.spec.progress
    hung = event.cause is cmd.ExitCause.HUNG
    return reason(
        _EXIT_OUTCOMES[event.cause],
        rank=event.rank,
        node=node_id,
        exit_code=event.exit_code,
        timeout_ms=progress.timeout_ms if hung and progress is not None else None,
        detail=event.detail or None,
    )


# 128 + SIGTERM: the code a member stopped by its worker reports (worker/shim.py).
EXIT_STOPPED = 143


def _preempted_exit_code(event: cmd.MemberEvent) -> int:
    """The code recorded for a preempted member's exit. Only an exit 0 by the member's own
    program (cause ``PROGRAM``) is a success: a member its worker stopped never reports 0
    (its supervisor reports 143, DESIGN §4), so a disruption reported with code 0 is
    recorded as 143 and never counts as one."""
    if event.cause is not cmd.ExitCause.PROGRAM and event.exit_code == 0:
        return EXIT_STOPPED
    return event.exit_code


def _succeed_before_preemption(job: Job, attempt: Attempt, now: int, state: ClusterState) -> None:
    """Every member of a preempted attempt exited 0 by itself: the gang finished before
    the preemption reached it (its exits were reported after the preemption was decided).
    The job succeeds instead of running again; the preemptor gets the GPUs as it would
    have, once the next pass places it."""
    why = reason(
        ReasonCode.SUCCEEDED_BEFORE_PREEMPTION,
        attempt=attempt.number,
        members=len(attempt.members),
        preemptor=attempt.preempted_by,
    )
    _succeed(state, job, attempt, why, now)


def _confirm_stopped(
    state: ClusterState, job: Job, node_id: str, event: cmd.MemberEvent, now: int
) -> bool:
    """Record that a member of the job's ended attempt has stopped, freeing what it still
    held; False if not such."""
    attempt = job.attempt
    if (
        attempt is None
        or attempt.ended_at_ms is None
        or event.kind is not cmd.MemberEventKind.EXITED
        or not _is_member_of(attempt, event, node_id)
    ):
        return False
    status = attempt.member_status[event.rank]
    if status.state is not MemberState.EXITED:
        _exited(status, event.exit_code, now)
    release_held(state, job, event.rank)
    return True


def _count_late_exit(
    state: ClusterState, job: Job, node_id: str, event: cmd.MemberEvent, now: int, touched: set[str]
) -> bool:
    """Count an exit of the job's attempt that was ended by its node's death
    (``job.lost_attempt``); False when ``event`` is not such an exit.

    An exit 0 by the member's own program (cause ``PROGRAM``) adds its rank; once every
    rank has one, the attempt had succeeded after all: a newer attempt, bound or running,
    is stopped (its members are no longer desired, its resources are released) and the
    job ends ``SUCCEEDED`` (``late_success``), so it never runs again. Any other exit
    (non-zero, fenced, lost) drops the record: the requeue was needed. Duplicates change
    nothing (reports are at-least-once).
    """
    lost = job.lost_attempt
    if (
        lost is None
        or event.kind is not cmd.MemberEventKind.EXITED
        or event.fencing_token != lost.fencing_token
        or not 0 <= event.rank < len(lost.nodes)
        or lost.nodes[event.rank] != node_id
    ):
        return False
    if event.cause is not cmd.ExitCause.PROGRAM or event.exit_code != 0:
        job.lost_attempt = None
        return True
    if event.rank in lost.exited_zero:
        return True
    ranks = tuple(sorted((*lost.exited_zero, event.rank)))
    if len(ranks) < len(lost.nodes):
        job.lost_attempt = dataclasses.replace(lost, exited_zero=ranks)
        return True
    live = job.live_attempt()
    if live is not None:
        touched.update(m.node_id for m in live.members)
        end_attempt(
            state,
            job,
            lc.AttemptEvent.STOP,
            reason(
                ReasonCode.EARLIER_ATTEMPT_SUCCEEDED,
                attempt=lost.number,
                fencing_token=lost.fencing_token,
            ),
            now,
        )
    finish(
        state,
        job,
        lc.JobEvent.LATE_SUCCESS,
        reason(
            ReasonCode.SUCCEEDED_AFTER_NODE_DEATH,
            attempt=lost.number,
            fencing_token=lost.fencing_token,
            members=len(lost.nodes),
            node=lost.node_id,
        ),
        now,
    )
    return True


def _touches_reports(state: ClusterState, c: cmd.ReportMembers, changes: Changes) -> None:
    changes.nodes.add(c.node_id)
    for event in c.events:
        job_and_its_nodes(state, event.job_id, changes)


HANDLERS: dict[type, Handling] = {
    cmd.ReportMembers: Handling(_report_members, _touches_reports),
}
