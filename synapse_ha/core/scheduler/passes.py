"""One scheduling pass: walk the queue and place, reserve or explain each gang."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from synapse_ha.core.cluster_config import PreemptionMode
from synapse_ha.core.collector import collector_paused
from synapse_ha.core.commands import GangPlacement
from synapse_ha.core.model import ClusterState, Job, unconfirmed_members
from synapse_ha.core.queues import quota
from synapse_ha.core.queues.quota import QueueUsage, QuotaShortfall, has_quotas
from synapse_ha.core.queues.victim_rules import pending_since
from synapse_ha.core.reasons import Reason, ReasonCode, ranks_text, reason
from synapse_ha.core.scheduler.answers import Answers
from synapse_ha.core.scheduler.capacity import CachedTable, CapacityCache, View
from synapse_ha.core.scheduler.caps import PassCaps
from synapse_ha.core.scheduler.defrag import Defrag
from synapse_ha.core.scheduler.elastic import shrinking_makes_room, surplus_gangs
from synapse_ha.core.scheduler.explainer import Explainer
from synapse_ha.core.scheduler.order import ordered_pending
from synapse_ha.core.scheduler.pass_preemptions import (
    CLAIM_WINDOW_MS,
    Preempting,
    claimants,
    hold,
    victims_of,
    waiting_for,
)
from synapse_ha.core.scheduler.placement import (
    NO_CAP,
    NONE,
    Gang,
    commit,
    fits,
    members_for,
    unfit_nodes,
)
from synapse_ha.core.scheduler.plan import Plan, with_causes
from synapse_ha.core.scheduler.reservation import Reserved, Running, backfill_ends, running_gangs
from synapse_ha.core.scheduler.selection import Selections
from synapse_ha.core.scheduler.victim_search import Candidate
from synapse_ha.core.workflows.arrays import throttle_reason


def schedule(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None = None,
    *,
    cache: CapacityCache | None = None,
    recall: bool = True,
) -> Plan:
    """Plan one scheduling pass over ``state`` at time ``now_ms``. Pure; never mutates.

    ``on_decision(job_id, placed)`` is called after each gang's decision; benchmarks
    use it to time decisions without the core reading a clock.

    With a ``cache``, the free-capacity table is kept between passes and updated from
    the nodes that changed, which makes a pass cost what changed rather than the
    cluster's size. The plan is the same without one (a table built from scratch).

    With ``recall`` (the default) the pass keeps what it worked out for each gang shape
    (:class:`Answers`), so a queue of many alike gangs costs one search per shape and
    capacity change. ``recall=False`` works every gang out afresh, with the same plan;
    tests compare the two.
    """
    return run(state, now_ms, on_decision, cache=cache, recall=recall).plan


@dataclass(slots=True)
class PassEnd:
    """A pass's plan and what :mod:`.incremental` needs of the pass's working state at
    its end, to decide more gangs after its last one or to tell how long the plan
    stands (the values a pass worked out once and its later gangs would read)."""

    plan: Plan
    claims: dict[str, list[Candidate]]
    unfit: dict[str, frozenset[str]]
    last: Job | None  # the last gang considered in queue order
    queues: frozenset[str]  # the queues of the gangs considered
    throttled: dict[str, Reason]  # throttled tasks past any back-off: their reason
    next_retry_ms: int | None  # the first back-off of a pending gang to end after now
    backfill_ends_ms: int | None  # the first time a gang may no longer backfill
    quotas: bool  # whether queue usage was kept (quotas: fair-share order)
    searches: int  # preemption searches that had candidates
    failed: set[tuple[object, ...]]  # preemption keys that found no victims
    protected: dict[tuple[object, ...], Reason | None]
    unhealthy: int | None
    recalled: Recalled | None = None


@dataclass(slots=True)
class Recalled:
    """What a pass worked out per gang shape (answers, reasons, whether it fits its
    locality) and its views without reserved nodes, all on the table as the pass
    left it: good for another pass on the same table while it keeps ``version``."""

    view: View
    version: int
    views: dict[frozenset[str], View]
    answers: Answers
    explainer: Explainer
    fits_local: dict[tuple[object, ...], bool]
    uses: int = 0

    def usable(self, view: View) -> bool:
        return view is self.view and view.version == self.version and self.uses < _MAX_USES


# Passes that may add to one Recalled (each adds what its new gangs worked out).
_MAX_USES = 1_000


def run(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None = None,
    *,
    cache: CapacityCache | None = None,
    recall: bool = True,
) -> PassEnd:
    """:func:`schedule`, with the pass's end (:class:`PassEnd`). The cyclic garbage
    collector is paused for the pass (:mod:`synapse_ha.core.collector`)."""
    with collector_paused():
        return _run(state, now_ms, on_decision, cache, recall)


def _run(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None,
    cache: CapacityCache | None,
    recall: bool,
) -> PassEnd:
    cached = cache.borrow(state) if cache is not None else CachedTable(state)
    table = cached.table
    # Should _plan raise, the table may be mid-change: it is dropped, never reused.
    end = _plan(state, now_ms, on_decision, cached.view, cached.empty_view, Answers(recall))
    for extra in table.views[1:]:
        extra.detach()
    table.undo(0)
    if end.recalled is not None:
        end.recalled.version = table.version
    if cache is not None:
        cache.give_back(cached)
    return end


def _plan(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None,
    view: View,
    empty_view: Callable[[ClusterState], View],
    answers: Answers,
) -> PassEnd:
    """The pass's decisions, gang by gang in queue order, on the table behind ``view``."""
    work = _Pass(state, now_ms, view, empty_view, answers)
    pending, throttled = state.pending_and_throttled()
    for job in ordered_pending(state, now_ms, work.usage, set(work.claims), pending):
        if now_ms < job.retry_not_before_ms:
            continue  # its reason was set when the attempt failed
        placed = work.decide(job)
        if placed is not None and on_decision is not None:
            on_decision(job.job_id, placed)
    waits: dict[str, Reason] = {}  # one reason per array, shared by its tasks
    whys: dict[str, Reason] = {}
    for job in throttled:
        if now_ms >= job.retry_not_before_ms:
            why = waits.get(job.array_id)
            if why is None:
                why = waits[job.array_id] = throttle_reason(state.arrays[job.array_id])
            whys[job.job_id] = why
            if job.reason != why:  # most tasks have said so since their submission
                work.plan.reasons[job.job_id] = why
    backoffs = [j.retry_not_before_ms for j in (*pending, *throttled)]
    later = [ms for ms in backoffs if ms > now_ms] if max(backoffs, default=0) > now_ms else []
    return work.end(
        with_causes(state, work.plan),
        pending[-1] if pending else None,
        frozenset(job.spec.queue for job in pending),
        whys,
        min(later, default=None),
        backfill_ends(work.explainer.estimates, work.plan.reservations, pending, now_ms),
    )


