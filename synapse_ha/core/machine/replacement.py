"""Member replacement at apply (core/replacement.py, DESIGN §4): lost ranks of a gang
with ``replace:`` become vacancies of its live attempt, a vacancy's old member is
confirmed stopped by its node's death or its exit report, and the leader's
:class:`~synapse_ha.core.commands.ReplaceMembers` fills stopped vacancies after checking
each new member as a gang's placement is checked (node, GPUs, room, topology, selector).

The rule that keeps two generations of one rank from running at once: a vacancy is
filled only once its old member is known stopped, and every report names its member's
generation, so a late report of an old generation never counts for the new one."""

from __future__ import annotations

import bisect
import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.commands import RejectCode, Rejection, Result, ok
from synapse_ha.core.health.fitness import unfit_owners
from synapse_ha.core.lifecycle import MEMBER, move
from synapse_ha.core.machine.attempts import settle_drained
from synapse_ha.core.machine.binding import choose_master_port, member_problem, topology_problem
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.model import (
    Attempt,
    ClusterState,
    Job,
    JobState,
    MemberPlacement,
    MemberState,
    MemberStatus,
)
from synapse_ha.core.node_selector import placement_problem
from synapse_ha.core.reasons import Reason, ReasonCode, ranks_text, reason
from synapse_ha.core.replacement import Vacancy, leaving
from synapse_ha.core.spec.member_limits import reserved_of


def replaceable(job: Job) -> Attempt | None:
    """The live attempt of ``job`` when a lost member of it may be placed again: its spec
    asks for replacement and it is not being preempted (a preempted gang is leaving)."""
    attempt = job.live_attempt()
    if attempt is None or job.spec.replace is None or attempt.preempted_by:
        return None
    return attempt


def vacate(
    state: ClusterState,
    job: Job,
    ranks: list[int],
    cause: Reason,
    now: int,
    *,
    stopped: bool,
) -> bool:
    """Make ``ranks`` of the job's live attempt vacancies (their members lost as ``cause``
    says) and keep the gang running; False, changing nothing, when that would leave no
    member running (the gang is then requeued whole, as without ``replace:``).

    ``stopped``: the members are known stopped (their node was declared dead), so their
    share of the node is freed now; otherwise it stays reserved until their exit is
    reported (:func:`confirm_vacated`), and the worker, no longer asked to run them,
    stops them."""
    attempt = job.live_attempt()
    assert attempt is not None
    vacant = {v.rank for v in attempt.vacancies}
    lost = [r for r in ranks if r not in vacant and _running_or_bound(attempt, r)]
    left = [
        r
        for r in range(len(attempt.members))
        if r not in vacant and r not in lost and _running_or_bound(attempt, r)
    ]
    if not left:
        return False
    if not lost:
        return True
    added = tuple(Vacancy(r, attempt.members[r].node_id, now, cause, stopped) for r in lost)
    attempt.vacancies = tuple(sorted((*attempt.vacancies, *added), key=lambda v: v.rank))
    for rank in lost:
        if stopped:
            _stopped(state, job, attempt, rank, now)
    if stopped:
        drop_shrunk(job, attempt)
    job.reason = _replacing(attempt, cause)
    state.job_state_changed(job)
    return True


def move_off(state: ClusterState, node_id: str, cause: Reason, now: int) -> tuple[str, ...]:
    """The gangs with ``replace:`` that lose their members on ``node_id`` (drained, found
    slow), in job id order: they are lost there (their worker stops them and reports it)
    and placed again elsewhere, while the others run on."""
    moving = []
    for job_id in state.jobs_on_node(node_id):
        job = state.jobs[job_id]
        attempt = replaceable(job)
        if attempt is None:
            continue
        ranks = [m.rank for m in attempt.members if m.node_id == node_id]
        if vacate(state, job, ranks, cause, now, stopped=False):
            moving.append(job_id)
    return tuple(moving)


def loses_only_leaving(job: Job, ranks: list[int]) -> Attempt | None:
    """The live attempt of ``job`` when every one of ``ranks`` is a rank it is already
    giving back (an elastic gang shrinking): losing them costs the gang nothing."""
    attempt = job.live_attempt()
    if attempt is None or not attempt.vacancies or not ranks:
        return None
    gone = {v.rank for v in attempt.vacancies if leaving(v)}
    return attempt if gone.issuperset(ranks) else None


