"""Elastic gangs that shrink rather than be preempted whole (core/elastic.py, DESIGN §4
and §8). Pure; works on the pass's capacity table and undoes every tentative change.

A **shrink candidate** is an elastic gang above its ``min`` (not being preempted,
replaced or shrunk) offered as its members above ``min``, its top ranks: a
:class:`~synapse_ha.core.scheduler.victim_search.Candidate` whose attempt holds only those
members and whose ``shrink_to`` is the size it keeps. It costs only what those members
lose (:func:`~synapse_ha.core.queues.victim_rules.lost_gpu_ms` of their GPUs, from the
gang's resume point) and, for a reclaim, takes from its queue only their GPUs.

For each kind of preemption that allows an elastic gang above its ``min`` whole (a
reclaim from a borrowing queue, or a higher class of its own queue), the search is run
twice: with each such gang offered as its shrink instead (:func:`offered`; the other
victims whole, so one preemptor's victims may be some shrinks and some whole gangs), and
as before. The set with shrinks is kept when it costs no more GPU-time; each of its
shrinks then gives back as few top ranks as still let the gang be placed
(:func:`fewest_given`). The plan proposes a
:class:`~synapse_ha.core.commands.ShrinkMembers` per shrink (``for_job``: the preemptor)
and the usual :class:`~synapse_ha.core.commands.Preempt` for the whole gangs.

While the members given back stop, the preemptor's claim waits for them as for its whole
victims (:func:`shrink_claims`, read by the pass's claimants).
"""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import PreemptionKind, PreemptionMode
from synapse_ha.core.model import ClusterState, Job, JobState, Resources
from synapse_ha.core.queues.quota import held_request, members_request, shrinking_for
from synapse_ha.core.queues.victim_rules import lost_gpu_ms, protected_until_ms
from synapse_ha.core.replacement import leaving
from synapse_ha.core.scheduler.capacity import Table, View
from synapse_ha.core.scheduler.elastic import surplus_gangs
from synapse_ha.core.scheduler.placement import Gang
from synapse_ha.core.scheduler.victim_search import (
    Budget,
    Candidate,
    Choice,
    Rules,
    choose,
    fits_with,
)

# The kinds under which an elastic gang may shrink instead of being preempted whole.
SHRINKING_KINDS = frozenset({PreemptionKind.PRIORITY, PreemptionKind.RECLAIM})


def shrink_candidates(state: ClusterState, now_ms: int) -> dict[str, Candidate]:
    """Each elastic gang above its min as a shrink to its min, by job id."""
    out: dict[str, Candidate] = {}
    for job in surplus_gangs(state):
        assert job.spec.elastic is not None
        out[job.job_id] = shrink(job, job.spec.elastic.min_replicas, now_ms, state)
    return out


def shrink(job: Job, size: int, now_ms: int, state: ClusterState) -> Candidate:
    """``job``'s live attempt giving back its ranks from ``size`` up, as a candidate."""
    attempt = job.attempt
    assert attempt is not None
    top = attempt.members[size:]
    gpus = members_request(job.spec, len(top)).gpu
    return Candidate(
        job,
        dataclasses.replace(attempt, members=top),
        gpus,
        lost_gpu_ms(attempt, gpus, now_ms),
        job.spec.priority,
        job.spec.queue,
        frozenset(m.node_id for m in top),
        protected_until_ms(state, job, attempt),
        shrink_to=size,
    )


def offered(
    rules: Rules, shrinks: dict[str, Candidate], state: ClusterState, now_ms: int
) -> Rules | None:
    """``rules`` with every elastic gang above its min it allows offered as its shrink
    instead of whole (for a reclaim, giving back no more than its queue borrows); None
    when it allows none or its kind shrinks no one."""
    if rules.kind not in SHRINKING_KINDS or not any(c.job_id in shrinks for c in rules.allowed):
        return None
    allowed = []
    for c in rules.allowed:
        s = shrinks.get(c.job_id)
        if s is not None and c.queue in rules.room and s.gpus > rules.room[c.queue]:
            per_member = c.job.spec.resources.gpu
            size = len(c.attempt.members) - rules.room[c.queue] // per_member
            s = shrink(c.job, size, now_ms, state) if size < len(c.attempt.members) else None
        allowed.append(c if s is None else s)
    return Rules(rules.kind, allowed, rules.room, rules.quota_gap, rules.distance)


