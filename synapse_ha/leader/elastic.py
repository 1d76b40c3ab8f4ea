"""The leader's side of elastic gangs (core/elastic.py): at most once a second it
proposes the shrinks that give a waiting gang its room back
(:func:`~synapse_ha.core.scheduler.elastic.plan_shrink`) or, when nobody waits for room,
the growth of running elastic gangs
(:func:`~synapse_ha.core.scheduler.elastic.plan_growth`); one proposal in flight at a
time. It also proposes the shrinks a scheduling pass chose as a preemptor's victims
(:meth:`Elasticity.shrink_for_preemptors`). The nodes of a gang whose membership changed
are nudged to heartbeat at once, so its new members start and the others hear of it
without waiting a heartbeat."""

from __future__ import annotations

from collections.abc import Callable

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState
from synapse_ha.core.scheduler.elastic import plan_growth, plan_shrink
from synapse_ha.leader.in_flight import InFlight

Start = Callable[[cmd.Command, int], InFlight]

PERIOD_MS = 1_000  # how often the plans are made


class Elasticity:
    """Proposals of growth and shrinks. One driver thread."""

    def __init__(self, start: Start) -> None:
        self._start = start
        self._proposals: list[InFlight] = []
        self._nodes: tuple[str, ...] = ()
        self._next_ms = 0

    def step(self, state: ClusterState, now_ms: int) -> tuple[list[str], tuple[str, ...]]:
        """What was proposed (sentences), and the nodes to nudge: those of gangs whose
        growth or shrink committed since the last step."""
        nudge: tuple[str, ...] = ()
        if self._proposals:
            if not all(p.settled(now_ms) for p in self._proposals):
                return [], nudge
            if any((r := p.result()) is not None and r.ok for p in self._proposals):
                nudge = self._nodes
            self._proposals = []
        if now_ms < self._next_ms:
            return [], nudge
        self._next_ms = now_ms + PERIOD_MS
        shrinks = plan_shrink(state, now_ms)
        if shrinks:
            self._proposals = [self._start(c, now_ms) for c in shrinks]
            self._nodes = _nodes_of(state, [c.job_id for c in shrinks])
            return [
                f"shrinking {c.job_id} to {c.size} members for {c.for_job}" for c in shrinks
            ], nudge
        growth = plan_growth(state, now_ms)
        if growth is None:
            return [], nudge
        self._proposals = [self._start(growth, now_ms)]
        self._nodes = _nodes_of(state, [g.job_id for g in growth.growths], growth)
        return [f"growing {g.job_id} by {len(g.members)} member(s)" for g in growth.growths], nudge

    def shrink_for_preemptors(
        self, state: ClusterState, shrinks: list[cmd.ShrinkMembers], now_ms: int
    ) -> list[str]:
        """Propose the shrinks a scheduling pass chose as victims for its preemptors
        (core/scheduler/shrink_victims.py), unless a proposal is in flight; what was
        proposed (sentences). Their nodes are nudged once they commit."""
        if not shrinks or self._proposals:
            return []
        self._proposals = [self._start(c, now_ms) for c in shrinks]
        self._nodes = _nodes_of(state, [c.job_id for c in shrinks])
        return [f"{c.for_job} shrinks {c.job_id} to {c.size} members" for c in shrinks]


def _nodes_of(
    state: ClusterState, job_ids: list[str], growth: cmd.GrowMembers | None = None
) -> tuple[str, ...]:
    """Every node of the gangs whose membership changes: their members' and, of a
    growth, the new members'."""
    nodes: set[str] = set()
    for job_id in job_ids:
        job = state.jobs.get(job_id)
        if job is not None and job.attempt is not None:
            nodes.update(m.node_id for m in job.attempt.members)
    for g in growth.growths if growth is not None else ():
        nodes.update(m.node_id for m in g.members)
    return tuple(sorted(nodes))
