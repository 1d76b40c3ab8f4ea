"""Elastic gangs at apply (core/elastic.py): a running elastic gang grows by new top
ranks (:class:`~synapse_ha.core.commands.GrowMembers`, each growth checked as a
replacement is: node, GPUs, room, spares, the owner's unfit nodes, topology, selector)
and shrinks by its top ranks (:class:`~synapse_ha.core.commands.ShrinkMembers`): they
become vacancies of the attempt that are never filled, the worker stops them, and once
the last of them is confirmed stopped (its exit reported, or its node declared dead) the
attempt drops them and its members are told the new, smaller membership."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core.commands import RejectCode, Rejection, Result, error, ok
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.health.fitness import unfit_owners
from synapse_ha.core.machine.binding import member_problem, room_problem, topology_problem
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.machine.replacement import drop_shrunk, running_reason, vacate
from synapse_ha.core.model import Attempt, ClusterState, MemberStatus, Resources
from synapse_ha.core.node_selector import placement_problem
from synapse_ha.core.queues.quota import QueueUsage, growth_usage, members_request
from synapse_ha.core.reasons import ReasonCode, reason
from synapse_ha.core.replacement import leaving
from synapse_ha.core.spares import spare_nodes
from synapse_ha.core.spec.member_limits import reserved_of

Problem = tuple[RejectCode, str]


def _grow_members(state: ClusterState, c: cmd.GrowMembers, now: int) -> Result:
    grown: list[str] = []
    rejected: list[Rejection] = []
    # A growth is charged to its gang's queue and must fit its quota, judged as the plan
    # judged it (growth_usage), from the format that charges an elastic gang for its
    # members on (below it the gang is charged for its max and grows within it).
    usage = growth_usage(state)
    for growth in c.growths:
        problem = _growth_problem(state, growth, now)
        if problem is None and usage is not None:
            problem = _quota_problem(state, usage, growth)
        if problem is not None:
            rejected.append(Rejection(growth.job_id, *problem))
            continue
        _grow(state, growth, now)
        grown.append(growth.job_id)
        if usage is not None:
            spec = state.jobs[growth.job_id].spec
            usage.add(spec.queue, members_request(spec, len(growth.members)))
    return ok(
        f"grew {len(grown)} elastic gang(s), rejected {len(rejected)}",
        bound=tuple(grown),
        rejected=tuple(rejected),
    )


def _growth_problem(state: ClusterState, g: cmd.MemberGrowth, now: int) -> Problem | None:
    """Why ``g`` may not be applied now, or None."""
    job = state.jobs.get(g.job_id)
    if job is None:
        return RejectCode.NO_JOB, "no such job"
    attempt = job.live_attempt()
    spec = job.spec
    if attempt is None or attempt.fencing_token != g.fencing_token:
        return RejectCode.STALE_PLAN, "the attempt is no longer live (or not this one)"
    if spec.elastic is None:
        return RejectCode.WRONG_SIZE, "the job is not elastic"
    if attempt.preempted_by or attempt.vacancies:
        return RejectCode.STALE_PLAN, "the gang is being preempted, replaced or shrunk"
    size = len(attempt.members)
    if not g.members or size + len(g.members) > spec.replicas:
        return (
            RejectCode.WRONG_SIZE,
            f"{size} + {len(g.members)} members; the gang may have {spec.replicas} at most",
        )
    spares = spare_nodes(state)
    taken: dict[str, set[int]] = {}
    per_node: dict[str, Resources] = {}
    need = reserved_of(job)
    generation = attempt.membership + 1
    for i, member in enumerate(g.members):
        if member.generation != generation:
            return (
                RejectCode.STALE_PLAN,
                f"rank {member.rank}: a grown rank's generation is {generation}, "
                f"one above any its rank had in the attempt",
            )
        problem = member_problem(state, spec, size + i, member, taken)
        if problem is not None:
            return problem
        if member.node_id in spares:
            return RejectCode.SPARE_NODE, f"node {member.node_id} is kept as a spare"
        node = state.nodes[member.node_id]
        if node.unfit and job.owner in unfit_owners(node.unfit, now):
            return (
                RejectCode.NODE_UNFIT,
                f"node {node.node_id} could not start this owner's members",
            )
        per_node[member.node_id] = per_node.get(member.node_id, Resources()) + need
    problem = room_problem(state, per_node)
    if problem is not None:
        return problem
    nodes = list(dict.fromkeys(m.node_id for m in (*attempt.members, *g.members)))
    problem = topology_problem(state, spec.topology_required, nodes)
    if problem is None and spec.nodes is not None:
        found = placement_problem(spec.nodes, [state.nodes[n].info for n in nodes])
        problem = (RejectCode.NODE_SELECTOR, found) if found else None
    return problem


def _quota_problem(state: ClusterState, usage: QueueUsage, g: cmd.MemberGrowth) -> Problem | None:
    """Why ``g`` would take its queue over its quota, or None."""
    spec = state.jobs[g.job_id].spec
    short = usage.shortfall(spec.queue, members_request(spec, len(g.members)))
    if short is None:
        return None
    return (
        RejectCode.OVER_QUOTA,
        f"members: queue {short.queue} uses {short.used}/{short.nominal} {short.resource}, "
        f"{short.borrowable} borrowable; {len(g.members)} more member(s) need {short.need}",
    )


def _grow(state: ClusterState, g: cmd.MemberGrowth, now: int) -> None:
    job = state.jobs[g.job_id]
    attempt = job.attempt
    assert attempt is not None
    need = reserved_of(job)
    for member in g.members:
        node = state.nodes[member.node_id]
        node.allocated = node.allocated + need
        node.allocated_gpus.update(member.gpus)
    attempt.members = (*attempt.members, *g.members)
    attempt.member_status.extend(MemberStatus(bound_at_ms=now) for _ in g.members)
    attempt.membership += 1
    job.reason = running_reason(job, attempt)
    state.job_state_changed(job)


def _shrink_members(state: ClusterState, c: cmd.ShrinkMembers, now: int) -> Result:
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(cmd.ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    attempt = job.live_attempt()
    problem = _shrink_problem(job.spec.elastic, attempt, c)
    if problem is not None:
        return error(cmd.ResultCode.CONFLICT, problem)
    assert attempt is not None
    size = len(attempt.members)
    cause = reason(
        ReasonCode.SHRINKING,
        attempt=attempt.number,
        members=size,
        size=c.size,
        for_job=c.for_job or None,
    )
    # A lost rank among those given back is given back as it is (stopped or not).
    attempt.vacancies = tuple(
        dataclasses.replace(v, cause=cause) if v.rank >= c.size else v for v in attempt.vacancies
    )
    vacate(state, job, list(range(c.size, size)), cause, now, stopped=False)
    drop_shrunk(job, attempt)
    job.reason = cause if any(leaving(v) for v in attempt.vacancies) else job.reason
    state.job_state_changed(job)
    return ok(f"{c.job_id}: shrinking from {size} to {c.size} members")


def _shrink_problem(
    elastic: ElasticPolicy | None, attempt: Attempt | None, c: cmd.ShrinkMembers
) -> str | None:
    if elastic is None:
        return f"{c.job_id} is not elastic"
    if attempt is None or attempt.fencing_token != c.fencing_token:
        return f"{c.job_id}: the attempt is no longer live (or not this one)"
    if attempt.preempted_by or any(leaving(v) for v in attempt.vacancies):
        return f"{c.job_id}: the gang is being preempted or shrunk"
    fewest = elastic.min_replicas
    if not fewest <= c.size < len(attempt.members):
        return (
            f"{c.job_id}: cannot shrink from {len(attempt.members)} to {c.size} members "
            f"(its min is {fewest})"
        )
    if {v.rank for v in attempt.vacancies}.issuperset(range(c.size)):
        return f"{c.job_id}: none of its first {c.size} members runs"
    return None


def _touches_growth(state: ClusterState, c: cmd.GrowMembers, changes: Changes) -> None:
    for g in c.growths:
        job_and_its_nodes(state, g.job_id, changes)
        changes.nodes.update(m.node_id for m in g.members)


def _touches_shrink(state: ClusterState, c: cmd.ShrinkMembers, changes: Changes) -> None:
    job_and_its_nodes(state, c.job_id, changes)


HANDLERS: dict[type, Handling] = {
    cmd.GrowMembers: Handling(_grow_members, _touches_growth),
    cmd.ShrinkMembers: Handling(_shrink_members, _touches_shrink),
}
