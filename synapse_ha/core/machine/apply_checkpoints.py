"""Checkpoint marks in the state (:mod:`synapse_ha.core.workflows.checkpoints`): a member's newest
mark recorded on its job's attempt, and the step a job keeps when an attempt ends."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import Attempt, Job, MemberState
from synapse_ha.core.workflows.checkpoints import with_mark


def report_mark(job: Job, node_id: str, event: cmd.MemberEvent, now: int) -> bool:
    """Record a CHECKPOINT ``event`` of a member of ``job`` on ``node_id`` as that
    member's newest mark, at the command's time ``now``; False when it is stale (not the
    token of the job's attempt, or not its member on that node).

    A mark counts on the live attempt, and on an attempt that has just ended while the
    job waits to run again and the member is not yet confirmed stopped: a worker reports
    a mark at its next heartbeat, so a member of another node may mark just before its
    gang's attempt ends and be reported after. The job's resume step then follows."""
    attempt = job.attempt
    if (
        attempt is None
        or attempt.fencing_token != event.fencing_token
        or not 0 <= event.rank < len(attempt.members)
        or attempt.members[event.rank].node_id != node_id
    ):
        return False
    if attempt.ended_at_ms is None:
        record_mark(attempt, event, now)
        return True
    if job.state.finished or attempt.member_status[event.rank].state is MemberState.EXITED:
        return False
    if record_mark(attempt, event, now):
        keep_resume_step(job)
    return True


def record_mark(attempt: Attempt, event: cmd.MemberEvent, now: int) -> bool:
    """Record ``event`` (a CHECKPOINT of a member of ``attempt``, already checked against
    its token and node) as its member's newest mark, at the command's time ``now``.
    False when it changes nothing: a mark not newer than the one kept, or one that breaks
    the rules (a negative step, a number below 1)."""
    if (event.step is not None and event.step < 0) or event.mark_seq <= 0:
        return False
    marks = with_mark(attempt.marks, event.rank, now, event.step, event.mark_seq)
    if marks is None:
        return False
    attempt.marks = marks
    return True


def keep_resume_step(job: Job) -> None:
    """The job's attempt ends (or its mark moved after it ended): when it has a mark that
    carries a step, that step is where the job's next attempt resumes from (an attempt
    without one leaves the step of an earlier attempt in place)."""
    attempt = job.attempt
    mark = attempt.mark() if attempt is not None else None
    if mark is not None and mark.step is not None:
        job.resume_step = mark.step
