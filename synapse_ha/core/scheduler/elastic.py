"""The leader's plans for elastic gangs (core/elastic.py): growth onto room nobody waits
for, and the shrink that gives a waiting gang its room back. Pure functions of the state;
:class:`~synapse_ha.core.commands.GrowMembers` and
:class:`~synapse_ha.core.commands.ShrinkMembers` are verified again at apply.

Growth. While no pending gang waits for room (its reason says it waits for capacity, a
reservation or locality, or no pass has looked at it yet) or for gangs being preempted or
shrunk for it, each running elastic gang below its ``max`` gets new top ranks, one node at
a time, by the replacement's rule
(:func:`~synapse_ha.core.scheduler.replacement.place_member`: its required domain, its
preferred domain first, the tightest fit), never on a hot spare, and never beyond what its
queue's quota admits (:func:`growth_usage`, the usage apply checks a growth against too).
Gangs in job id order.

Shrink. An elastic gang with a lost rank no node can hold carries on one member smaller
(:func:`lost_rank_shrinks`) rather than wait for a node. For the first gang (in queue
order: priority, then submission) that waits for room and could be placed if elastic
gangs of no higher priority gave back their members above ``min``, those gangs give back
their top ranks, lowest priority and newest first, as few members as make the room.
Whether the room suffices is the scheduling pass's own question
(:func:`~synapse_ha.core.scheduler.placement.fits`) asked of the free capacity with those
members given back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState, Job, JobState, Resources
from synapse_ha.core.queues.quota import growth_usage, waiting_preemptors
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.replacement import leaving
from synapse_ha.core.scheduler.capacity import Table, View
from synapse_ha.core.scheduler.placement import NONE, Gang, search_depths
from synapse_ha.core.scheduler.placement import fits as fits_gang
from synapse_ha.core.scheduler.replacement import place_member, plan_replacements
from synapse_ha.core.scheduler.selection import Selections
from synapse_ha.core.spares import spare_nodes
from synapse_ha.core.spec.member_limits import reserved_of

MAX_LOOKED_AT = 32  # waiting gangs a shrink plan considers, first in queue order

# The reasons of a pending gang that waits for room (or has not been looked at yet).
WAITS_FOR_ROOM = frozenset(
    {
        ReasonCode.PENDING_FIRST_PASS,
        ReasonCode.WAITING_CAPACITY,
        ReasonCode.WAITING_SHAPE,
        ReasonCode.WAITING_LOCALITY,
        ReasonCode.FIRST_IN_LINE_RESERVED,
    }
)


def growable(state: ClusterState) -> list[Job]:
    """Running elastic gangs below their most members, with no rank lost or leaving and
    not being preempted, in job id order."""
    out = []
    for job in state.live_jobs():
        attempt = job.attempt
        if (
            job.spec.elastic is not None
            and job.state is JobState.RUNNING
            and attempt is not None
            and not attempt.vacancies
            and not attempt.preempted_by
            and len(attempt.members) < job.spec.replicas
        ):
            out.append(job)
    return out


def waiting_for_room(state: ClusterState) -> list[Job]:
    """Pending gangs that wait for room, in queue order (priority, then submission)."""
    waiting = [
        j
        for j in state.jobs.values()
        if j.state is JobState.PENDING and j.reason is not None and j.reason.code in WAITS_FOR_ROOM
    ]
    waiting.sort(key=lambda j: (-j.spec.priority, j.seq, j.job_id))
    return waiting


def surplus_gangs(state: ClusterState) -> list[Job]:
    """Live elastic gangs above their min, with no rank lost or leaving and not being
    preempted: those a shrink may take members from, in job id order."""
    jobs = state.jobs
    surplus = [
        j
        for j in (jobs[job_id] for job_id in state.live_ids())  # sorted below, when any
        if j.spec.elastic is not None
        and j.attempt is not None
        and not j.attempt.vacancies
        and not j.attempt.preempted_by
        and len(j.attempt.members) > j.spec.elastic.min_replicas
    ]
    surplus.sort(key=lambda j: j.job_id)
    return surplus


def shrinking_makes_room(
    surplus: list[Job],
    gang: Gang,
    view: View,
    fits_in: Callable[[View, list[int]], bool],
    depths: list[int],
) -> bool:
    """Whether ``gang`` (which has no room in ``view``) would fit if every elastic gang
    of ``surplus`` (:func:`surplus_gangs`) of no higher priority gave back its members
    above its min: then it waits for those shrinks rather than preempt anyone whole.
    ``view``'s table is left as it was."""
    givers = [g for g in surplus if g.spec.priority <= gang.spec.priority]
    if not givers:
        return False
    table = view.table
    mark = table.mark()
    try:
        for giver in givers:
            attempt = giver.attempt
            assert attempt is not None and giver.spec.elastic is not None
            need = reserved_of(giver)
            for member in attempt.members[giver.spec.elastic.min_replicas :]:
                table.adjust(member.node_id, need, member.gpus, +1)
        return fits_in(view, depths)
    finally:
        table.undo(mark)


