"""Elastic gangs under the ``elastic`` failure policies (:mod:`synapse_ha.sim.recovery`):
the spec the policy gives a gang, and one step of the leader's elastic loop
(leader/elastic.py) applied through the real ``apply``.

A step is what the leader proposes once a second: the shrinks
:func:`~synapse_ha.core.scheduler.elastic.plan_shrink` asks for when a gang waits for room
the elastic gangs could give back, else the growth
:func:`~synapse_ha.core.scheduler.elastic.plan_growth` asks for. The members a shrink
stops report their exit (143, as after SIGTERM) and the members a growth adds report
their start in the same instant: the worker's reports, which the simulation does not
delay (as it reports a replaced rank's start)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from synapse_ha.core import commands as c
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, MemberPlacement
from synapse_ha.core.scheduler.elastic import plan_growth, plan_shrink
from synapse_ha.sim.members import SIGTERM_EXIT

ELASTIC_PERIOD_MS = 1_000  # how often the leader plans growth and shrinks (leader/elastic.py)


def elastic_min(replicas: int, share: float) -> int:
    """The fewest members of an elastic gang of at most ``replicas``: ``share`` of them,
    rounded down, at least one."""
    return max(1, math.floor(replicas * share))


def elastic_spec(spec: JobSpec, share: float) -> JobSpec:
    """``spec`` as an elastic gang of ``min`` :func:`elastic_min` to ``max`` its
    ``replicas`` (a one-member job is left as it is: it cannot shrink)."""
    if spec.replicas < 2:
        return spec
    return replace(spec, elastic=ElasticPolicy(elastic_min(spec.replicas, share)))


@dataclass(frozen=True, slots=True)
class Resize:
    """A membership change of a running elastic gang: from ``before`` to ``after``
    members at ``at_ms``; a shrink names the waiting gang it made room for
    (``for_job``)."""

    at_ms: int
    job_id: str
    before: int
    after: int
    for_job: str = ""


def resize_gangs(state: ClusterState, now_ms: int) -> list[Resize]:
    """One step of the leader's elastic loop, applied: the shrinks, else the growth,
    with the members' exits and starts reported. The resizes that took effect, in the
    order applied (a command ``apply`` refuses changes nothing and is left out)."""
    shrinks = plan_shrink(state, now_ms)
    if shrinks:
        return [r for r in (apply_shrink(state, s, now_ms) for s in shrinks) if r is not None]
    growth = plan_growth(state, now_ms)
    if growth is None:
        return []
    before = {g.job_id: _size(state, g.job_id) for g in growth.growths}
    result = apply(state, growth)
    out = []
    for job_id in result.bound:
        attempt = state.jobs[job_id].attempt
        assert attempt is not None
        token = attempt.fencing_token
        added = attempt.members[before[job_id] :]
        _report(state, job_id, token, added, c.MemberEventKind.STARTED, 0, now_ms)
        out.append(Resize(now_ms, job_id, before[job_id], len(attempt.members)))
    return out


def apply_shrink(state: ClusterState, shrink: c.ShrinkMembers, now_ms: int) -> Resize | None:
    """Apply ``shrink``; the ranks it gives back exit at once, and the attempt drops
    them."""
    size = _size(state, shrink.job_id)
    if not apply(state, shrink).ok:
        return None
    attempt = state.jobs[shrink.job_id].attempt
    assert attempt is not None
    leaving = attempt.members[shrink.size :]
    token = shrink.fencing_token
    _report(state, shrink.job_id, token, leaving, c.MemberEventKind.EXITED, SIGTERM_EXIT, now_ms)
    return Resize(now_ms, shrink.job_id, size, len(attempt.members), shrink.for_job)


def _size(state: ClusterState, job_id: str) -> int:
    attempt = state.jobs[job_id].attempt
    assert attempt is not None
    return len(attempt.members)


def _report(
    state: ClusterState,
    job_id: str,
    token: int,
    members: tuple[MemberPlacement, ...],
    kind: c.MemberEventKind,
    exit_code: int,
    now_ms: int,
) -> None:
    """``members`` of the attempt ``token`` report ``kind``, node by node."""
    by_node: dict[str, list[c.MemberEvent]] = {}
    for m in members:
        event = c.MemberEvent(job_id, token, m.rank, kind, exit_code, generation=m.generation)
        by_node.setdefault(m.node_id, []).append(event)
    for node_id, events in sorted(by_node.items()):
        apply(state, c.ReportMembers(node_id, tuple(events), now_ms=now_ms))