def choose_with_shrinks(
    state: ClusterState,
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    rules: Rules,
    budget: Budget,
    shrinks: dict[str, Candidate],
    now_ms: int,
) -> Choice | None:
    """The victims for ``gang`` under ``rules`` (:func:`~.victim_search.choose`), with
    elastic gangs shrunk instead of preempted whole when that costs no more."""
    mode = state.config.preemption
    whole = choose(state, gang, table, view, depths, rules, mode, budget)
    offer = offered(rules, shrinks, state, now_ms)
    if offer is None:
        return whole
    mixed = choose(state, gang, table, view, depths, offer, mode, budget)
    if mixed is None:
        return whole
    if mode is PreemptionMode.TOPOLOGY:
        mixed = fewest_given(state, gang, table, view, depths, rules, mixed, budget, now_ms)
    if whole is not None and _lost(whole) < _lost(mixed):
        return whole
    return mixed


def _lost(choice: Choice) -> int:
    return sum(v.lost_ms for v in choice.victims)


def fewest_given(
    state: ClusterState,
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    rules: Rules,
    choice: Choice,
    budget: Budget,
    now_ms: int,
) -> Choice:
    """``choice`` with each shrink giving back as few top ranks as still let ``gang`` be
    placed (and, for a priority preemption, its queue's quota met)."""
    victims = list(choice.victims)
    hosts = choice.hosts
    for i, v in enumerate(victims):
        if not v.shrink_to:
            continue
        attempt = v.job.attempt
        assert attempt is not None
        for size in range(len(attempt.members) - 1, v.shrink_to, -1):  # fewest given first
            trial = [*victims[:i], shrink(v.job, size, now_ms, state), *victims[i + 1 :]]
            if not rules.quota_met(trial):
                continue
            if not budget.take():
                return Choice(tuple(victims), choice.kind, hosts)
            placed = fits_with(gang, table, view, depths, trial)
            if placed is not None:
                victims, hosts = trial, placed
                break
    return Choice(tuple(victims), choice.kind, hosts)


def given_back(v: Candidate) -> Resources:
    """What a victim's queue is no longer charged for once it has stopped: a whole gang's
    members (less those it already gives back), or a shrink's members."""
    return held_request(v.job, v.attempt, counting_leaving=False)


def commands(
    preemptor: str, victims: list[Candidate], now_ms: int
) -> tuple[tuple[cmd.Victim, ...], tuple[cmd.ShrinkMembers, ...]]:
    """The whole victims of a preemption, and a shrink per victim that shrinks."""
    whole = tuple(cmd.Victim(v.job_id, v.attempt.fencing_token) for v in victims if not v.shrink_to)
    shrunk = tuple(
        cmd.ShrinkMembers(v.job_id, v.attempt.fencing_token, v.shrink_to, preemptor, now_ms)
        for v in victims
        if v.shrink_to
    )
    return whole, shrunk


def shrink_claims(state: ClusterState) -> dict[str, list[Candidate]]:
    """Pending gangs that elastic gangs are giving members back to, each with those
    members still stopping (as candidates holding only them)."""
    out: dict[str, list[Candidate]] = {}
    jobs = state.jobs
    # Only attempts with vacancies can be giving members back: sorted once found.
    vacant = sorted(
        job_id
        for job_id in state.live_ids()
        if (a := jobs[job_id].attempt) is not None and a.vacancies
    )
    for job_id in vacant:
        job = jobs[job_id]
        attempt = job.attempt
        assert attempt is not None
        for_job = shrinking_for(attempt)
        preemptor = state.jobs.get(for_job)
        if preemptor is None or preemptor.state is not JobState.PENDING:
            continue
        ranks = [v.rank for v in attempt.vacancies if leaving(v) and not v.stopped]
        if not ranks:
            continue
        members = tuple(attempt.members[r] for r in ranks)
        out.setdefault(for_job, []).append(
            Candidate(
                job,
                dataclasses.replace(attempt, members=members),
                members_request(job.spec, len(members)).gpu,
                0,
                job.spec.priority,
                job.spec.queue,
                frozenset(m.node_id for m in members),
                shrink_to=min(ranks),
            )
        )
    return out
