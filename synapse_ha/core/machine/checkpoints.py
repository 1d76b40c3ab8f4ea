"""Checkpoint marks in the state (:mod:`synapse_ha.core.checkpoints`): a member's newest
mark recorded on its live attempt, and the step a job keeps when an attempt ends."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.checkpoints import with_mark
from synapse_ha.core.model import Attempt, Job


def record_mark(attempt: Attempt, event: cmd.MemberEvent, now: int) -> bool:
    """Record ``event`` (a CHECKPOINT of a member of the live ``attempt``, already checked
    against its token and node) as its member's newest mark, at the command's time
    ``now``. False when it changes nothing: a mark not newer than the one kept, or one
    that breaks the rules (a negative step, a number below 1)."""
    if (event.step is not None and event.step < 0) or event.mark_seq <= 0:
        return False
    marks = with_mark(attempt.marks, event.rank, now, event.step, event.mark_seq)
    if marks is None:
        return False
    attempt.marks = marks
    return True


def keep_resume_step(job: Job) -> None:
    """The job's attempt is ending: when it has a mark that carries a step, that step is
    where the job's next attempt resumes from (an attempt without one leaves the step of
    an earlier attempt in place)."""
    attempt = job.attempt
    mark = attempt.mark() if attempt is not None else None
    if mark is not None and mark.step is not None:
        job.resume_step = mark.step
