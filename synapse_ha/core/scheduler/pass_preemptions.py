"""A pass's preemptions: the preemptors' claims and the choice of victims, gang by gang.

A gang that preempted others keeps a claim until it is placed: the free GPUs it will use
are held from later gangs while its victims stop (:func:`hold`), and each victim leaves
what it freed to it for :data:`CLAIM_WINDOW_MS`. :class:`Preempting` chooses the victims
of one pass (the rules and the search are :mod:`.victim_search`'s), bounded per pass.

A gang that waits for room only (its queue's quota admits it) preempts only when that
makes it start sooner: when the gangs estimated to end (time limits, learned or default
estimates: :func:`.reservation.start_by`) free its room no later than its victims would
stop, the longest of their graces from now, it preempts nobody and says so
(``STARTS_WITHOUT_PREEMPTING``), and may preempt once that start has passed. Such a start
counts only on nodes no other gang of the pass has a reservation or such a start on.

A gang seeks its victims where it may be placed (the pass's view for it): a gang after
the pass's reservations in queue order takes none on a reservation's nodes unless it may
backfill before it, so a preemptor never takes a host kept for a gang ahead of it in line.
"""

from __future__ import annotations

from synapse_ha.core.cluster_config import PreemptionKind
from synapse_ha.core.codec.formats import NEW_ENUM_VALUES
from synapse_ha.core.model import ClusterState, Job, JobState, Resources
from synapse_ha.core.queues.quota import QueueUsage, gang_request, grace_ms
from synapse_ha.core.queues.victim_rules import reclaim_due_ms
from synapse_ha.core.reasons import Reason, ReasonCode, reason
from synapse_ha.core.scheduler import shrink_victims
from synapse_ha.core.scheduler.capacity import Table, View
from synapse_ha.core.scheduler.placement import Gang, members_for
from synapse_ha.core.scheduler.plan import Preemption, Reservation
from synapse_ha.core.scheduler.reservation import Running, running_gangs, start_by
from synapse_ha.core.scheduler.victim_search import (
    MAX_TRIALS_PER_PASS,
    Budget,
    Candidate,
    Rules,
    fits_with,
    live_candidates,
    protected_blockers,
    rules_for,
)
from synapse_ha.core.spec.member_limits import reserved_of


def claimants(state: ClusterState) -> dict[str, list[Candidate]]:
    """Pending gangs that preempted others and have not been placed since, each with
    its victims still stopping (an empty list once all have stopped: the gang then
    goes first in the pass and takes what they freed)."""
    out: dict[str, list[Candidate]] = {}
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        attempt = job.attempt
        if attempt is None or not attempt.preempted_by:
            continue
        preemptor = state.jobs.get(attempt.preempted_by)
        if preemptor is None or preemptor.state is not JobState.PENDING:
            continue
        if job.live_attempt() is attempt:
            gpus = gang_request(job.spec).gpu
            out.setdefault(preemptor.job_id, []).append(
                Candidate(
                    job,
                    attempt,
                    gpus,
                    0,
                    job.spec.priority,
                    job.spec.queue,
                    frozenset(m.node_id for m in attempt.members),
                )
            )
        elif job.state is JobState.PENDING:
            out.setdefault(preemptor.job_id, [])
    # Members elastic gangs give back to a preemptor are waited for as victims are.
    for preemptor_id, shrinking in shrink_victims.shrink_claims(state).items():
        out.setdefault(preemptor_id, []).extend(shrinking)
    return out


def waiting_for(victims: list[Candidate], job: Job) -> Reason:
    kind = victims[0].attempt.preemption if victims else None
    return reason(
        ReasonCode.WAITING_FOR_VICTIMS,
        count=len(victims),
        kind=kind.value if kind is not None else None,
        victims=", ".join(v.job_id for v in victims),
    )


def hold(
    table: Table,
    gang: Gang,
    view: View,
    depths: list[int],
    victims: list[Candidate],
    hosts: list[tuple[str, int]] | None = None,
) -> None:
    """Take from the table the free GPUs the gang would use once ``victims`` stop, so
    that no later gang of the pass is placed on them (the preemptor's first claim).
    The victims' own GPUs are still held by them; only free ones are taken. ``hosts``:
    where the search found the gang goes (else placed again here)."""
    if hosts is None:
        hosts = fits_with(gang, table, view, depths, victims)
    if hosts is None:
        return
    held: dict[str, set[int]] = {}
    for v in victims:
        for m in v.attempt.members:
            held.setdefault(m.node_id, set()).update(m.gpus)
    mark = table.mark()
    for v in victims:
        for m in v.attempt.members:
            table.adjust(m.node_id, reserved_of(v.job), m.gpus, +1)
    members = members_for(gang, view, hosts)
    table.undo(mark)
    for m in members:
        free = tuple(g for g in m.gpus if g not in held.get(m.node_id, set()))
        if free:
            table.adjust(m.node_id, Resources(gpu=len(free)), free, -1)