def extend(
    state: ClusterState, now_ms: int, base: PassEnd, jobs: list[Job], cache: CapacityCache
) -> PassEnd:
    """Decide ``jobs`` (in queue order) after the last gang of the pass that ended in
    ``base``, on ``state`` at ``now_ms``, as a pass over ``state`` does at its end when
    ``jobs`` come last in its order and the rest of the pass decides as ``base`` did
    (the caller's proof), and ``cache`` was last borrowed for a state whose nodes and
    configuration equal ``state``'s. ``base``'s pass took no capacity (no placement, preemption or
    claim), so the table as it left it is the table at the start. The plan returned has
    only these jobs' decisions (placements, reasons, reservation, preemptions, wake);
    its reasons carry their causes, and ``changed_reasons`` is left to the caller."""
    cached = cache.borrow(state, unchanged=True)
    table = cached.table
    recalled = base.recalled if base.recalled and base.recalled.usable(cached.view) else None
    answers = recalled.answers if recalled is not None else Answers()
    work = _Pass(
        state, now_ms, cached.view, cached.empty_view, answers, claims=base.claims, unfit=base.unfit
    )
    made = base.plan.reservations
    if made:
        work.reserved.made.extend(made)
        if recalled is not None:
            table.views.extend(recalled.views.values())  # kept in step again
            work.reserved.views.update(recalled.views)
    if recalled is not None:
        work.explainer, work.fits_local = recalled.explainer, recalled.fits_local
    if work.preempt is not None:
        work.preempt.failed = set(base.failed)
        work.preempt.protected = dict(base.protected)
        work.preempt.searches = base.searches
    work.explainer.known_unhealthy = base.unhealthy
    for job in jobs:
        if now_ms >= job.retry_not_before_ms:
            work.decide(job)
    for extra in table.views[1:]:
        extra.detach()
    table.undo(0)
    cache.give_back(cached)
    plan = work.plan
    for job_id, why in plan.reasons.items():
        last = state.jobs[job_id].attempt
        if why.cause is None and last is not None and last.outcome is not None:
            plan.reasons[job_id] = Reason(why.code, why.params, last.outcome)
    later = [j.retry_not_before_ms for j in jobs if j.retry_not_before_ms > now_ms]
    end = work.end(
        plan,
        jobs[-1] if jobs else base.last,
        base.queues | {job.spec.queue for job in jobs},
        base.throttled,
        min(later, default=None),
        backfill_ends(work.explainer.estimates, work.plan.reservations, jobs, now_ms),
    )
    if end.recalled is not None:
        end.recalled.version = table.version
        end.recalled.uses = recalled.uses + 1 if recalled is not None else 0
    return end


