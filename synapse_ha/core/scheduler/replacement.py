"""The leader's plan for lost members (core/replacement.py): each lost rank of a running
gang whose old member is known stopped is placed again, on one node, with the next
generation, keeping the gang's rules: its required topology domain (the one its other
members are in), its node selector, images, the owner's unfit nodes, healthy free GPUs
(one NVLink island when it can).

A pure function of the state; :class:`~synapse_ha.core.commands.ReplaceMembers` is
verified again at apply. Replacements come before the scheduling pass: a gang that is
running with a hole in it holds its other nodes idle until the hole is filled.

The node chosen is, in this order: a hot spare (core/spares.py), in the gang's preferred
topology domain (the one most of its members are in), the tightest fit by GPUs then CPU,
then node id, so the same state always gives the same plan."""

from __future__ import annotations

from collections import Counter

from synapse_ha.core import commands as cmd
from synapse_ha.core.health.fitness import unfit_owners, unhealthy_gpus
from synapse_ha.core.model import (
    FEATURE_IMAGES,
    ClusterState,
    Job,
    MemberPlacement,
    Node,
    Resources,
    topology_path,
)
from synapse_ha.core.node_selector import placement_problem
from synapse_ha.core.replacement import leaving
from synapse_ha.core.scheduler.placement import pick_gpus
from synapse_ha.core.spares import spare_nodes
from synapse_ha.core.spec.member_limits import reserved_of
from synapse_ha.core.topology import domain_at


def plan_replacements(state: ClusterState, now_ms: int) -> cmd.ReplaceMembers | None:
    """Every lost rank that can be placed again now, or None when none can."""
    taken: dict[str, tuple[Resources, set[int]]] = {}  # what this plan took per node
    out: list[cmd.MemberReplacement] = []
    spares: frozenset[str] | None = None  # read once, when a rank is to be placed
    for job in state.live_jobs():  # in job id order
        attempt = job.attempt
        if attempt is None or not attempt.vacancies or job.spec.replace is None:
            continue
        if attempt.preempted_by:
            continue
        members = list(attempt.members)
        vacant = {v.rank for v in attempt.vacancies}
        for vacancy in attempt.vacancies:
            if not vacancy.stopped or leaving(vacancy):
                continue
            if spares is None:
                spares = spare_nodes(state)
            others = [m for m in members if m.rank != vacancy.rank]
            running = [m for m in others if m.rank not in vacant]
            generation = members[vacancy.rank].generation + 1
            placed = place_member(
                state, job, (others, running), (vacancy.rank, generation), taken, spares, now_ms
            )
            if placed is None:
                continue
            members[vacancy.rank] = placed
            out.append(cmd.MemberReplacement(job.job_id, attempt.fencing_token, placed))
    return cmd.ReplaceMembers(tuple(out), now_ms) if out else None


def place_member(
    state: ClusterState,
    job: Job,
    gang: tuple[list[MemberPlacement], list[MemberPlacement]],
    member: tuple[int, int],
    taken: dict[str, tuple[Resources, set[int]]],
    spares: frozenset[str] | None,
    now_ms: int,
) -> MemberPlacement | None:
    """A node and GPUs for a member of ``job`` (``member``: its rank and generation),
    taken from ``taken``; None when no node can hold it now. ``gang``: the job's other
    members, and of those the ones running (their domains are the gang's). ``spares``:
    the hot spares, taken first; None: the spares may not be taken at all."""
    rank, generation = member
    spec = job.spec
    need = reserved_of(job)
    others = [m.node_id for m in gang[0]]
    survivors = [m.node_id for m in gang[1]]
    levels = state.config.levels_with_host()
    required = spec.topology_required
    domain = _domain_of(state, survivors, required, levels) if required else None
    preferred = _majority_domain(state, survivors, spec.topology_preferred, levels)
    kept = spare_nodes(state) if spares is None else frozenset()
    best: tuple[tuple[object, ...], str, tuple[int, ...]] | None = None
    for node_id in sorted(state.nodes):
        node = state.nodes[node_id]
        if spares is None and node_id in kept:
            continue
        gpus = _fit(state, job, node, need, taken, now_ms)
        if gpus is None:
            continue
        path = topology_path(node.info, state.config.topology_levels)
        if domain is not None and domain_at(path, levels, required) != domain:
            continue
        if spec.nodes is not None:
            infos = [state.nodes[n].info for n in dict.fromkeys([*others, node_id])]
            if placement_problem(spec.nodes, infos):
                continue
        in_preferred = preferred is not None and (
            domain_at(path, levels, spec.topology_preferred) == preferred
        )
        free = node.free - taken.get(node_id, (Resources(), set()))[0]
        key = (
            spares is None or node_id not in spares,
            not in_preferred,
            free.gpu - need.gpu,
            free.cpu_milli - need.cpu_milli,
            node_id,
        )
        if best is None or key < best[0]:
            best = (key, node_id, gpus)
    if best is None:
        return None
    _, node_id, gpus = best
    used, gpus_used = taken.get(node_id, (Resources(), set()))
    taken[node_id] = (used + need, gpus_used | set(gpus))
    return MemberPlacement(rank, node_id, gpus, generation)


def _fit(
    state: ClusterState,
    job: Job,
    node: Node,
    need: Resources,
    taken: dict[str, tuple[Resources, set[int]]],
    now_ms: int,
) -> tuple[int, ...] | None:
    """The GPUs a member of ``job`` would get on ``node`` (() without GPUs), or None when
    the node cannot hold it: not schedulable, no room, no images, unfit for its owner."""
    if not node.schedulable():
        return None
    if job.spec.image and FEATURE_IMAGES not in node.info.features:
        return None
    if node.unfit and job.owner in unfit_owners(node.unfit, now_ms):
        return None
    used, gpus_used = taken.get(node.node_id, (Resources(), set()))
    if not need.fits_in(node.free - used):
        return None
    if not need.gpu:
        return ()
    bad = unhealthy_gpus(node.gpu_faults) if node.gpu_faults else frozenset()
    islands = [
        [g for g in island if g not in node.allocated_gpus and g not in gpus_used and g not in bad]
        for island in node.info.gpu_islands
    ]
    if sum(len(i) for i in islands) < need.gpu:
        return None
    return pick_gpus(islands, need.gpu)


def _domain_of(
    state: ClusterState, node_ids: list[str], level: str, levels: tuple[str, ...]
) -> tuple[str, ...] | None:
    """The ``level`` domain the gang's running members share (the first one's: a bound
    gang never spans two), or None when none runs."""
    for node_id in node_ids:
        node = state.nodes.get(node_id)
        if node is not None:
            path = topology_path(node.info, state.config.topology_levels)
            return domain_at(path, levels, level)
    return None


def _majority_domain(
    state: ClusterState, node_ids: list[str], level: str, levels: tuple[str, ...]
) -> tuple[str, ...] | None:
    """The ``level`` domain most of the running members are in (ties: the smallest), or
    None without a level or members."""
    if not level:
        return None
    counts: Counter[tuple[str, ...]] = Counter()
    for node_id in node_ids:
        node = state.nodes.get(node_id)
        if node is not None:
            counts[
                domain_at(topology_path(node.info, state.config.topology_levels), levels, level)
            ] += 1
    if not counts:
        return None
    return min(counts, key=lambda d: (-counts[d], d))
