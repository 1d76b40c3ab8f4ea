"""The checker's slow-node rules (docs/slow-nodes.md), pure functions of the ``degraded``
marks seen during the run (``degraded.jsonl``, :class:`chaos.slowfaults.MarkWatch`), the
``slow-node`` faults' records and the binds of every attempt.

``slow-node-unmarked``
    A ``slow-node`` fault that throttled a paced member saw its node marked ``degraded``
    within the kind's bound (:data:`chaos.slowfaults.MARK_WAIT_S`). A fault that found no
    paced gang throttled nothing and is not judged.
``healthy-node-degraded``
    Every ``degraded`` mark names a node a ``slow-node`` fault throttled at the time: the
    mark was first seen between the throttle and the end of that fault's heal (plus the
    watch's period). The chaos workload's other paced gangs run on healthy nodes, with
    the same short windows: a mark on one of their nodes is a false one.
``degraded-bind``
    No attempt (nor a member placed again, nor an elastic gang's growth) is bound to a
    node while it was marked: from the mark's stamp (``since_ms``, leader clock; plus
    :data:`BIND_SLACK_MS`, as a pass planned on the state just before the mark commits
    binds with a later stamp) for as long as the suite saw the mark held before the node
    was made ready again (the heal's uncordon; else the node seen ready while marked, less
    a watch period, or the mark seen gone, less a watch period and the leader's scan:
    another fault's heal or the end of the run may uncordon it). The mark is seen up to a
    watch period late, so the span is, if anything, short. A mark the run never saw
    lifted holds to the end. The binds are those of the ``unfit-bind`` rule
    (:func:`chaos.node_rules.binds`: the job history and the final state).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from chaos import ledger
from chaos.history import History, Violation
from chaos.nemesis import SLOW_NODE
from chaos.node_rules import binds
from chaos.slowfaults import MARK_WAIT_S, MARKS, WATCH_S
from synapse_ha.core.model import ClusterState

WATCH_SLACK_NS = int((WATCH_S + 0.5) * 1e9)
# A mark seen gone was lifted (its node made ready) up to this long before: the watch's
# period and the leader's scan for nodes made ready (1 s) with its commit.
CLEAR_LAG_NS = int((WATCH_S + 1.5) * 1e9)
BIND_SLACK_MS = 1_000
NEVER = 1 << 62


@dataclass(frozen=True, slots=True)
class Mark:
    """A ``degraded`` mark as the watch saw it (suite clock, but ``since_ms``)."""

    node: str
    since_ms: int  # the mark's stamp (leader clock)
    seen_ns: int  # first seen
    cleared_ns: int = NEVER  # first seen gone
    ready_ns: int = NEVER  # its node first seen ready while marked (made ready again)
    message: str = ""  # the mark's evidence


@dataclass(frozen=True, slots=True)
class Throttle:
    """A ``slow-node`` fault that throttled a member (suite clock)."""

    step: int
    node: str
    member: str
    started_ns: int  # the throttle
    end_ns: int  # the end of the heal
    marked_ns: int = 0  # the mark seen by the fault (0: never)
    uncordon_ns: int = NEVER  # the heal's first uncordon


def check_unmarked(throttles: list[Throttle]) -> list[Violation]:
    """``slow-node-unmarked`` (see the module docstring)."""
    return [
        Violation(
            "slow-node-unmarked",
            t.member.partition("/")[0],
            f"step {t.step} throttled {t.member} on {t.node} and saw no degraded mark "
            f"within {MARK_WAIT_S:.0f} s",
        )
        for t in throttles
        if not t.marked_ns
    ]


def throttled_then(mark: Mark, throttles: list[Throttle]) -> Throttle | None:
    """The fault that throttled the mark's node when the mark was first seen."""
    return next(
        (
            t
            for t in throttles
            if t.node == mark.node and t.started_ns <= mark.seen_ns <= t.end_ns + WATCH_SLACK_NS
        ),
        None,
    )


def check_marks(marks: list[Mark], throttles: list[Throttle]) -> list[Violation]:
    """``healthy-node-degraded`` (see the module docstring)."""
    return [
        Violation(
            "healthy-node-degraded",
            "",
            f"node {m.node} marked degraded (stamp {m.since_ms}) while no slow-node fault "
            f"throttled it: {m.message or 'no evidence recorded'}",
        )
        for m in marks
        if throttled_then(m, throttles) is None
    ]


def check_binds(
    marks: list[Mark], throttles: list[Throttle], bound: list[tuple[str, int, str, int, str]]
) -> list[Violation]:
    """``degraded-bind`` (see the module docstring); ``bound`` as
    :func:`chaos.node_rules.binds` gives them."""
    out: list[Violation] = []
    for m in marks:
        fault = throttled_then(m, throttles)
        lifted = min(
            m.cleared_ns - CLEAR_LAG_NS,
            m.ready_ns - int(WATCH_S * 1e9),
            fault.uncordon_ns if fault is not None else NEVER,
        )
        held_ms = NEVER if lifted >= NEVER // 2 else (lifted - m.seen_ns) // 1_000_000
        for job, token, _, at, node in bound:
            if node == m.node and m.since_ms + BIND_SLACK_MS < at <= m.since_ms + held_ms:
                out.append(
                    Violation(
                        "degraded-bind",
                        job,
                        f"token {token} bound to {node} at {at}, {at - m.since_ms} ms after "
                        f"the node was marked degraded (stamp {m.since_ms}) and before it "
                        "was made ready again",
                    )
                )
    return out


# ------------------------------------------------------------------- the run


def load_marks(path: Path) -> list[Mark]:
    """The marks of a ``degraded.jsonl``, each with when it was seen gone."""
    marks: dict[tuple[str, int], Mark] = {}
    for r in ledger.read_records(path):
        key = (str(r["node"]), int(r["since_ms"]))
        if r.get("type") == "degraded" and key not in marks:
            marks[key] = Mark(key[0], key[1], int(r["seen_ns"]), message=str(r.get("message", "")))
        elif r.get("type") == "cleared" and key in marks:
            marks[key] = replace(marks[key], cleared_ns=int(r["seen_ns"]))
        elif r.get("type") == "ready" and key in marks:
            marks[key] = replace(marks[key], ready_ns=int(r["seen_ns"]))
    return sorted(marks.values(), key=lambda m: (m.seen_ns, m.node))


def load_throttles(path: Path) -> list[Throttle]:
    """The ``slow-node`` faults of a ``faults.jsonl`` that throttled a member."""
    return [
        Throttle(
            int(r.get("step", -1)),
            str(r["slow_node"]),
            str(r.get("slow_member", "")),
            int(r["slow_started_ns"]),
            int(r["end_ns"]),
            int(r.get("slow_marked_ns", 0)),
            int(r.get("slow_uncordon_ns", NEVER)),
        )
        for r in ledger.read_records(path)
        if r.get("kind") == SLOW_NODE and r.get("slow_found") and r.get("slow_node")
    ]


def check_run_dir(run_dir: Path, history: History, state: ClusterState | None) -> list[Violation]:
    """The three rules over a saved run (its ``history`` and final ``state``)."""
    marks = load_marks(run_dir / MARKS)
    throttles = load_throttles(run_dir / ledger.FAULTS)
    out = check_unmarked(throttles) + check_marks(marks, throttles)
    if marks:
        out += check_binds(marks, throttles, binds(history, state))
    return out