class _Pass:
    """One pass's working state: the plan it makes and what its decisions share (the
    capacity table and its views, the queues' usage, the preemptors' claims, the gangs it
    placed). :meth:`decide` decides one gang; the pass calls it in queue order."""

    __slots__ = (
        "answers",
        "by_members",
        "caps",
        "claims",
        "defrag",
        "empty_view",
        "explainer",
        "fits_local",
        "levels",
        "now_ms",
        "placed",
        "plan",
        "preempt",
        "reserved",
        "running",
        "selections",
        "state",
        "surplus",
        "table",
        "unfit",
        "usage",
        "view",
        "wait_ms",
    )

    def __init__(
        self,
        state: ClusterState,
        now_ms: int,
        view: View,
        empty_view: Callable[[ClusterState], View],
        answers: Answers,
        *,
        claims: dict[str, list[Candidate]] | None = None,
        unfit: dict[str, frozenset[str]] | None = None,
    ) -> None:
        """``claims`` and ``unfit``: :func:`claimants` and :func:`unfit_nodes` of
        ``state`` at ``now_ms``, when the caller knows them."""
        self.state = state
        self.now_ms = now_ms
        self.view = view
        self.table = view.table
        self.empty_view = empty_view
        self.answers = answers
        self.levels = len(state.config.topology_levels)
        self.explainer = Explainer(
            state.config.levels_with_host(), recall=answers.enabled, state=state
        )
        self.reserved = Reserved(state, now_ms, view, self.explainer.estimates)
        self.plan = Plan(reservations=self.reserved.made)
        self.placed: dict[str, Running] = {}  # gangs placed by this pass
        self.wait_ms = state.config.locality_wait_ms
        # Whether a shape fits its locality on an empty cluster.
        self.fits_local: dict[tuple[object, ...], bool] = {}
        self.running: dict[str, Running] | None = None  # every gang holding capacity
        self.surplus: list[Job] | None = None  # elastic gangs above their min
        self.selections = Selections(state)
        self.usage = QueueUsage.of(state) if has_quotas(state) else None
        self.by_members = quota.charges_members(state)  # how elastic gangs are charged
        self.caps = PassCaps(state)
        self.claims = claimants(state) if claims is None else claims
        self.unfit = unfit_nodes(state, now_ms) if unfit is None else unfit
        preempting = state.config.preemption is not PreemptionMode.OFF
        self.preempt = Preempting(state, now_ms, self.claims) if preempting else None
        self.defrag = Defrag(state, now_ms, self.explainer.estimates, self.placed, self.usage)

    def end(
        self,
        plan: Plan,
        last: Job | None,
        queues: frozenset[str],
        throttled: dict[str, Reason],
        next_retry_ms: int | None,
        backfill_ends_ms: int | None,
    ) -> PassEnd:
        preempt = self.preempt
        return PassEnd(
            plan=plan,
            claims=self.claims,
            unfit=self.unfit,
            last=last,
            queues=queues,
            throttled=throttled,
            next_retry_ms=next_retry_ms,
            backfill_ends_ms=backfill_ends_ms,
            quotas=self.usage is not None,
            searches=preempt.searches if preempt is not None else 0,
            failed=preempt.failed if preempt is not None else set(),
            protected=preempt.protected if preempt is not None else {},
            unhealthy=self.explainer.known_unhealthy,
            recalled=Recalled(
                self.view,
                -1,  # set once the table is as the pass found it
                self.reserved.views,
                self.answers,
                self.explainer,
                self.fits_local,
            )
            if self.answers.enabled
            else None,
        )

    def decide(self, job: Job) -> bool | None:
        """Place ``job``'s gang, or say why it waits (holding, preempting or reserving
        on the way); whether it was placed, or None while its last attempt's members
        are still stopping (no decision: the gang is not considered)."""
        plan = self.plan
        last = job.attempt
        if (
            last is not None
            and last.preempted_by in self.claims
            and last.ended_at_ms is not None
            and self.now_ms < last.ended_at_ms + CLAIM_WINDOW_MS
        ):
            self._leave_to_preemptor(job, last.preempted_by, last.ended_at_ms)
            return False
        stopping = unconfirmed_members(job)
        if stopping:
            plan.reasons[job.job_id] = reason(
                ReasonCode.WAITING_STOP_CONFIRMED,
                attempt=job.attempts_made,
                count=len(stopping),
                ranks=ranks_text(stopping),
            )
            return None
        spec = job.spec
        caps = self.caps
        room = caps.room(job)
        gang = Gang(
            job,
            spec,
            caps.reserved(spec.resources),
            spec.replicas,
            self.unfit.get(job.owner, NONE),
            room,
        )
        answers = self.answers
        depths, local_depths = answers.depths(self.state, spec, self.levels)
        if spec.nodes is not None:  # kept to the nodes it selects (core/scheduler/selection.py)
            gang = self.selections.narrow(gang, lambda g: answers.fits(g, self.view, depths))
        usage = self.usage
        asked = quota.admission_request(spec, by_members=self.by_members)
        short = usage.shortfall(spec.queue, asked) if usage else None
        victims_left = self.claims.get(job.job_id)
        if victims_left:
            # Its victims are still stopping: keep what it needs from everyone else.
            hold(self.table, gang, self.view, depths, victims_left)
            plan.reasons[job.job_id] = waiting_for(victims_left, job)
            return False
        over = caps.over_running_cap(job)
        if over is not None:
            plan.reasons[job.job_id] = over
            return False
        if short is not None:
            self._preempt_over_quota(gang, depths, short)
            return False
        target = self._target(job)
        deadline = pending_since(job) + self.wait_ms
        local = self._locality(gang, local_depths, deadline)
        gang, hosts = self._place(gang, target, local if local is not None else depths)
        if hosts is None and local is not None and answers.fits(gang, target, depths):
            plan.reasons[job.job_id] = self.explainer.why_waiting_for_locality(
                gang, target, local, self.wait_ms
            )
            self._wake_at(deadline)
            return False
        if hosts is not None:
            self._bind(gang, target, hosts)
            return True
        if room is not NO_CAP and answers.fits(replace(gang, room=NO_CAP), target, depths):
            plan.reasons[job.job_id] = caps.over_node_cap(job, room)
            return False
        preempt = self.preempt is not None and not self._elastic_room(gang, depths)
        if preempt and self._preempt(gang, depths):
            return False
        self._wait(gang, depths)
        self._waiting_on_min_runtime(job)
        return False

    def _place(
        self, gang: Gang, target: View, depths: list[int]
    ) -> tuple[Gang, list[tuple[str, int]] | None]:
        """Hosts for the whole gang; an elastic one that does not fit whole starts with as
        many members as fit, at least its min, rather than wait (core/elastic.py), and no
        more than its queue's quota admits."""
        elastic = gang.spec.elastic
        if elastic is not None:
            n = quota.members_within(self.usage, gang.spec, by_members=self.by_members)
            gang = replace(gang, n=n)
        hosts = self.answers.place(gang, target, depths)
        if hosts is None and elastic is not None:
            low, high = elastic.min_replicas, gang.n  # high does not fit
            while low < high:  # the largest size that fits, by halving: low, then between
                size = replace(gang, n=low if hosts is None else (low + high) // 2)
                found = self.answers.place(size, target, depths)
                if found is not None:
                    gang, hosts, low = size, found, size.n
                elif hosts is None:
                    break  # not even the min fits
                else:
                    high = size.n
                if high - low <= 1:
                    break
        return gang, hosts

    def _elastic_room(self, gang: Gang, depths: list[int]) -> bool:
        """Shrinking elastic gangs would make room (core/elastic.py): preempt no one."""
        if self.surplus is None:  # gathered once per pass, as the running gangs are
            self.surplus = surplus_gangs(self.state)
        fits_in = partial(self.answers.fits, gang)
        return shrinking_makes_room(self.surplus, gang, self.view, fits_in, depths)

    def _waiting_on_min_runtime(self, job: Job) -> None:
        """A gang without room whose possible victims are within their minimum run time
        says so (rather than only that there is no room), and the pass wakes then."""
        waiting_on = self.preempt.waiting_on if self.preempt is not None else None
        if waiting_on is None:
            return
        self._wake_at(waiting_on.num("until_ms"))
        if self.plan.reasons[job.job_id].code in _NO_ROOM:
            self.plan.reasons[job.job_id] = waiting_on

    def _wake_at(self, ms: int) -> None:
        plan = self.plan
        if plan.wake_ms is None or ms < plan.wake_ms:
            plan.wake_ms = ms

    def _leave_to_preemptor(self, job: Job, preemptor: str, ended_at_ms: int) -> None:
        """A victim does not take back what it freed while its preemptor waits for it
        (else it is bound again, and, having lost nothing yet, is the cheapest victim of
        the next pass)."""
        until = ended_at_ms + CLAIM_WINDOW_MS
        self.plan.reasons[job.job_id] = reason(
            ReasonCode.WAITING_FOR_PREEMPTOR, preemptor=preemptor, until_ms=until
        )
        self._wake_at(until)

    def _preempt_over_quota(self, gang: Gang, depths: list[int], short: QuotaShortfall) -> None:
        """A gang its queue's quota does not admit now: victims within the quota's rules,
        or the shortfall as its reason."""
        preempt, job = self.preempt, gang.job
        chosen = (  # its victims are where it may be placed: not on reserved nodes
            preempt.try_for(gang, self.table, self._target(job), depths, self.usage)
            if preempt is not None
            else None
        )
        if chosen is not None:
            self.plan.preemptions.append(chosen)
            self.plan.reasons[job.job_id] = waiting_for(victims_of(preempt, chosen), job)
        else:
            self.plan.reasons[job.job_id] = short.reason()
            self._waiting_on_min_runtime(job)

    def _target(self, job: Job) -> View:
        """The view a gang is placed on: without the nodes of each reservation it is not
        expected to end before (backfill), and the drained ones likewise."""
        return self.defrag.target(job, self.reserved.target(job))

    def _locality(
        self, gang: Gang, local_depths: list[int] | None, deadline: int
    ) -> list[int] | None:
        """The depths the gang waits for until ``deadline``, or None: a single member, a
        preemptor (its victims were chosen for its topology), the wait over, or a shape
        that would not fit them even on an empty cluster."""
        wait = self.wait_ms and gang.n > 1 and gang.job.job_id not in self.claims
        if not wait or local_depths is None or self.now_ms >= deadline:
            return None
        key = (gang.req, gang.n, bool(gang.spec.image), gang.avoid, gang.must, gang.room,
               local_depths[-1])  # fmt: skip
        possible = self.fits_local.get(key)
        if possible is None:
            possible = self.fits_local[key] = fits(gang, self.empty_view(self.state), local_depths)
        return local_depths if possible else None

    def _bind(self, gang: Gang, target: View, hosts: list[tuple[str, int]]) -> None:
        """Place the gang on ``hosts``: its capacity taken, its queue charged."""
        job, spec = gang.job, gang.spec
        members = members_for(gang, target, hosts)
        commit(self.table, gang.req, members)
        self.caps.placed(job.owner, members)
        self.plan.placements.append(GangPlacement(job.job_id, job.attempts_made, members))
        if self.usage is not None:
            self.usage.add(spec.queue, quota.members_request(spec, gang.n))
        if self.preempt is not None:
            self.preempt.placed(spec.queue, quota.members_request(spec, gang.n))
        end = self.now_ms + spec.time_limit_ms if spec.time_limit_ms else None
        running = self.placed[job.job_id] = Running(end, gang.req, members)
        if self.running is not None:
            self.running[job.job_id] = running

    def _preempt(self, gang: Gang, depths: list[int]) -> bool:
        """Victims for a gang that found no room; whether there were."""
        assert self.preempt is not None
        made = tuple(self.plan.reservations)  # not counted on to start without victims
        chosen = self.preempt.try_for(
            gang, self.table, self._target(gang.job), depths, self.usage, room=True, reserved=made
        )
        if chosen is None:
            return False
        self.plan.preemptions.append(chosen)
        job = gang.job
        self.plan.reasons[job.job_id] = waiting_for(self.preempt.chosen_of(chosen), job)
        return True

    def _wait(self, gang: Gang, depths: list[int]) -> None:
        """A gang that waits: the pass's first ones (up to its limit) reserve where they
        will start, each off the nodes reserved before it; the others say why they wait
        (behind a reservation when they would fit but for it)."""
        plan, view, state, held = self.plan, self.view, self.state, self.reserved
        job_id = gang.job.job_id
        unreserved = held.unreserved() or view
        made = None
        if not held.full():
            if self.running is None:
                self.running = running_gangs(state, self.placed)
            empty = lambda: held.empty_unreserved(self.empty_view(state))  # noqa: E731
            made = self.answers.reserve(gang, unreserved, depths, self.running, empty)
        if made is not None or not held.made:
            plan.reasons[job_id] = self.explainer.why_waiting(
                gang, view, depths, made, self.now_ms, ahead=len(held.made)
            )
        else:
            behind = held.behind(gang.job, lambda v: self.answers.fits(gang, v, depths))
            plan.reasons[job_id] = self.explainer.why_waiting(
                gang, view, depths, None, self.now_ms, behind=behind
            )
        if made is not None:
            held.made.append(made)
        self.defrag.consider(gang, depths, held.unreserved(), unreserved, plan)


# Reasons a gang gives when nothing else explains its wait better than the minimum run
# time of the gangs it may preempt.
_NO_ROOM = frozenset(
    {ReasonCode.WAITING_CAPACITY, ReasonCode.FIRST_IN_LINE_RESERVED, ReasonCode.WAITING_QUOTA}
)
