"""Rules for sbatch jobs' batch scripts and job steps, from ``steps.jsonl``
(:mod:`chaos.steptask`; the workload's :func:`chaos.workload.batch_script`):

``batch-twice``
    The batch script ran at most once per attempt: one process wrote ``batch-start``
    for each (job, token).
``step-outlived``
    No step task (nor the batch script) outlived its attempt's lease: once any record of
    a newer attempt of the job exists (a member's, a batch script's or a task's), no
    record of an older attempt's script or tasks is written. It is the ``overlap`` rule
    of :mod:`chaos.checker` for the processes the step daemons start: the attempt's lease
    ended before a newer attempt could be bound.
``step-task-twice``
    No two copies of one (job, step, task) ran at once: each process that wrote records
    for it lives from its first record to its last, and no two such lives overlap (step
    numbers start at 0 in every attempt, so this holds across attempts too).

As for members, records of an attempt frozen with its host (``freeze-host``) written
from the freeze to ``THAW_KILL_BOUND_MS`` after the thaw are excused: nothing on a frozen
host acts before the thaw, and the thawed supervisor stops it within that bound.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.history import THAW_KILL_BOUND_MS, History, MemberRecord, StepRecord, Violation


def _records(history: History) -> list[MemberRecord | StepRecord]:
    return [*history.members, *history.steps]


def check_steps(history: History) -> list[Violation]:
    return [
        *check_batch_once(history),
        *check_step_leases(history),
        *check_task_copies(history),
    ]


def check_batch_once(history: History) -> list[Violation]:
    """``batch-twice``: more than one process started the batch script of an attempt."""
    runs: dict[tuple[str, int, int], set[tuple[int, int, int]]] = defaultdict(set)
    for r in history.steps:
        if r.type == "batch-start":
            runs[(r.job, r.token, r.attempt)].add(r.process)
    return [
        Violation(
            "batch-twice",
            job,
            f"the batch script of attempt {attempt} (token {token}) ran {len(p)} times "
            f"(pids {sorted(pid for *_, pid in p)})",
        )
        for (job, token, attempt), p in sorted(runs.items())
        if len(p) > 1
    ]


def attempt_starts(history: History) -> dict[str, dict[int, int]]:
    """job -> token -> the attempt's first record (member, batch script or task)."""
    starts: dict[str, dict[int, int]] = defaultdict(dict)
    for r in _records(history):
        known = starts[r.job].get(r.token)
        starts[r.job][r.token] = r.mono_ns if known is None else min(known, r.mono_ns)
    return starts


def thawing(history: History) -> dict[tuple[str, str, int], list[tuple[int, int]]]:
    """(node, job, token) -> the windows in which its records are excused: from each
    freeze of the node to its thaw plus the bound, for an attempt with a record on the
    node by the thaw (or listed frozen by the nemesis)."""
    first_on: dict[tuple[str, str, int], int] = {}
    for r in _records(history):
        key = (r.node, r.job, r.token)
        first_on[key] = min(first_on.get(key, r.mono_ns), r.mono_ns)
    bound = THAW_KILL_BOUND_MS * 1_000_000
    out: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
    for f in history.faults:
        if f.kind != "freeze-host":
            continue
        there = {key for key, at in first_on.items() if key[0] == f.frozen_node and at <= f.end_ns}
        there |= {(f.frozen_node, job, token) for job, token in f.frozen}
        for key in there:
            out[key].append((f.start_ns, f.end_ns + bound))
    return out


def _excused(r: StepRecord, windows: dict[tuple[str, str, int], list[tuple[int, int]]]) -> bool:
    return any(a <= r.mono_ns <= b for a, b in windows.get((r.node, r.job, r.token), ()))


def _what(r: StepRecord) -> str:
    if r.step < 0:
        return f"the batch script of token {r.token} on {r.node} (pid {r.pid})"
    return f"task {r.task} of step {r.step} of token {r.token} on {r.node} (pid {r.pid})"


def check_step_leases(history: History) -> list[Violation]:
    """``step-outlived``: a record of an attempt's script or task after a newer attempt of
    the job began."""
    starts = attempt_starts(history)
    windows = thawing(history)
    out: list[Violation] = []
    reported: set[tuple[str, int, int]] = set()
    for r in sorted(history.steps, key=lambda r: r.mono_ns):
        for newer, began in sorted(starts.get(r.job, {}).items()):
            if newer <= r.token or r.mono_ns < began or (r.job, r.token, newer) in reported:
                continue
            if _excused(r, windows):
                continue
            reported.add((r.job, r.token, newer))
            out.append(
                Violation(
                    "step-outlived",
                    r.job,
                    f"{_what(r)} wrote '{r.type}' {(r.mono_ns - began) / 1e6:.0f} ms after "
                    f"the attempt with token {newer} began",
                )
            )
    return out


def check_task_copies(history: History) -> list[Violation]:
    """``step-task-twice``: two processes of one (job, step, task) alive at once."""
    windows = thawing(history)
    lives: dict[tuple[str, int, int], dict[tuple[int, int, int, int], list[int]]] = defaultdict(
        dict
    )
    for r in history.steps:
        if r.step < 0 or _excused(r, windows):
            continue
        life = lives[(r.job, r.step, r.task)].setdefault(
            (r.token, *r.process), [r.mono_ns, r.mono_ns]
        )
        life[0] = min(life[0], r.mono_ns)
        life[1] = max(life[1], r.mono_ns)
    out: list[Violation] = []
    for (job, step, task), copies in sorted(lives.items()):
        ordered = sorted(copies.items(), key=lambda c: c[1][0])
        for i, (older, (_, last)) in enumerate(ordered):
            for newer, (began, _) in ordered[i + 1 :]:
                if began >= last:
                    continue
                out.append(
                    Violation(
                        "step-task-twice",
                        job,
                        f"task {task} of step {step} ran as pid {older[3]} (token {older[0]}) "
                        f"and pid {newer[3]} (token {newer[0]}) at once for "
                        f"{(last - began) / 1e6:.0f} ms",
                    )
                )
    return out


def step_counts(history: History) -> dict[str, int]:
    """What the report counts: the sbatch jobs whose script or tasks wrote records, their
    batch script runs (one per attempt that started it), job steps and tasks."""
    return {
        "jobs": len({r.job for r in history.steps}),
        "batch_runs": len({(r.job, r.token) for r in history.steps if r.type == "batch-start"}),
        "steps": len({(r.job, r.token, r.step) for r in history.steps if r.step >= 0}),
        "tasks": len(
            {(r.job, r.token, r.step, r.task) for r in history.steps if r.type == "task-start"}
        ),
    }
