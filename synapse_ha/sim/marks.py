"""Checkpoint marks in the simulator (:mod:`synapse_ha.core.workflows.checkpoints`).

A job with a checkpoint interval (``SimJob.checkpoint_ms``) has every member mark a
checkpoint each interval of run time while its attempt holds resources, a victim's grace
included: a ``ReportMembers`` command per node with a CHECKPOINT member event per member
(``mark_seq`` 1, 2, ... per attempt), through the real ``apply``, as its workers would
report them. The state records the marks on the attempt; the attempt's mark is the point
the whole gang can resume from.

The step a mark carries is the job's run time in whole seconds, the work its earlier
attempts kept included, so the state's resume step (``Job.resume_step``) is where a
requeued job resumes: its next attempt runs its duration less that.

Marks are scheduled lazily: an attempt has one mark event in the queue at a time, the
next pushed when one is applied, so the queue holds at most one per live attempt however
long the job and short its interval.

**Saving on notice** (``Workload.save_on_notice_ms``): a victim with a checkpoint interval
does what a program reading its preemption notice does (docs/queues.md): it stops
training at the notice, saves, marks a checkpoint of the step it had reached and exits.
The save takes a time drawn uniformly within the workload's bounds for each preemption
(:func:`save_delay_ms`, seeded by the workload, the job and the attempt's number, so
every policy draws the same for the same attempt). The mark is the same
``ReportMembers`` its workers would send; its members' exits, reported at once after
it, end the grace then, and the next attempt resumes from the step reached at the
notice. A save that would outlast the grace is never finished: the victim stops when
its grace ends, as without the option.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import Attempt, ClusterState, Job

MS_PER_STEP = 1_000  # a mark's step counts seconds of run time


@dataclass(slots=True)
class Marking:
    """The marks of one live attempt: its fencing token, the interval, when it was bound,
    the run time its job had kept before it (ms), when its run ends, and the marks made."""

    token: int
    every_ms: int
    bound_ms: int
    kept_ms: int
    end_ms: int
    made: int = 0

    def next_at(self) -> int | None:
        """When the attempt marks next; None when its run ends first."""
        at = self.bound_ms + (self.made + 1) * self.every_ms
        return at if at < self.end_ms else None

    def mark(self) -> tuple[int, int]:
        """Count one more mark: its number and its step (seconds of run time)."""
        self.made += 1
        return self.made, (self.kept_ms + self.made * self.every_ms) // MS_PER_STEP

    def mark_at(self, at_ms: int) -> tuple[int, int]:
        """Count a mark of the work done by ``at_ms`` (a save after a notice, the
        attempt's last): its number and its step."""
        self.made += 1
        return self.made, (self.kept_ms + max(at_ms - self.bound_ms, 0)) // MS_PER_STEP


def check_save_bounds(bounds: tuple[int, int] | None) -> None:
    """Raise ValueError naming ``save_on_notice_ms`` unless it is None or two whole
    milliseconds, 0 <= low <= high."""
    if bounds is None:
        return
    if len(bounds) != 2 or not 0 <= bounds[0] <= bounds[1]:
        raise ValueError(
            f"save_on_notice_ms: must be (low, high) with 0 <= low <= high ms, got {bounds!r}"
        )


def save_delay_ms(bounds: tuple[int, int], workload: str, job_id: str, attempt: int) -> int:
    """How long the victim ``job_id`` (its attempt number ``attempt``) of ``workload``
    takes to save after its notice: drawn uniformly within ``bounds``, ms."""
    return random.Random(f"save:{workload}:{job_id}:{attempt}").randint(*bounds)


def kept_ms(job: Job) -> int:
    """The run time a job's earlier attempts kept: its resume step, in ms."""
    return (job.resume_step or 0) * MS_PER_STEP


def report_marks(state: ClusterState, job_id: str, seq: int, step: int, now: int) -> None:
    """Every member of the job's attempt marks a checkpoint (number ``seq``, ``step``),
    reported node by node at ``now``."""
    attempt = state.jobs[job_id].attempt
    assert attempt is not None
    by_node: dict[str, list[c.MemberEvent]] = {}
    for m in attempt.members:
        by_node.setdefault(m.node_id, []).append(
            c.MemberEvent(
                job_id,
                attempt.fencing_token,
                m.rank,
                c.MemberEventKind.CHECKPOINT,
                step=step,
                mark_seq=seq,
                generation=m.generation,
            )
        )
    for node_id, events in sorted(by_node.items()):
        apply(state, c.ReportMembers(node_id, tuple(events), now_ms=now))


def lost_since(attempt: Attempt) -> int:
    """From when a victim's work is lost: its attempt's mark, or its bind without one."""
    mark = attempt.mark()
    return mark.at_ms if mark is not None else attempt.bound_at_ms
