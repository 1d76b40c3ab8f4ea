"""Checkpoint marks (DESIGN §5, ``$SYNAPSE_CHECKPOINT_FILE``): the point a gang can
resume from.

Every member gets ``$SYNAPSE_CHECKPOINT_FILE``; a line written to it (optionally a step
number: ``1200`` or ``step 1200``) marks a checkpoint. The member's worker reports the
newest mark of each member (a member event of kind ``checkpoint``, with the step when the
line carried one and the mark's number on that worker, 1, 2, ...). The state keeps, per
rank of the attempt, its newest mark (:class:`CheckpointMark`); the time a mark carries is
the time of the command that recorded it (the leader's clock when it was proposed), never
the worker's, so every replica records the same time and marks of different nodes compare.

The attempt's mark (:func:`attempt_mark`) exists once every member has marked: the oldest
of the members' newest marks, the point the whole gang has passed. Its step is the lowest
step among those marks (None when none carried one). When an attempt with a marked step
ends, its job keeps that step (``Job.resume_step``) and the members of its next attempt get
it as ``$SYNAPSE_RESUME_STEP``; an attempt without one leaves the job's step as it was.

Standard library only: this module holds the values and their rules.
"""

from __future__ import annotations

from dataclasses import dataclass

# The member variables (DESIGN §5): the file a member writes a line to to mark a
# checkpoint, and the step its gang resumes from on a restart.
CHECKPOINT_FILE_ENV = "SYNAPSE_CHECKPOINT_FILE"
RESUME_STEP_ENV = "SYNAPSE_RESUME_STEP"
# The file a preempted member finds its notice in (docs/queues.md): it asks the gang to
# save and mark a checkpoint before its grace period ends.
PREEMPT_FILE_ENV = "SYNAPSE_PREEMPT_FILE"


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    """The newest checkpoint mark of one member of an attempt: its ``rank``, when it was
    recorded (``at_ms``, the recording command's time), the step it carried (None: none)
    and its number among the marks of that member (``seq``: 1, 2, ... as its worker
    counted them; a report of a mark not newer than the one kept changes nothing)."""

    rank: int
    at_ms: int
    step: int | None = None
    seq: int = 0


@dataclass(frozen=True, slots=True)
class AttemptMark:
    """The point a whole attempt can resume from: the oldest of its members' newest marks
    (``at_ms``), with the lowest step among them (None when none carried one)."""

    at_ms: int
    step: int | None = None


def with_mark(
    marks: tuple[CheckpointMark, ...], rank: int, at_ms: int, step: int | None, seq: int
) -> tuple[CheckpointMark, ...] | None:
    """``marks`` (one per rank, in rank order) with ``rank``'s newest mark recorded, or
    None when the report is not newer than the mark kept (a duplicate or a reordered
    report: reports are at-least-once)."""
    kept = next((m for m in marks if m.rank == rank), None)
    if kept is not None and seq <= kept.seq:
        return None
    mark = CheckpointMark(rank=rank, at_ms=at_ms, step=step, seq=seq)
    others = [m for m in marks if m.rank != rank]
    return tuple(sorted((*others, mark), key=lambda m: m.rank))


def attempt_mark(marks: tuple[CheckpointMark, ...], members: int) -> AttemptMark | None:
    """The mark of an attempt of ``members`` members whose newest marks are ``marks``:
    None until every member has marked."""
    if members <= 0 or len(marks) != members:
        return None
    steps = [m.step for m in marks if m.step is not None]
    return AttemptMark(at_ms=min(m.at_ms for m in marks), step=min(steps) if steps else None)


def mark_problems(marks: tuple[CheckpointMark, ...], members: int) -> list[str]:
    """How ``marks`` break their rules: one per rank at most, in rank order, of a rank of
    the attempt, with a non-negative step and a positive number."""
    problems = []
    ranks = [m.rank for m in marks]
    if ranks != sorted(set(ranks)) or any(not 0 <= r < members for r in ranks):
        problems.append(f"checkpoint marks of ranks {ranks} of {members}")
    for m in marks:
        if (m.step is not None and m.step < 0) or m.seq <= 0:
            problems.append(f"rank {m.rank}: checkpoint mark step {m.step}, number {m.seq}")
    return problems