def plan_growth(state: ClusterState, now_ms: int) -> cmd.GrowMembers | None:
    """New top ranks for every elastic gang that can grow now, or None."""
    jobs = growable(state)
    if not jobs or waiting_for_room(state) or waiting_preemptors(state):
        return None
    if any(j.reason is not None and j.reason.code is ReasonCode.WAITING_FOR_VICTIMS
           for j in state.jobs.values() if j.state is JobState.PENDING):  # fmt: skip
        return None  # its victims have stopped: the next pass places it
    usage = growth_usage(state)
    taken: dict[str, tuple[Resources, set[int]]] = {}
    growths = []
    for job in jobs:
        attempt = job.attempt
        assert attempt is not None
        members = list(attempt.members)
        added = []
        for rank in range(len(members), job.spec.replicas):
            if usage is not None and usage.shortfall(job.spec.queue, job.spec.resources):
                break  # its queue's quota admits no more members
            member = (rank, attempt.membership + 1)
            placed = place_member(state, job, (members, members), member, taken, None, now_ms)
            if placed is None:
                break
            members.append(placed)
            added.append(placed)
            if usage is not None:
                usage.add(job.spec.queue, job.spec.resources)
        if added:
            growths.append(cmd.MemberGrowth(job.job_id, attempt.fencing_token, tuple(added)))
    return cmd.GrowMembers(tuple(growths), now_ms) if growths else None


def plan_shrink(state: ClusterState, now_ms: int) -> list[cmd.ShrinkMembers]:
    """The shrinks of elastic gangs with a lost rank no node can hold now
    (:func:`lost_rank_shrinks`), and those that make room for the first waiting gang they
    can make room for."""
    return lost_rank_shrinks(state, now_ms) + _room_shrinks(state, now_ms)


def lost_rank_shrinks(state: ClusterState, now_ms: int) -> list[cmd.ShrinkMembers]:
    """An elastic gang above its min with a lost rank (known stopped) that no node can
    hold now carries on one member smaller rather than wait for a node: it gives back its
    top rank (the lost one itself, or a running member whose node then takes the lost
    rank). In job id order."""
    out = []
    placeable: set[tuple[str, int]] | None = None
    for job in state.live_jobs():
        attempt, elastic = job.attempt, job.spec.elastic
        if elastic is None or attempt is None or not attempt.vacancies:
            continue
        if attempt.preempted_by or any(leaving(v) for v in attempt.vacancies):
            continue
        size = len(attempt.members)
        if size - 1 < elastic.min_replicas:
            continue
        if placeable is None:
            planned = plan_replacements(state, now_ms)
            replaced = planned.replacements if planned is not None else ()
            placeable = {(r.job_id, r.member.rank) for r in replaced}
        stuck = [
            v for v in attempt.vacancies if v.stopped and (job.job_id, v.rank) not in placeable
        ]
        if stuck:
            out.append(cmd.ShrinkMembers(job.job_id, attempt.fencing_token, size - 1, "", now_ms))
    return out


def _room_shrinks(state: ClusterState, now_ms: int) -> list[cmd.ShrinkMembers]:
    """The shrinks that make room for the first waiting gang they can make room for."""
    surplus = surplus_gangs(state)
    if not surplus:
        return []
    waiting = waiting_for_room(state)
    if not waiting:
        return []
    table = Table.build(state, spares=spare_nodes(state))
    view = View(table)
    levels = len(state.config.topology_levels)
    selections = Selections(state)
    for job in waiting[:MAX_LOOKED_AT]:
        givers = sorted(
            (g for g in surplus if g.spec.priority <= job.spec.priority),
            key=lambda g: (g.spec.priority, -g.seq, g.job_id),
        )
        if not givers:
            continue
        spec = job.spec
        fewest = spec.elastic.min_replicas if spec.elastic is not None else spec.replicas
        depths = search_depths(state, spec, levels)
        gangs = _kept_to_selector(Gang(job, spec, reserved_of(job), fewest), selections)

        def fits(view: View, gangs: list[Gang] = gangs, depths: list[int] = depths) -> bool:
            return any(fits_gang(g, view, depths) for g in gangs)

        if fits(view):
            continue  # it has room already: the next pass places it
        mark = table.mark()
        chosen = []
        for giver in givers:
            attempt = giver.attempt
            assert attempt is not None and giver.spec.elastic is not None
            need = reserved_of(giver)
            size = len(attempt.members)
            while size > giver.spec.elastic.min_replicas:  # top ranks first, only as many as needed
                size -= 1
                member = attempt.members[size]
                table.adjust(member.node_id, need, member.gpus, +1)
                if fits(view):
                    break
            token = attempt.fencing_token
            chosen.append(cmd.ShrinkMembers(giver.job_id, token, size, job.job_id, now_ms))
            if fits(view):
                return chosen
        table.undo(mark)
    return []


def _kept_to_selector(gang: Gang, selections: Selections) -> list[Gang]:
    """``gang`` as the pass places it: kept to the nodes its node selector allows, one
    variant per alternative of its ``[...]`` group (core/scheduler/selection.py)."""
    selector = gang.spec.nodes
    if selector is None:
        return [gang]
    must = selections.of(selector).must
    return [replace(gang, avoid=avoid, must=must) for avoid in selections.avoid(NONE, selector)]
