"""Checker rules for job arrays (DESIGN §6, ``array:``; :mod:`chaos.workload` submits
them, recording each array's text and throttle with its submission).

``array-throttle``
    No more than ``throttle`` tasks of one array ran at once. A task *runs* while one of
    its members runs, and a member runs from its first record (its ``start``) to its last
    record (``end``, ``term``, or the last heartbeat before it was killed), as the
    ``gpu-reuse`` rule has it: by the members' own records, written with the one
    monotonic clock every host shares. The spans are closed at the start and open at the
    end, so a task that starts at the very instant another one wrote its last record does
    not overlap it (back to back is fine), while a member that wrote only its ``start``
    still runs at that instant. The ``overlap`` rule's one tolerance applies: the records
    of an attempt frozen with its host, written while frozen or within
    ``THAW_KILL_BOUND_MS`` after the thaw (:func:`chaos.history.in_thaw_window`), do not
    extend its members' spans, since the cluster may have declared that node dead and
    given the slot to another task during the freeze; a frozen member that outlives the
    bound is ``thaw-overlap``'s to report, and its later records count here too. Attempts
    of one task count as one task, however many of them ran.
``array-tasks``
    Every acknowledged array is in the final state with what it was submitted as (its
    indices and throttle), and its tasks are exactly the jobs ``<array>_<index>``, one for
    each index, each naming its array and index.

A task is an ordinary job for every other rule (each has its own attempts, tokens and
members, keyed by its job id): ``overlap``, ``duplicate-member`` and exactly-once hold
per task, and every task of an acknowledged array must succeed.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.history import History, Violation, frozen_attempts, in_thaw_window
from synapse_ha.core.identity.admission import shown_request_id
from synapse_ha.core.model import ClusterState
from synapse_ha.core.workflows.arrays import ArrayTextError, parse_array, task_id, task_of

Span = tuple[int, int]  # (first record, last record), monotonic ns


def check_arrays(history: History, state: ClusterState | None) -> list[Violation]:
    return check_throttle(history, state) + check_tasks(history, state)


def throttles(history: History, state: ClusterState | None) -> dict[str, int]:
    """Array id -> its throttle, for each throttled array submitted: acknowledged ones by
    their answer, and ones whose submission's outcome was unknown by the final state's
    array of that request."""
    out = {
        s.job_id: s.throttle
        for s in history.submissions
        if s.outcome == "ok" and s.job_id and s.throttle
    }
    if state is not None:
        by_request = {s.request_id: s for s in history.submissions}
        for array in state.arrays.values():
            submission = by_request.get(shown_request_id(array.owner, array.request_id))
            if submission is not None and submission.throttle:
                out.setdefault(array.array_id, submission.throttle)
    return out


def member_spans(history: History) -> dict[tuple[str, int, int], Span]:
    """(job, token, rank) -> the member's span: its first to its last record, leaving out
    records in a thaw window."""
    thaws = frozen_attempts(history)
    spans: dict[tuple[str, int, int], Span] = {}
    for r in history.members:
        if in_thaw_window(r, thaws):
            continue
        key = (r.job, r.token, r.rank)
        first, last = spans.get(key, (r.mono_ns, r.mono_ns))
        spans[key] = (min(first, r.mono_ns), max(last, r.mono_ns))
    return spans


def check_throttle(history: History, state: ClusterState | None) -> list[Violation]:
    """``array-throttle``: each throttled array whose tasks once ran more than its
    throttle at a time (one violation per array, at the first such instant)."""
    limits = throttles(history, state)
    if not limits:
        return []
    by_array: dict[str, list[tuple[str, Span]]] = defaultdict(list)
    for (job, _token, _rank), span in member_spans(history).items():
        task = task_of(job)
        if task is not None and task[0] in limits:
            by_array[task[0]].append((job, span))
    out: list[Violation] = []
    for array_id, spans in sorted(by_array.items()):
        excess = first_excess(spans, limits[array_id])
        if excess is not None:
            at, running = excess
            out.append(
                Violation(
                    "array-throttle",
                    array_id,
                    f"{len(running)} tasks ran at once (throttle {limits[array_id]}): "
                    f"{', '.join(running)} at mono {at / 1e9:.3f} s",
                )
            )
    return out


def first_excess(spans: list[tuple[str, Span]], throttle: int) -> tuple[int, list[str]] | None:
    """The first instant more than ``throttle`` distinct tasks had a running member, and
    those tasks; None if there is none. At one instant, spans that end there are over
    before spans that start there begin, and a span of one record is over right after
    its start."""
    events: list[tuple[int, int, str]] = []  # (time, 0 end | 1 start | 2 end of a point, task)
    for task, (first, last) in spans:
        events.append((first, 1, task))
        events.append((last, 2 if last == first else 0, task))
    events.sort()
    live: dict[str, int] = defaultdict(int)  # task -> its running members
    for at, kind, task in events:
        if kind != 1:
            live[task] -= 1
            if not live[task]:
                del live[task]
            continue
        live[task] += 1
        if len(live) > throttle:
            return at, sorted(live)
    return None


def check_tasks(history: History, state: ClusterState | None) -> list[Violation]:
    """``array-tasks``: each acknowledged array is in the final state as submitted, with
    exactly its tasks."""
    if state is None:
        return []
    out: list[Violation] = []
    for s in sorted(history.submissions, key=lambda s: s.job_id):
        if s.outcome != "ok" or not s.array:
            continue
        try:
            plan = parse_array(s.array)
        except ArrayTextError:
            continue  # not an array text: the cluster refused it (no acknowledgement)
        for problem in _task_problems(state, s.job_id, plan.indices, plan.throttle):
            out.append(Violation("array-tasks", s.job_id, f"array {s.array!r}: {problem}"))
    return out


def _task_problems(
    state: ClusterState, array_id: str, indices: tuple[int, ...], throttle: int
) -> list[str]:
    array = state.arrays.get(array_id)
    problems: list[str] = []
    if array is None:
        problems.append("the acknowledged array is not in the final state")
    elif array.indices != indices or array.throttle != throttle:
        problems.append(
            f"the final state has indices {list(array.indices)} and throttle "
            f"{array.throttle}, not {list(indices)} and {throttle}"
        )
    expected = {task_id(array_id, i): i for i in indices}
    missing = sorted(t for t in expected if t not in state.jobs)
    if missing:
        problems.append(f"tasks missing from the final state: {', '.join(missing)}")
    for job_id, index in sorted(expected.items()):
        job = state.jobs.get(job_id)
        if job is not None and (job.array_id, job.array_index) != (array_id, index):
            problems.append(f"{job_id} names array {job.array_id!r} index {job.array_index}")
    extra = sorted(
        j.job_id for j in state.jobs.values() if j.array_id == array_id and j.job_id not in expected
    )
    if extra:
        problems.append(f"jobs of the array that are not its tasks: {', '.join(extra)}")
    return problems