def drop_shrunk(job: Job, attempt: Attempt) -> None:
    """Once every rank an elastic gang gives back is known stopped, the attempt drops
    them (they are its top ranks) and its members are told the smaller membership."""
    if not attempt.vacancies or not all(v.stopped for v in attempt.vacancies if leaving(v)):
        return
    gone = [v.rank for v in attempt.vacancies if leaving(v)]
    if not gone:
        return
    size = min(gone)
    attempt.members = attempt.members[:size]
    del attempt.member_status[size:]
    attempt.marks = tuple(m for m in attempt.marks if m.rank < size)
    attempt.vacancies = tuple(v for v in attempt.vacancies if not leaving(v))
    attempt.membership += 1
    if not attempt.vacancies:
        job.reason = running_reason(job, attempt)


def _running_or_bound(attempt: Attempt, rank: int) -> bool:
    return attempt.member_status[rank].state is not MemberState.EXITED


def _stopped(state: ClusterState, job: Job, attempt: Attempt, rank: int, now: int) -> None:
    """The old member of vacant ``rank`` is known stopped: free its share of its node."""
    status = attempt.member_status[rank]
    if status.state is not MemberState.EXITED:
        status.state = move(MEMBER, status.state, lc.MemberEvent.EXIT)
        status.finished_at_ms = now
    member = attempt.members[rank]
    node = state.nodes.get(member.node_id)
    if node is not None:
        node.allocated = node.allocated - reserved_of(job)
        node.allocated_gpus.difference_update(member.gpus)


def _replacing(attempt: Attempt, cause: Reason) -> Reason:
    ranks = [v.rank for v in attempt.vacancies if not leaving(v)]
    return reason(ReasonCode.REPLACING, cause, attempt=attempt.number, ranks=ranks_text(ranks))


def confirm_vacated(
    state: ClusterState, job: Job, node_id: str, event: cmd.MemberEvent, now: int
) -> bool:
    """A report of the old member of a vacancy of the job's live attempt: its exit
    confirms it stopped, so the vacancy may be filled (its share of the node is freed);
    any other report of it changes nothing. False when ``event`` is not of such a member.

    Its exit code is not kept: the member was stopped, it did not finish."""
    attempt = job.live_attempt()
    if (
        attempt is None
        or not attempt.vacancies
        or event.kind is cmd.MemberEventKind.CHECKPOINT
        or event.fencing_token != attempt.fencing_token
        or not 0 <= event.rank < len(attempt.members)
    ):
        return False
    member = attempt.members[event.rank]
    if member.node_id != node_id or member.generation != event.generation:
        return False
    at = next((i for i, v in enumerate(attempt.vacancies) if v.rank == event.rank), None)
    if at is None:
        return False
    vacancy = attempt.vacancies[at]
    if not vacancy.stopped and event.kind is cmd.MemberEventKind.EXITED:
        _stopped(state, job, attempt, event.rank, now)
        vacancies = list(attempt.vacancies)
        vacancies[at] = dataclasses.replace(vacancy, stopped=True)
        attempt.vacancies = tuple(vacancies)
        drop_shrunk(job, attempt)
        state.job_state_changed(job)
        settle_drained(state, (node_id,))
    return True


def confirm_on_dead_node(state: ClusterState, job: Job, node_id: str, now: int) -> None:
    """``node_id`` was declared dead: the old members of the job's vacancies there are
    known stopped (their worker fenced itself first)."""
    attempt = job.attempt
    if attempt is None or not any(
        v.node_id == node_id and not v.stopped for v in attempt.vacancies
    ):
        return
    vacancies = []
    for v in attempt.vacancies:
        if v.node_id == node_id and not v.stopped:
            _stopped(state, job, attempt, v.rank, now)
            v = dataclasses.replace(v, stopped=True)
        vacancies.append(v)
    attempt.vacancies = tuple(vacancies)
    drop_shrunk(job, attempt)
    state.job_state_changed(job)


# --------------------------------------------------------------------- the command


def _replace_members(state: ClusterState, c: cmd.ReplaceMembers, now: int) -> Result:
    placed: list[str] = []
    rejected: list[Rejection] = []
    for replacement in c.replacements:
        problem = _problem(state, replacement, now)
        if problem is not None:
            rejected.append(Rejection(replacement.job_id, *problem))
            continue
        _place(state, replacement, now)
        placed.append(f"{replacement.job_id} rank {replacement.member.rank}")
    return ok(
        f"placed {len(placed)} lost member(s) again, rejected {len(rejected)}",
        replacing=tuple(placed),
        rejected=tuple(rejected),
    )


Problem = tuple[RejectCode, str]