# How long a preempted gang leaves what it freed to its preemptor, counted from when
# its last member stopped; past it the gang may be placed anywhere again.
CLAIM_WINDOW_MS = 60_000
MAX_SEARCHES = 32  # preemption searches per pass; the rest wait for the next pass
# From this format on every replica reads the reason of a gang that starts without
# preempting; below it, gangs preempt as they did.
STARTS_FORMAT = NEW_ENUM_VALUES[ReasonCode.STARTS_WITHOUT_PREEMPTING]


class Preempting:
    """The preemption decisions of one pass: who may still be a victim, what each
    queue keeps, and a bound on the work (searches per pass; shapes that found
    nothing are not searched again in the pass)."""

    def __init__(
        self, state: ClusterState, now_ms: int, claims: dict[str, list[Candidate]]
    ) -> None:
        self.state = state
        self.now_ms = now_ms
        self.claims = claims
        self.candidates: list[Candidate] | None = None
        self.shrinks: dict[str, Candidate] = {}  # elastic gangs above min, as shrinks
        self.keeps: QueueUsage | None = None
        self.claimed: set[str] = set()
        self.searches = 0
        self.failed: set[tuple[object, ...]] = set()
        self.victims: dict[str, list[Candidate]] = {}
        self.budget = Budget(MAX_TRIALS_PER_PASS)
        self.binds: list[tuple[str, Resources]] = []
        # Per shape that found no victims: why, when gangs within their minimum run time
        # are what it waits for. ``waiting_on``: that reason for the gang just tried.
        self.protected: dict[tuple[object, ...], Reason | None] = {}
        self.waiting_on: Reason | None = None
        self.running: dict[str, Running] | None = None  # live gangs, with estimated ends
        self.promised: list[Reservation] = []  # starts without preempting, this pass

    def _keeps(self) -> QueueUsage:
        if self.keeps is None:
            # One whose victims have all stopped counts once bound, as apply counts it.
            self.keeps = QueueUsage.kept_after_reclaims(self.state)
            for queue, request in self.binds:
                self.keeps.add(queue, request)
        return self.keeps

    def placed(self, queue: str, request: Resources) -> None:
        """A gang placed by this pass: its queue keeps it (the bind precedes the
        preemptions, and apply checks a reclaim against the usage after it)."""
        self.binds.append((queue, request))
        if self.keeps is not None:
            self.keeps.add(queue, request)

    def chosen_of(self, p: Preemption) -> list[Candidate]:
        return self.victims[p.preemptor]

    def try_for(
        self,
        gang: Gang,
        table: Table,
        view: View,
        depths: list[int],
        usage: QueueUsage | None,
        *,
        room: bool = False,
        reserved: tuple[Reservation, ...] = (),
    ) -> Preemption | None:
        """Choose victims for ``gang`` and keep its claim, or None. ``room``: the gang
        waits for room only, so it preempts only if that makes it start sooner (module
        doc); ``reserved``: the pass's reservations, whose nodes it does not count on."""
        spec = gang.spec
        req = spec.resources
        key = (  # plain ints rather than the Resources value: no Python code to hash
            spec.queue,
            req.gpu,
            req.cpu_milli,
            req.memory_mib,
            spec.replicas,
            spec.topology_required,
            spec.topology_preferred,
            spec.priority,
            spec.priority_class,
            bool(spec.image),
            gang.avoid,
            gang.must,
            gang.room,
            view.excluded,  # a gang after a reservation seeks victims off its nodes
        )
        self.waiting_on = self.protected.get(key)
        if self.searches >= MAX_SEARCHES or key in self.failed:
            return None
        if self.candidates is None:
            self.candidates = live_candidates(self.state, self.now_ms)
            self.shrinks = shrink_victims.shrink_candidates(self.state, self.now_ms)
        options = self._rules(gang, usage, self.now_ms)
        if not options:
            self._fail(key, gang, usage)
            return None
        self.searches += 1
        for rules in options:
            choice = shrink_victims.choose_with_shrinks(
                self.state, gang, table, view, depths, rules, self.budget, self.shrinks, self.now_ms
            )
            if choice is None:
                continue
            victims = list(choice.victims)
            if room and self._starts_anyway(gang, view, depths, victims, reserved):
                return None
            self.claimed.update(v.job_id for v in victims)
            self.victims[gang.job.job_id] = victims
            # As apply sees the next preemption: these victims leave, this gang takes.
            keeps = self._keeps()
            keeps.add(spec.queue, gang_request(spec))
            for v in victims:
                keeps.remove(v.queue, shrink_victims.given_back(v))
            if usage is not None:
                # The victims count until they stop (apply verifies binds so) and the
                # preemptor has first claim on its queue's quota: later gangs of the
                # pass see both.
                usage.add(spec.queue, gang_request(spec))
            hold(table, gang, view, depths, victims, choice.hosts)
            whole, shrunk = shrink_victims.commands(gang.job.job_id, victims, self.now_ms)
            return Preemption(gang.job.job_id, gang.job.attempts_made, whole, choice.kind, shrunk)
        self._fail(key, gang, usage)
        return None

    def _starts_anyway(
        self,
        gang: Gang,
        view: View,
        depths: list[int],
        victims: list[Candidate],
        reserved: tuple[Reservation, ...],
    ) -> bool:
        """Whether ``gang`` starts without preempting ``victims`` no later than they
        would stop; if so, its start is kept from later gangs of the pass (its nodes,
        and the gangs it waits for as victims), and ``waiting_on`` says why it waits,
        naming the last of those to end, until just after that start."""
        state = self.state
        if state.format_floor < STARTS_FORMAT:
            return False
        grace = max(grace_ms(state.config, v.job.spec) for v in victims)
        if self.running is None:
            # Gangs placed by this pass are left out: they keep their capacity here.
            self.running = running_gangs(state, {})
        found = start_by(gang, view, depths, self.running, self.now_ms, self.now_ms + grace)
        if found is None:
            return False
        made, waits = found
        if any(r.nodes & made.nodes for r in (*reserved, *self.promised)):
            return False
        assert made.start_ms is not None
        self.promised.append(made)
        self.claimed.update(waits)  # what it waits for is no later gang's victim
        last = max(waits.values())
        named = sorted(job_id for job_id, end in waits.items() if end == last)
        shown = ", ".join(named[:_NAMED]) + (", ..." if len(named) > _NAMED else "")
        self.waiting_on = reason(
            ReasonCode.STARTS_WITHOUT_PREEMPTING,
            start_ms=made.start_ms,
            jobs=shown,
            count=len(named),
            grace_ms=grace,
            until_ms=made.start_ms + 1,
        )
        return True

    def _rules(self, gang: Gang, usage: QueueUsage | None, at_ms: int) -> list[Rules]:
        """The kinds of preemption open to ``gang`` at ``at_ms`` (:func:`rules_for`)."""
        assert self.candidates is not None
        keeps = self._keeps()
        return rules_for(self.state, gang, self.candidates, usage, keeps, self.claimed, at_ms)

    def _fail(self, key: tuple[object, ...], gang: Gang, usage: QueueUsage | None) -> None:
        """No victims for ``gang`` (nor for its shape, in this pass): note whether gangs
        within their minimum run time are why."""
        self.failed.add(key)
        assert self.candidates is not None
        found, kind = protected_blockers(
            self.candidates, self.now_ms, lambda at_ms: self._rules(gang, usage, at_ms)
        )
        if not found:
            self.waiting_on = self.protected[key] = None
            return
        until = min(c.protected_until_ms for c in found)
        if kind is PreemptionKind.RECLAIM:  # a reclaim may override them once overdue
            until = min(until, reclaim_due_ms(self.state, gang.job))
        self.waiting_on = self.protected[key] = reason(
            ReasonCode.WAITING_MIN_RUNTIME,
            count=len(found),
            kind=kind.value if kind is not None else None,
            until_ms=until,
        )


_NAMED = 3  # gangs a reason names; it counts them all


def victims_of(preempt: Preempting | None, chosen: Preemption) -> list[Candidate]:
    assert preempt is not None
    return preempt.chosen_of(chosen)
