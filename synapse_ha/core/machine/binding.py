"""Binding: the leader's plan verified again at apply, gang by gang and whole (the
nodes, GPUs, room, topology, queue quota and member caps), and a verified gang bound
under a new fencing token."""

from __future__ import annotations

import bisect

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.commands import RejectCode, Rejection, Result, ok
from synapse_ha.core.health.fitness import fault_of, unfit_owners
from synapse_ha.core.job_predicates import gang_sizes
from synapse_ha.core.lifecycle import move_job
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.model import (
    FEATURE_IMAGES,
    Attempt,
    ClusterState,
    Job,
    JobSpec,
    JobState,
    MemberPlacement,
    MemberStatus,
    Node,
    Resources,
    topology_path,
    unconfirmed_members,
)
from synapse_ha.core.node_selector import NodeSelector, placement_problem
from synapse_ha.core.queues.quota import QueueUsage, has_quotas, placed_request
from synapse_ha.core.reasons import Reason, ReasonCode, reason
from synapse_ha.core.spares import NONE, spare_nodes
from synapse_ha.core.spec.member_limits import (
    NO_RULES,
    MemberRules,
    cap_refusal,
    member_counts,
    rules_in_force,
)
from synapse_ha.core.topology import domain_at


def _bind_plan(state: ClusterState, c: cmd.BindPlan, now: int) -> Result:
    bound: list[str] = []
    rejected: list[Rejection] = []
    usage = QueueUsage.of(state) if c.placements and has_quotas(state) else None
    slots = state.array_slots() if c.placements and state.arrays else {}
    rules = rules_in_force(state)
    # Binding a gang off the spares leaves them spares: one set serves the whole plan.
    spares = spare_nodes(state) if c.placements else NONE
    for placement in c.placements:
        problem = verify_placement(state, placement, now, rules)
        if problem is None and spares:
            problem = _verify_spares(spares, placement)
        if problem is None:
            problem = _verify_caps(state, rules, placement)
        if problem is None and usage is not None:
            problem = _verify_quota(state, usage, placement)
        if problem is None and slots:
            problem = _verify_throttle(state, slots, placement)
        if problem is not None:
            rejected.append(problem)
        else:
            _bind(state, placement, now, rules)
            bound.append(placement.job_id)
            array_id = state.jobs[placement.job_id].array_id
            if array_id in slots:
                slots[array_id] -= 1
            if usage is not None:
                spec = state.jobs[placement.job_id].spec
                usage.add(spec.queue, placed_request(state, spec, len(placement.members)))
    shared: dict[Reason, Reason] = {}  # equal reasons kept once (an array's waiting tasks)
    for job_id, why in c.reasons:
        job = state.jobs.get(job_id)
        if job is not None and job.state is JobState.PENDING:
            job.reason = shared.setdefault(why, why)
    return ok(
        f"bound {len(bound)} gang(s), rejected {len(rejected)}",
        bound=tuple(bound),
        rejected=tuple(rejected),
    )


def _verify_throttle(
    state: ClusterState, slots: dict[str, int], p: cmd.GangPlacement
) -> Rejection | None:
    """A task of an array whose throttle's slots are all taken is not bound."""
    array_id = state.jobs[p.job_id].array_id
    if array_id in slots and slots[array_id] <= 0:
        throttle = state.arrays[array_id].throttle
        return Rejection(
            p.job_id,
            RejectCode.ARRAY_THROTTLE,
            f"array {array_id} already runs {throttle} task(s), its throttle",
        )
    return None


def _verify_spares(spares: frozenset[str], p: cmd.GangPlacement) -> Rejection | None:
    """A gang is not bound to a node kept as a hot spare (core/spares.py): those are
    for member replacements. A plan made before the node became one is refused."""
    for member in p.members:
        if member.node_id in spares:
            return Rejection(
                p.job_id,
                RejectCode.SPARE_NODE,
                f"rank {member.rank}: node {member.node_id} is kept as a spare for "
                f"member replacements",
            )
    return None


def verify_placement(
    state: ClusterState, p: cmd.GangPlacement, now: int, rules: MemberRules | None = None
) -> Rejection | None:
    """Why ``p`` cannot be bound to ``state`` now, or None when it can (whole gang), with
    what each member reserves under ``rules`` (default: the rules in force)."""
    job = state.jobs.get(p.job_id)
    problem = _job_problem(job, p, now)
    if problem is None:
        assert job is not None
        reserved = (rules or rules_in_force(state)).reserved(job.spec.resources)
        problem = _members_problem(state, job.spec, reserved, p) or _unfit_problem(
            state, job, p, now
        )
        if problem is None and job.spec.nodes is not None:
            problem = _selector_problem(state, job.spec.nodes, p)
    return Rejection(p.job_id, *problem) if problem is not None else None


