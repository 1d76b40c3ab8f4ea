"""Preemption in the chaos suite: what preempted each attempt, and the rules a fair-share
preemption keeps (DESIGN §8, :mod:`synapse_ha.core.queues.fair_preemption`). Pure
functions of a :class:`~chaos.history.History` and the final replicated state.

What preempted an attempt is read from the replicas' history of finished jobs (an ended
attempt's outcome, "preempted by <job> (<kind>: ...)": the replicated state's own record),
and, for an attempt the history does not hold, from its members' ``preempted`` records
(the notice the worker handed them: kind and preemptor). :func:`preemption_counts` counts
the attempts of each kind; ``python -m chaos run`` fails when no scenario had a
fair-share preemption (the workload did not exercise it).

``preemption-notice``
    A member's notice names the kind and the preemptor the replicated state recorded for
    its attempt: the worker passes on what the leader decided, nothing else.
``fair-share-queue``
    A fair-share victim is of another queue than its preemptor's, both with a GPU quota
    in a cohort, and the two meet in a cohort with ``fair_sharing_preemption`` on (the
    final state's queues and cohorts; the suite sets them once, before any job).
``fair-share-unborrowed``
    A fair-share preemption takes only what the victim's queue borrows: at the decision
    the queue kept at least its nominal once its victims had stopped. The decision's time
    is not recorded, but it lies within the victim attempt's life (from its bind to its
    end, leader clock). Every moment of that life, the victim's queue held at most what
    its attempts live then ask for at most (from bind to end, an elastic gang at its
    ``max``), plus the gangs of the queue waiting for victims (a preemptor's claim counts
    for its queue; counted over every pending stretch of a job that preempted anything);
    the victim gives up at least its gang's ``min``. When even that bound, less the
    victim, stays below the queue's nominal throughout, the preemption took GPUs the queue
    did not borrow. Judged only when every job the members ran is known to the history or
    the final state (a job whose earlier attempts only the state knows counts as held
    from its submission on).

A victim's job running again at most once at a time is the rules every attempt keeps
(``overlap``, ``gpu-reuse``, exactly once): a fair-share victim is requeued as any
preempted gang is.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from chaos.history import History, JobHistory, Violation
from synapse_ha.core.cluster_config import PreemptionKind
from synapse_ha.core.model import ClusterState
from synapse_ha.core.queues.cohort_tree import ancestors
from synapse_ha.core.reasons import ReasonCode

PREEMPTED = ReasonCode.PREEMPTED.value
FAIR_SHARE = PreemptionKind.FAIR_SHARE.value
KINDS = tuple(k.value for k in PreemptionKind)
# An ended attempt's outcome sentence (synapse_ha.core.reasons): the preemptor and the
# start of the kind's explanation.
_OUTCOME = re.compile(r"preempted by (\S+) \((reclaim|priority|fair share)\b")
_NEVER = 1 << 62  # an attempt still live, a stretch never ended


@dataclass(frozen=True, slots=True)
class Preemption:
    """What preempted attempt ``token`` of job ``job``."""

    job: str
    token: int
    kind: str  # a PreemptionKind value
    preemptor: str
    source: str  # "state" (the history's outcome) or "notice" (a member's record)


def parse_outcome(outcome: str) -> tuple[str, str] | None:
    """(kind, preemptor) of a preempted attempt's outcome sentence; None for another."""
    m = _OUTCOME.match(outcome)
    if m is None:
        return None
    return m.group(2).replace(" ", "_"), m.group(1)


def preemptions_of(history: History) -> dict[tuple[str, int], Preemption]:
    """(victim job, token) -> what preempted that attempt: the history's record, else the
    first notice one of its members wrote."""
    out: dict[tuple[str, int], Preemption] = {}
    for r in history.members:
        if r.type == "preempted" and r.preemption and (r.job, r.token) not in out:
            out[(r.job, r.token)] = Preemption(r.job, r.token, r.preemption, r.preemptor, "notice")
    for j in history.job_history:
        for a in j.attempts:
            found = parse_outcome(a.outcome) if a.outcome_code == PREEMPTED else None
            if found is not None:
                out[(j.job, a.token)] = Preemption(j.job, a.token, *found, "state")
    return dict(sorted(out.items()))


def preemption_counts(history: History) -> dict[str, int]:
    """Preempted attempts of each kind (every kind named, 0 included)."""
    seen = Counter(p.kind for p in preemptions_of(history).values())
    return {kind: seen.get(kind, 0) for kind in KINDS}


def check_preemptions(history: History, state: ClusterState | None) -> list[Violation]:
    """``preemption-notice``, ``fair-share-queue`` and ``fair-share-unborrowed``."""
    found = preemptions_of(history)
    out = _check_notices(history, found)
    if state is None:
        return out
    fair = [p for p in found.values() if p.kind == FAIR_SHARE]
    queues = _queues_of(history, state)
    for p in fair:
        problem = _queue_problem(state, queues.get(p.job, ""), queues.get(p.preemptor, ""))
        if problem:
            out.append(
                Violation(
                    "fair-share-queue",
                    p.job,
                    f"token {p.token} was preempted by fair share for {p.preemptor}: {problem}",
                )
            )
    out += _check_unborrowed(history, state, fair, queues)
    return out


