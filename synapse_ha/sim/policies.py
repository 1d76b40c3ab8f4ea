"""Scheduling policies behind one interface: ours (the real ``core.schedule``) and the
baselines we compare against. Every policy's plan goes through the real ``apply``."""

from __future__ import annotations

from typing import Protocol

from synapse_ha.core.commands import BindPlan, GangPlacement, Preempt, ShrinkMembers
from synapse_ha.core.model import ClusterState, Job, MemberPlacement, Node, Resources
from synapse_ha.core.scheduler import CapacityCache, schedule


class Policy(Protocol):
    name: str
    topology_aware: bool
    # After ``plan``: the later time at which the policy wants to plan again even if
    # nothing arrives or ends (None: only on events).
    wake_ms: int | None
    # After ``plan``: the preemptions it decided, applied after its bind.
    preempts: tuple[Preempt, ...]
    # After ``plan``: the elastic gangs' shrinks its preemptions take, applied after its
    # bind and before its preemptions (as the leader proposes them).
    shrinks: tuple[ShrinkMembers, ...]

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None: ...


class Ours:
    """Gang + topology placement with best fit, reservation and backfill."""

    name = "ours"
    topology_aware = True

    def __init__(self) -> None:
        self.wake_ms: int | None = None
        self.preempts: tuple[Preempt, ...] = ()
        self.shrinks: tuple[ShrinkMembers, ...] = ()
        self.cache = CapacityCache()

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None:
        result = schedule(state, now_ms, cache=self.cache)
        self.wake_ms = result.wake_ms
        self.preempts = tuple(result.preempt_commands(now_ms))
        self.shrinks = tuple(result.shrink_commands())
        return result.command(now_ms)


def _greedy_members(job: Job, nodes: list[Node]) -> tuple[MemberPlacement, ...] | None:
    """Members of ``job`` on ``nodes`` taken in the given order, or None if they do not fit."""
    req = job.spec.resources
    members: list[MemberPlacement] = []
    for node in nodes:
        free = node.free
        taken = set(node.allocated_gpus)
        while len(members) < job.spec.replicas and req.fits_in(free):
            gpus = tuple(g for g in range(node.info.capacity.gpu) if g not in taken)[: req.gpu]
            taken.update(gpus)
            free = free - req
            members.append(MemberPlacement(len(members), node.node_id, gpus))
        if len(members) == job.spec.replicas:
            return tuple(members)
    return None


def _fifo_queue(state: ClusterState, now_ms: int) -> list[Job]:
    queue = [j for j in state.pending_jobs() if now_ms >= j.retry_not_before_ms]
    queue.sort(key=lambda j: j.seq)
    return queue


class NaiveHeadOfLine:
    """Baseline 1: only the first pending job; greedy over the emptiest nodes; no
    topology, no backfill."""

    name = "naive"
    topology_aware = False
    wake_ms: int | None = None
    preempts: tuple[Preempt, ...] = ()
    shrinks: tuple[ShrinkMembers, ...] = ()

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None:
        queue = _fifo_queue(state, now_ms)
        if not queue:
            return None
        head = queue[0]
        nodes = [n for n in state.nodes.values() if n.schedulable()]
        nodes.sort(key=lambda n: (-n.free.gpu, n.node_id))
        members = _greedy_members(head, nodes)
        if members is None:
            return None
        return BindPlan((GangPlacement(head.job_id, head.attempts_made, members),), (), now_ms)


class FifoFirstFit:
    """Baseline 2: every pending job in submission order, placed on the first nodes
    that fit (by node id); topology ignored; no reservation, so small jobs may overtake
    large ones indefinitely."""

    name = "fifo-first-fit"
    topology_aware = False
    wake_ms: int | None = None
    preempts: tuple[Preempt, ...] = ()
    shrinks: tuple[ShrinkMembers, ...] = ()

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None:
        nodes = sorted(
            (n for n in state.nodes.values() if n.schedulable()), key=lambda n: n.node_id
        )
        # Work on a shadow of the free capacity so one plan never double-books.
        shadow = {n.node_id: (n.free, frozenset(n.allocated_gpus)) for n in nodes}
        free_gpus = sum(free.gpu for free, _ in shadow.values())
        placements = []
        for job in _fifo_queue(state, now_ms):
            req = job.spec.resources
            if req.gpu * job.spec.replicas > free_gpus:
                continue
            members: list[MemberPlacement] = []
            changes: dict[str, tuple[Resources, frozenset[int]]] = {}
            for node in nodes:
                free, used = shadow[node.node_id]
                if not req.fits_in(free):
                    continue
                while len(members) < job.spec.replicas and req.fits_in(free):
                    gpus = tuple(g for g in range(node.info.capacity.gpu) if g not in used)
                    gpus = gpus[: req.gpu]
                    used = used | set(gpus)
                    free = free - req
                    members.append(MemberPlacement(len(members), node.node_id, gpus))
                changes[node.node_id] = (free, used)
                if len(members) == job.spec.replicas:
                    break
            if len(members) == job.spec.replicas:
                shadow.update(changes)
                free_gpus -= req.gpu * job.spec.replicas
                placements.append(GangPlacement(job.job_id, job.attempts_made, tuple(members)))
        if not placements:
            return None
        return BindPlan(tuple(placements), (), now_ms)


POLICIES: dict[str, type[Ours] | type[NaiveHeadOfLine] | type[FifoFirstFit]] = {
    "ours": Ours,
    "naive": NaiveHeadOfLine,
    "fifo-first-fit": FifoFirstFit,
}