def _verify_caps(state: ClusterState, rules: MemberRules, p: cmd.GangPlacement) -> Rejection | None:
    """A gang is bound only within its owner's member caps (core/spec/member_limits.py)."""
    if rules is NO_RULES:
        return None
    job = state.jobs[p.job_id]
    nodes = [m.node_id for m in p.members]
    refusal = cap_refusal(
        rules, state.queues.get(job.spec.queue), member_counts(state), job.owner, nodes
    )
    return Rejection(p.job_id, RejectCode.MEMBER_CAP, refusal) if refusal is not None else None


Problem = tuple[RejectCode, str]


def _job_problem(job: Job | None, p: cmd.GangPlacement, now: int) -> Problem | None:
    """Why the job of ``p`` may not be bound now (it is not pending, the plan is for
    another attempt, it is in back-off or its last attempt's members are unconfirmed)."""
    if job is None:
        return RejectCode.NO_JOB, "no such job"
    if job.state is not JobState.PENDING:
        return RejectCode.NOT_PENDING, f"job is {job.state.value}, not PENDING"
    if job.attempts_made != p.attempts_made:
        return RejectCode.STALE_PLAN, f"stale plan: planned for attempt {p.attempts_made + 1}"
    if now < job.retry_not_before_ms:
        return RejectCode.IN_BACKOFF, "job is still in its retry back-off"
    if unconfirmed_members(job):
        return (
            RejectCode.UNCONFIRMED_MEMBERS,
            "members of the previous attempt have not been confirmed stopped",
        )
    fewest, most = gang_sizes(job.spec)
    if not fewest <= len(p.members) <= most:
        needs = f"{fewest} to {most}" if fewest < most else str(most)
        return (
            RejectCode.WRONG_SIZE,
            f"plan has {len(p.members)} members, job needs {needs}",
        )
    return None


def _unfit_problem(state: ClusterState, job: Job, p: cmd.GangPlacement, now: int) -> Problem | None:
    """A node that could not start a member of the job's owner within the back-off
    does not get another."""
    for member in p.members:
        node = state.nodes[member.node_id]
        if node.unfit and job.owner in unfit_owners(node.unfit, now):
            return (
                RejectCode.NODE_UNFIT,
                f"rank {member.rank}: node {member.node_id} could not start members of "
                f"{job.owner or 'this owner'} lately",
            )
    return None


def _selector_problem(
    state: ClusterState, selector: NodeSelector, p: cmd.GangPlacement
) -> Problem | None:
    """A gang goes only to nodes its selector matches, and holds every node it names
    (core/node_selector.py)."""
    nodes = [state.nodes[node_id].info for node_id in dict.fromkeys(m.node_id for m in p.members)]
    problem = placement_problem(selector, nodes)
    return (RejectCode.NODE_SELECTOR, problem) if problem else None


def _members_problem(
    state: ClusterState, spec: JobSpec, reserved: Resources, p: cmd.GangPlacement
) -> Problem | None:
    """Why the members of ``p`` do not fit: a rank, node or GPU that is wrong, a node
    without room for what the gang puts there (``reserved`` per member), or a span over
    the required domain."""
    per_node: dict[str, Resources] = {}
    gpus_taken: dict[str, set[int]] = {}
    for rank, member in enumerate(p.members):
        problem = member_problem(state, spec, rank, member, gpus_taken)
        if problem is not None:
            return problem
        per_node[member.node_id] = per_node.get(member.node_id, Resources()) + reserved
    return room_problem(state, per_node) or topology_problem(
        state, spec.topology_required, list(per_node)
    )


def room_problem(state: ClusterState, per_node: dict[str, Resources]) -> Problem | None:
    """A node without room for what new members put there (``per_node``), or None."""
    for node_id, request in sorted(per_node.items()):
        node = state.nodes[node_id]
        if not request.fits_in(node.free):
            return (
                RejectCode.NO_ROOM,
                f"node {node_id} no longer fits: needs {request.describe()}, "
                f"has {node.free.describe()} free",
            )
    return None


def topology_problem(state: ClusterState, level: str, node_ids: list[str]) -> Problem | None:
    """Why members on ``node_ids`` break a required topology ``level`` (they span more
    than one of its domains), or None."""
    if not level:
        return None
    levels = state.config.levels_with_host()
    domains = {
        domain_at(topology_path(state.nodes[n].info, state.config.topology_levels), levels, level)
        for n in node_ids
    }
    if len(domains) > 1:
        return (
            RejectCode.TOPOLOGY_SPAN,
            f"members span {len(domains)} {level}s; the job requires one",
        )
    return None


