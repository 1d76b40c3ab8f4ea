"""Checker rules for job dependencies (docs/cli.md, ``dependencies:``): no job ran before
what it waited for had happened.

A member's ``start`` record and a member's ``end`` record are written by the member
itself with the host's monotonic clock, so they order events across every worker: a
dependant's first start must come after the last accepted ``end`` of a job it waits for
with ``afterok`` (that job's effect was committed, and it then succeeded), and after the
first start of a job it waits for with ``after``. The final state says how each job
depended on ended: an ``afterok`` dependant may have run only if it SUCCEEDED, an
``afternotok`` one only if it FAILED or was CANCELLED, an ``afterany`` one only once it
finished. A dependency on an array is met once every task meets it: each task of the
array is held to the rule as if the dependant had named it.
"""

from __future__ import annotations

from chaos.history import History, Violation
from synapse_ha.core.model import ClusterState, JobState

# End records of a member whose effect the sink committed.
_DONE = ("accepted", "already committed")


def check_dependency_order(history: History, state: ClusterState | None) -> list[Violation]:
    """Every dependant that started before its dependency allowed it to."""
    if state is None:
        return []
    first_start: dict[str, int] = {}
    last_done: dict[str, int] = {}
    for r in history.members:
        if r.type == "start":
            first_start[r.job] = min(first_start.get(r.job, r.mono_ns), r.mono_ns)
        elif r.type == "end" and r.outcome in _DONE:
            last_done[r.job] = max(last_done.get(r.job, r.mono_ns), r.mono_ns)
    out: list[Violation] = []
    for job in sorted(state.jobs.values(), key=lambda j: j.seq):
        deps = job.spec.dependencies
        started = first_start.get(job.job_id)
        if deps is None or started is None:
            continue
        for kind, named in deps.pairs():
            array = state.arrays.get(named)
            for other_id in array.task_ids() if array is not None else [named]:
                other = state.jobs.get(other_id)
                if other is None:
                    continue  # purged after it finished: its records say nothing more
                why = _early(
                    kind, other.state, started, first_start.get(other_id), last_done.get(other_id)
                )
                if why:
                    where = named if other_id == named else f"{named} (task {other_id})"
                    out.append(Violation("dependency-early", job.job_id, f"{kind} {where}: {why}"))
    return out


def _early(
    kind: str, other: JobState, started: int, other_start: int | None, other_done: int | None
) -> str:
    if kind == "afterok":
        if other is not JobState.SUCCEEDED:
            return f"it ran, and the job it waited for ended {other}"
        if other_done is None or other_done >= started:
            return "it started before the job it waited for had finished its work"
    elif kind == "afternotok" and other not in (JobState.FAILED, JobState.CANCELLED):
        return f"it ran, and the job it waited for ended {other}"
    elif kind == "afterany" and not other.finished:
        return f"it ran while the job it waited for was still {other}"
    elif kind == "after" and (other_start is None or other_start >= started):
        return "it started before the job it waited for had started"
    return ""