def _problem(state: ClusterState, r: cmd.MemberReplacement, now: int) -> Problem | None:
    """Why ``r`` may not be applied now, or None."""
    job = state.jobs.get(r.job_id)
    if job is None:
        return RejectCode.NO_JOB, "no such job"
    attempt = replaceable(job)
    if attempt is None or attempt.fencing_token != r.fencing_token:
        return RejectCode.STALE_PLAN, "the attempt is no longer live (or not this one)"
    rank = r.member.rank
    vacancy = next((v for v in attempt.vacancies if v.rank == rank), None)
    if vacancy is None or not 0 <= rank < len(attempt.members):
        return RejectCode.STALE_PLAN, f"rank {rank} is not waiting to be placed again"
    if not vacancy.stopped:
        return (
            RejectCode.UNCONFIRMED_MEMBERS,
            f"rank {rank}'s lost member on {vacancy.node_id} is not confirmed stopped yet",
        )
    if r.member.generation != attempt.members[rank].generation + 1:
        return RejectCode.STALE_PLAN, f"rank {rank}: stale generation {r.member.generation}"
    spec = job.spec
    problem = member_problem(state, spec, rank, r.member, {})
    if problem is not None:
        return problem
    node = state.nodes[r.member.node_id]
    need = reserved_of(job)
    if not need.fits_in(node.free):
        return (
            RejectCode.NO_ROOM,
            f"node {node.node_id} no longer fits: needs {need.describe()}, "
            f"has {node.free.describe()} free",
        )
    if node.unfit and job.owner in unfit_owners(node.unfit, now):
        return RejectCode.NODE_UNFIT, f"node {node.node_id} could not start this owner's members"
    members = _with(attempt.members, r.member)
    nodes = list(dict.fromkeys(m.node_id for m in members))
    problem = topology_problem(state, spec.topology_required, nodes)
    if problem is None and spec.nodes is not None:
        found = placement_problem(spec.nodes, [state.nodes[n].info for n in nodes])
        problem = (RejectCode.NODE_SELECTOR, found) if found else None
    return problem


def _with(
    members: tuple[MemberPlacement, ...], new: MemberPlacement
) -> tuple[MemberPlacement, ...]:
    return tuple(new if m.rank == new.rank else m for m in members)


def _place(state: ClusterState, r: cmd.MemberReplacement, now: int) -> None:
    job = state.jobs[r.job_id]
    attempt = job.attempt
    assert attempt is not None
    rank = r.member.rank
    old = attempt.members[rank]
    node = state.nodes[r.member.node_id]
    node.allocated = node.allocated + reserved_of(job)
    node.allocated_gpus.update(r.member.gpus)
    if rank == 0:
        _move_master_port(state, attempt, old.node_id, r.member.node_id)
    attempt.members = _with(attempt.members, r.member)
    attempt.member_status[rank] = MemberStatus(bound_at_ms=now)
    attempt.vacancies = tuple(v for v in attempt.vacancies if v.rank != rank)
    attempt.membership += 1
    if attempt.vacancies:
        job.reason = _replacing(attempt, attempt.vacancies[0].cause)
    else:
        job.reason = running_reason(job, attempt)
    state.job_state_changed(job)
    settle_drained(state, (old.node_id,))


def running_reason(job: Job, attempt: Attempt) -> Reason:
    """The reason of a gang whose membership just changed and that has no lost rank:
    running (with how many of its most members, when elastic; with how many were placed
    again), or still bound."""
    if job.state is not JobState.RUNNING:
        hosts = len({m.node_id for m in attempt.members})
        return reason(ReasonCode.BOUND, attempt=attempt.number, hosts=hosts)
    elastic = job.spec.elastic is not None
    return reason(
        ReasonCode.RUNNING,
        attempt=attempt.number,
        members=len(attempt.members) if elastic else None,
        most=job.spec.replicas if elastic else None,
        replaced=None if elastic else attempt.membership or None,
    )


def _move_master_port(state: ClusterState, attempt: Attempt, old: str, new: str) -> None:
    """Rank 0 moved: its rendezvous port is freed on the old node and one is chosen on
    the new (the same number when it is free there)."""
    before = state.nodes.get(old)
    if before is not None:
        ports = before.master_ports
        i = bisect.bisect_left(ports, attempt.master_port)
        if i < len(ports) and ports[i] == attempt.master_port:
            del ports[i]
    master = state.nodes[new]
    port = choose_master_port(state.config, master, attempt.fencing_token)
    bisect.insort(master.master_ports, port)
    attempt.master_port = port


def _touches(state: ClusterState, c: cmd.ReplaceMembers, changes: Changes) -> None:
    for r in c.replacements:
        job_and_its_nodes(state, r.job_id, changes)
        changes.nodes.add(r.member.node_id)


HANDLERS: dict[type, Handling] = {
    cmd.ReplaceMembers: Handling(_replace_members, _touches),
}
