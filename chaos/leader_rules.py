"""The checker's leader-fault rule (DESIGN §4: a control-plane fault never ends a healthy
gang), a pure function of a :class:`~chaos.history.History` and the final replicated
state.

``leader-fault-ended-gang``
    A ``pause-leader`` or ``isolate-leader`` fault (the leader frozen, or cut off: nothing
    closes, so its workers must find the new leader within their lease), or a
    ``cut-relay`` fault (a follower cut off from the leader only: the workers whose
    relayed streams it holds must move to another replica within their lease), ends no
    gang attempt that was running when it began. An attempt was running at the fault's start
    when a member of it had written its ``start`` record before then and none of its
    members had written an ``end`` record. It was ended by the fault when it ended with
    a control-plane outcome (``member_fenced``: a member killed by its worker's fencing,
    or ``node_dead``: a node declared dead) and the last record any of its members wrote
    falls between the fault's start and ``AFTER_HEAL_NS`` after its heal. The outcomes
    come from the replicas' history of finished jobs and the final state's last attempts.
    Decidable only when nothing else could have ended it: a window that another fault of
    any other kind overlaps is skipped (its attempts are counted by :func:`undecided`).
"""

from __future__ import annotations

from collections import defaultdict

from chaos.history import FaultRecord, History, Violation
from chaos.nemesis import CUT_RELAY, ISOLATE_LEADER, PAUSE_LEADER
from synapse_ha.core.model import ClusterState
from synapse_ha.core.reasons import ReasonCode

LEADER_FAULTS = frozenset({PAUSE_LEADER, ISOLATE_LEADER, CUT_RELAY})
# Control-plane outcomes: a member fenced by its worker, a node declared dead.
ENDED_BY_CONTROL_PLANE = frozenset({ReasonCode.MEMBER_FENCED.value, ReasonCode.NODE_DEAD.value})
# An attempt a leader fault ends is ended at the latest a dead timeout after the heal
# (the default is 10 s); this bound leaves room for it.
AFTER_HEAL_NS = 15_000_000_000

Attempt = tuple[str, int]  # (job, fencing token)


def _spans(history: History) -> dict[Attempt, tuple[int, int, int]]:
    """Per attempt: its first start record, its first end record (0: none) and the last
    record any member wrote (monotonic ns)."""
    first_start: dict[Attempt, int] = {}
    first_end: dict[Attempt, int] = {}
    last: dict[Attempt, int] = defaultdict(int)
    for r in history.members:
        key = (r.job, r.token)
        last[key] = max(last[key], r.mono_ns)
        if r.type == "start":
            first_start[key] = min(first_start.get(key, r.mono_ns), r.mono_ns)
        elif r.type == "end":
            first_end[key] = min(first_end.get(key, r.mono_ns), r.mono_ns)
    return {k: (s, first_end.get(k, 0), last[k]) for k, s in first_start.items()}


def _outcomes(history: History, state: ClusterState | None) -> dict[Attempt, str]:
    """The outcome code of every ended attempt known."""
    out = {(j.job, a.token): a.outcome_code for j in history.job_history for a in j.attempts}
    for job in state.jobs.values() if state is not None else ():
        attempt = job.attempt
        if attempt is not None and attempt.outcome is not None:
            out.setdefault((job.job_id, attempt.fencing_token), attempt.outcome.code.value)
    return out


def _overlapped(fault: FaultRecord, history: History) -> bool:
    """Whether a fault of another kind overlaps this one's window."""
    until = fault.end_ns + AFTER_HEAL_NS
    return any(
        f.kind not in LEADER_FAULTS and f.start_ns < until and f.end_ns > fault.start_ns
        for f in history.faults
    )


def _running_at(spans: dict[Attempt, tuple[int, int, int]], t: int) -> list[Attempt]:
    return sorted(k for k, (start, end, _) in spans.items() if start < t and not 0 < end < t)


def undecided(history: History) -> int:
    """Attempts running at a leader fault that another fault overlapped (not checked)."""
    spans = _spans(history)
    return sum(
        len(_running_at(spans, f.start_ns))
        for f in history.faults
        if f.kind in LEADER_FAULTS and _overlapped(f, history)
    )


def check_leader_fault_gangs(history: History, state: ClusterState | None) -> list[Violation]:
    """``leader-fault-ended-gang`` (see the module docstring)."""
    spans = _spans(history)
    outcomes = _outcomes(history, state)
    out: list[Violation] = []
    for fault in history.faults:
        if fault.kind not in LEADER_FAULTS or _overlapped(fault, history):
            continue
        until = fault.end_ns + AFTER_HEAL_NS
        for job, token in _running_at(spans, fault.start_ns):
            outcome = outcomes.get((job, token), "")
            last = spans[(job, token)][2]
            if outcome in ENDED_BY_CONTROL_PLANE and fault.start_ns <= last <= until:
                out.append(
                    Violation(
                        "leader-fault-ended-gang",
                        job,
                        f"attempt token {token}, running when {fault.kind} on "
                        f"{', '.join(fault.targets)} began, ended {outcome}",
                    )
                )
    return out
