"""Job dependencies (DESIGN §6, ``dependencies:``): a job that waits for other jobs.

Four kinds, as Slurm names them:

* ``afterok``: the other job succeeded;
* ``afterany``: the other job finished, however it ended;
* ``afternotok``: the other job failed or was cancelled;
* ``after``: the other job started (a member of one of its attempts reported running).

A dependency is resolved by the state machine at the transition of the job depended on,
never by polling: when that job starts or finishes, each job waiting on it
(``Job.dependants``) has the dependency marked met (it leaves ``Job.waiting_for``) or,
when it can never be met (an ``afterok`` job that failed or was cancelled, an
``afternotok`` job that succeeded, an ``after`` job that finished without starting), the
waiting job is cancelled with reason ``DEPENDENCY_NEVER_SATISFIED`` — Slurm's
``kill_invalid_depend``, the only behaviour. Met is for good: a job depended on with
``after`` that is requeued and starts again releases nobody twice.

Jobs are only ever depended on once they exist, so the graph has no cycle: a submission
names existing jobs, and a job is never given dependencies later.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass


class DependencyKind(enum.StrEnum):
    AFTER_OK = "afterok"
    AFTER_ANY = "afterany"
    AFTER_NOT_OK = "afternotok"
    AFTER = "after"


# Dependencies of one job, of every kind together.
MAX_DEPENDENCIES = 100
# A job, an array, or a task of an array (core/workflows/arrays.py).
JOB_ID_PATTERN = re.compile(r"^job-[0-9]{6,12}(_[0-9]{1,7})?$")


@dataclass(frozen=True, slots=True)
class Dependencies:
    """The jobs a job waits for, by kind (each a tuple of job ids)."""

    after_ok: tuple[str, ...] = ()
    after_any: tuple[str, ...] = ()
    after_not_ok: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    # Slurm's singleton: also after every earlier unfinished job of the same owner and
    # name, which the state machine adds to ``after_any`` when the job is submitted.
    singleton: bool = False

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """Every dependency as ``(kind, job_id)``, in kind then given order."""
        return tuple(
            (str(kind), job_id)
            for kind, ids in (
                (DependencyKind.AFTER_OK, self.after_ok),
                (DependencyKind.AFTER_ANY, self.after_any),
                (DependencyKind.AFTER_NOT_OK, self.after_not_ok),
                (DependencyKind.AFTER, self.after),
            )
            for job_id in ids
        )

    @classmethod
    def of_pairs(cls, pairs: tuple[tuple[str, str], ...]) -> Dependencies:
        by_kind: dict[str, list[str]] = {str(k): [] for k in DependencyKind}
        for kind, job_id in pairs:
            by_kind[kind].append(job_id)
        return cls(
            tuple(by_kind[DependencyKind.AFTER_OK]),
            tuple(by_kind[DependencyKind.AFTER_ANY]),
            tuple(by_kind[DependencyKind.AFTER_NOT_OK]),
            tuple(by_kind[DependencyKind.AFTER]),
        )


def merged(given: Dependencies | None, more: Dependencies) -> Dependencies | None:
    """``given`` with ``more`` added after it, kind by kind (a job named twice for one
    kind once), a singleton if either is; None when both name nothing."""
    pairs = dict.fromkeys((*(given.pairs() if given else ()), *more.pairs()))
    singleton = more.singleton or (given is not None and given.singleton)
    if not pairs and not singleton:
        return given
    return dataclasses.replace(Dependencies.of_pairs(tuple(pairs)), singleton=singleton)


FIELD = "dependencies"


def dependency_problems(deps: Dependencies | None) -> list[tuple[str, str]]:
    """``(field, rule)`` for every rule the dependencies break on their own (the
    state machine checks that the jobs exist)."""
    if deps is None:
        return []
    out: list[tuple[str, str]] = []
    pairs = deps.pairs()
    if not pairs and not deps.singleton:
        out.append(
            (FIELD, "names no job: give at least one (or singleton), or leave dependencies out")
        )
    if len(pairs) > MAX_DEPENDENCIES:
        out.append((FIELD, f"at most {MAX_DEPENDENCIES} dependencies, got {len(pairs)}"))
    seen: set[str] = set()
    for kind, job_id in pairs:
        if not JOB_ID_PATTERN.match(job_id):
            out.append(
                (
                    f"{FIELD}.{kind}",
                    f"{job_id!r} is not a job id (job-NNNNNN, or job-NNNNNN_I for a task)",
                )
            )
        elif job_id in seen:
            out.append((f"{FIELD}.{kind}", f"{job_id} is named more than once"))
        seen.add(job_id)
    return out


def describe_wait(waiting_for: tuple[tuple[str, str], ...]) -> str:
    """``job-000012 to succeed, job-000013 to finish``: what a job still waits for."""
    verbs = {
        DependencyKind.AFTER_OK: "to succeed",
        DependencyKind.AFTER_ANY: "to finish",
        DependencyKind.AFTER_NOT_OK: "to fail or be cancelled",
        DependencyKind.AFTER: "to start",
    }
    return ", ".join(f"{job_id} {verbs[DependencyKind(kind)]}" for kind, job_id in waiting_for)