def member_problem(
    state: ClusterState,
    spec: JobSpec,
    rank: int,
    member: MemberPlacement,
    gpus_taken: dict[str, set[int]],
) -> Problem | None:
    """Why rank ``rank`` may not go where ``member`` puts it; its GPUs join
    ``gpus_taken`` when it may."""
    if member.rank != rank:
        return RejectCode.WRONG_RANKS, f"member ranks must be 0..{spec.replicas - 1} in order"
    node = state.nodes.get(member.node_id)
    if node is None:
        return RejectCode.NO_NODE, f"rank {rank}: no node {member.node_id!r}"
    if not node.schedulable():
        return (
            RejectCode.NODE_UNSCHEDULABLE,
            f"rank {rank}: node {member.node_id} is {node.status.value}",
        )
    if spec.image and FEATURE_IMAGES not in node.info.features:
        return (
            RejectCode.NO_IMAGES,
            f"rank {rank}: node {member.node_id} cannot run container images",
        )
    if len(member.gpus) != spec.resources.gpu:
        return (
            RejectCode.WRONG_GPU_COUNT,
            f"rank {rank}: {len(member.gpus)} GPUs given, {spec.resources.gpu} needed",
        )
    taken = gpus_taken.setdefault(member.node_id, set())
    for gpu in member.gpus:
        if not 0 <= gpu < node.info.capacity.gpu:
            return RejectCode.NO_SUCH_GPU, f"rank {rank}: node {member.node_id} has no GPU {gpu}"
        fault = fault_of(node.gpu_faults, gpu) if node.gpu_faults else None
        if fault is not None:
            return (
                RejectCode.GPU_UNHEALTHY,
                f"rank {rank}: GPU {gpu} on {member.node_id} is unhealthy ({fault.code})",
            )
        if gpu in node.allocated_gpus or gpu in taken:
            return (
                RejectCode.GPU_IN_USE,
                f"rank {rank}: GPU {gpu} on {member.node_id} is already in use",
            )
        taken.add(gpu)
    return None


def _verify_quota(state: ClusterState, usage: QueueUsage, p: cmd.GangPlacement) -> Rejection | None:
    """A gang is bound only within what its queue may use now (nominal plus what it may
    borrow from idle cohort quota): the planner's decision, checked again. An elastic
    gang is charged for the members placed, from the format that charges members on
    (quota.placed_request)."""
    spec = state.jobs[p.job_id].spec
    short = usage.shortfall(spec.queue, placed_request(state, spec, len(p.members)))
    if short is None:
        return None
    return Rejection(
        p.job_id,
        RejectCode.OVER_QUOTA,
        f"queue {short.queue} uses {short.used}/{short.nominal} {short.resource}, "
        f"{short.borrowable} borrowable; this gang needs {short.need}",
    )


def _bind(state: ClusterState, p: cmd.GangPlacement, now: int, rules: MemberRules) -> None:
    job = state.jobs[p.job_id]
    reserved = rules.reserved(job.spec.resources)
    state.last_fencing_token += 1
    token = state.last_fencing_token
    for member in p.members:
        node = state.nodes[member.node_id]
        node.allocated = node.allocated + reserved
        node.allocated_gpus.update(member.gpus)
    job.attempts_made += 1
    master = state.nodes[p.members[0].node_id]
    master_port = choose_master_port(state.config, master, token)
    bisect.insort(master.master_ports, master_port)
    job.attempt = Attempt(
        number=job.attempts_made,
        fencing_token=token,
        members=p.members,
        master_port=master_port,
        bound_at_ms=now,
        member_status=[MemberStatus() for _ in p.members],
        reserved=reserved if reserved is not job.spec.resources else None,
    )
    move_job(state, job, lc.JobEvent.BIND)
    hosts = len({m.node_id for m in p.members})
    job.reason = reason(ReasonCode.BOUND, attempt=job.attempts_made, hosts=hosts)


def choose_master_port(config: ClusterConfig, master: Node, token: int) -> int:
    """A port for the rendezvous, not used by another live attempt on the same master node.

    Probing starts at the token's own slot, which is almost always free because tokens
    grow; each probe is a binary search of the node's sorted ports."""
    in_use = master.master_ports
    for step in range(config.master_port_span):
        port = config.master_port_base + (token + step) % config.master_port_span
        i = bisect.bisect_left(in_use, port)
        if i == len(in_use) or in_use[i] != port:
            return port
    return config.master_port_base + token % config.master_port_span


def _touches_plan(state: ClusterState, c: cmd.BindPlan, changes: Changes) -> None:
    for placement in c.placements:
        job_and_its_nodes(state, placement.job_id, changes)
        changes.nodes.update(m.node_id for m in placement.members)
    changes.jobs.update(job_id for job_id, _ in c.reasons)


HANDLERS: dict[type, Handling] = {
    cmd.BindPlan: Handling(_bind_plan, _touches_plan),
}