# ------------------------------------------------------------------ the notices


def _check_notices(history: History, found: dict[tuple[str, int], Preemption]) -> list[Violation]:
    out: list[Violation] = []
    told: set[tuple[str, int, str, str]] = set()
    for r in history.members:
        if r.type == "preempted" and r.preemption:
            told.add((r.job, r.token, r.preemption, r.preemptor))
    for job, token, kind, preemptor in sorted(told):
        recorded = found[(job, token)]
        if recorded.source == "state" and (recorded.kind, recorded.preemptor) != (kind, preemptor):
            out.append(
                Violation(
                    "preemption-notice",
                    job,
                    f"a member of token {token} was told it is preempted by {preemptor} "
                    f"({kind}); the state recorded {recorded.preemptor} ({recorded.kind})",
                )
            )
    return out


# ------------------------------------------------------------------ the queues


def _queues_of(history: History, state: ClusterState) -> dict[str, str]:
    """job -> its queue, from the history of finished jobs and the final state."""
    out = {j.job: j.queue for j in history.job_history if j.queue}
    for job in state.jobs.values():
        out.setdefault(job.job_id, job.spec.queue)
    return out


def _queue_problem(state: ClusterState, victim: str, preemptor: str) -> str:
    """Why a fair-share preemption between these queues breaks the rules; "" if it
    does not, or when a queue is unknown (not judged)."""
    if not victim or not preemptor:
        return ""
    if victim == preemptor:
        return f"both are of queue {victim} (fair share is between queues)"
    paths = []
    for name in (victim, preemptor):
        q = state.queues.get(name)
        if q is None or q.gpu is None or not q.cohort:
            return f"queue {name} has no GPU quota in a cohort"
        paths.append(ancestors(q.cohort, state.cohorts))
    common = next((c for c in paths[1] if c in paths[0]), None)
    if common is None:
        return f"queues {victim} and {preemptor} are of different cohort trees"
    record = state.cohorts.get(common)
    if record is None or not record.fair_sharing_preemption:
        return f"queues {victim} and {preemptor} meet in cohort {common}, which has it off"
    return ""


# ------------------------------------------------------------------ borrowing

# A stretch in which a job may have been charged to its queue: (from, to, GPUs), leader
# clock, both ends included.
Stretch = tuple[int, int, int]


def _check_unborrowed(
    history: History, state: ClusterState, fair: list[Preemption], queues: dict[str, str]
) -> list[Violation]:
    if not fair or not history.job_history:
        return []
    if {r.job for r in history.members} - set(queues):
        return []  # a job the members ran that neither knows: its queue's usage is unknown
    by_job = {j.job: j for j in history.job_history}
    preemptors = {p.preemptor for p in preemptions_of(history).values()}
    held: dict[str, list[Stretch]] = {}
    for job_id, queue in queues.items():
        held.setdefault(queue, []).extend(
            _stretches(by_job.get(job_id), state, job_id, job_id in preemptors)
        )
    out: list[Violation] = []
    for p in fair:
        queue = queues.get(p.job, "")
        q = state.queues.get(queue)
        victim = by_job.get(p.job)
        attempt = next((a for a in victim.attempts if a.token == p.token), None) if victim else None
        if q is None or q.gpu is None or victim is None or attempt is None:
            continue  # not judged: the queue or the attempt's life is unknown
        end = attempt.ended_at_ms or _NEVER
        most = _most_held(held[queue], attempt.bound_at_ms, end)
        if most - victim.min_gpus < q.gpu:
            out.append(
                Violation(
                    "fair-share-unborrowed",
                    p.job,
                    f"token {p.token} ({victim.min_gpus} GPUs at least) was preempted by fair "
                    f"share for {p.preemptor}, but queue {queue} held at most {most} GPUs "
                    f"while it ran (nominal {q.gpu}): the preemption took GPUs it did not "
                    f"borrow",
                )
            )
    return out


def _stretches(
    job: JobHistory | None, state: ClusterState, job_id: str, preempted_for: bool
) -> list[Stretch]:
    """When ``job_id`` may have been charged to its queue, at most how many GPUs: each
    attempt from its bind to its end, and, for a job that preempted others, each stretch
    it waited (its claim counts while it waits for its victims)."""
    if job is None:
        live = state.jobs.get(job_id)
        if live is None:
            return []
        gpus = live.spec.replicas * live.spec.resources.gpu
        return [(live.submitted_at_ms, _NEVER, gpus)]  # its earlier attempts are unknown
    out: list[Stretch] = []
    waiting_since = job.submitted_at_ms
    for a in sorted(job.attempts, key=lambda a: a.number):
        end = a.ended_at_ms or _NEVER
        out.append((a.bound_at_ms, end, job.gpus))
        if preempted_for:
            out.append((waiting_since, a.bound_at_ms, job.gpus))
        waiting_since = end
    return out


def _most_held(stretches: list[Stretch], start: int, end: int) -> int:
    """The most GPUs the stretches add up to at any moment from ``start`` to ``end``: a
    step function is highest at a stretch's start, or at ``start`` itself."""
    moments = [start, *(s for s, e, _ in stretches if start <= s <= end)]
    return max(sum(g for s, e, g in stretches if s <= t <= e) for t in moments)
