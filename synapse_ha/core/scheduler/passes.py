"""One scheduling pass: walk the queue and place, reserve or explain each gang."""

from __future__ import annotations

from collections.abc import Callable

from synapse_ha.core.arrays import throttle_reason
from synapse_ha.core.cluster_config import PreemptionMode
from synapse_ha.core.commands import GangPlacement
from synapse_ha.core.model import ClusterState, Job, JobSpec, Resources, unconfirmed_members
from synapse_ha.core.quota import QueueUsage, QuotaShortfall, gang_request, has_quotas
from synapse_ha.core.reasons import Reason, ReasonCode, ranks_text, reason
from synapse_ha.core.scheduler.capacity import CachedTable, CapacityCache, View
from synapse_ha.core.scheduler.explainer import Explainer
from synapse_ha.core.scheduler.order import ordered_pending
from synapse_ha.core.scheduler.placement import (
    NONE,
    Gang,
    commit,
    fits,
    locality_depths,
    members_for,
    place,
    search_depths,
    unfit_nodes,
)
from synapse_ha.core.scheduler.plan import Plan, Reservation
from synapse_ha.core.scheduler.preempting import (
    CLAIM_WINDOW_MS,
    Preempting,
    claimants,
    hold,
    victims_of,
    waiting_for,
)
from synapse_ha.core.scheduler.reservation import Running, reserve, running_gangs
from synapse_ha.core.victims import pending_since


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
    cached = cache.borrow(state) if cache is not None else CachedTable(state)
    table = cached.table
    # Should _plan raise, the table may be mid-change: it is dropped, never reused.
    plan = _plan(state, now_ms, on_decision, cached.view, cached.empty_view, Answers(recall))
    for extra in table.views[1:]:
        extra.detach()
    table.undo(0)
    if cache is not None:
        cache.give_back(cached)
    return plan


def _plan(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None,
    view: View,
    empty_view: Callable[[ClusterState], View],
    answers: Answers,
) -> Plan:
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
    for job in throttled:
        if now_ms >= job.retry_not_before_ms:
            why = waits.get(job.array_id)
            if why is None:
                why = waits[job.array_id] = throttle_reason(state.arrays[job.array_id])
            if job.reason != why:  # most tasks have said so since their submission
                work.plan.reasons[job.job_id] = why
    return _with_causes(state, work.plan)


class _Pass:
    """One pass's working state: the plan it makes and what its decisions share (the
    capacity table and its views, the queues' usage, the preemptors' claims, the gangs it
    placed). :meth:`decide` decides one gang; the pass calls it in queue order."""

    __slots__ = (
        "answers",
        "claims",
        "empty_view",
        "explainer",
        "fits_local",
        "levels",
        "now_ms",
        "placed",
        "plan",
        "preempt",
        "restricted",
        "running",
        "state",
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
    ) -> None:
        self.state = state
        self.now_ms = now_ms
        self.view = view
        self.table = view.table
        self.empty_view = empty_view
        self.answers = answers
        self.plan = Plan()
        self.restricted: View | None = None  # the view without the reserved nodes
        self.levels = len(state.config.topology_levels)
        self.explainer = Explainer(
            state.config.levels_with_host(), recall=answers.enabled, state=state
        )
        self.placed: dict[str, Running] = {}  # gangs placed by this pass
        self.wait_ms = state.config.locality_wait_ms
        # Whether a shape fits its locality on an empty cluster.
        self.fits_local: dict[tuple[Resources, int, bool, frozenset[str], int], bool] = {}
        self.running: dict[str, Running] | None = None  # every gang holding capacity
        self.usage = QueueUsage.of(state) if has_quotas(state) else None
        self.claims = claimants(state)
        self.unfit = unfit_nodes(state, now_ms)
        self.preempt = (
            Preempting(state, now_ms, self.claims)
            if state.config.preemption is not (PreemptionMode.OFF)
            else None
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
        gang = Gang(job, spec, spec.resources, spec.replicas, self.unfit.get(job.owner, NONE))
        answers = self.answers
        depths, local_depths = answers.depths(self.state, spec, self.levels)
        usage = self.usage
        short = usage.shortfall(spec.queue, gang_request(spec)) if usage is not None else None
        victims_left = self.claims.get(job.job_id)
        if victims_left:
            # Its victims are still stopping: keep what it needs from everyone else.
            hold(self.table, gang, self.view, depths, victims_left)
            plan.reasons[job.job_id] = waiting_for(victims_left, job)
            return False
        if short is not None:
            self._preempt_over_quota(gang, depths, short)
            return False
        target = self._target(spec)
        deadline = pending_since(job) + self.wait_ms
        local = self._locality(gang, local_depths, deadline)
        hosts = answers.place(gang, target, local if local is not None else depths)
        if hosts is None and local is not None and answers.fits(gang, target, depths):
            plan.reasons[job.job_id] = self.explainer.why_waiting_for_locality(
                gang, target, local, self.wait_ms
            )
            self._wake_at(deadline)
            return False
        if hosts is not None:
            self._bind(gang, target, hosts)
            return True
        if self.preempt is not None and self._preempt(gang, depths):
            return False
        self._wait(gang, depths)
        self._waiting_on_min_runtime(job)
        return False

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
        preempt = self.preempt
        chosen = (
            preempt.try_for(gang, self.table, self.view, depths, self.usage)
            if preempt is not None
            else None
        )
        job = gang.job
        if chosen is not None:
            self.plan.preemptions.append(chosen)
            self.plan.reasons[job.job_id] = waiting_for(victims_of(preempt, chosen), job)
        else:
            self.plan.reasons[job.job_id] = short.reason()
            self._waiting_on_min_runtime(job)

    def _target(self, spec: JobSpec) -> View:
        """The view a gang is placed on: without the reserved nodes, unless it ends
        before the reservation starts (backfill)."""
        reservation = self.plan.reservation
        backfill_ok = (
            reservation is not None
            and reservation.start_ms is not None
            and spec.time_limit_ms > 0
            and self.now_ms + spec.time_limit_ms <= reservation.start_ms
        )
        restricted = self.restricted
        return restricted if restricted is not None and not backfill_ok else self.view

    def _locality(
        self, gang: Gang, local_depths: list[int] | None, deadline: int
    ) -> list[int] | None:
        """The depths the gang waits for until ``deadline``, or None: a single member, a
        preemptor (its victims were chosen for its topology), the wait over, or a shape
        that would not fit them even on an empty cluster."""
        wait = self.wait_ms and gang.n > 1 and gang.job.job_id not in self.claims
        if not wait or local_depths is None or self.now_ms >= deadline:
            return None
        key = (gang.req, gang.n, bool(gang.spec.image), gang.avoid, local_depths[-1])
        possible = self.fits_local.get(key)
        if possible is None:
            possible = self.fits_local[key] = fits(gang, self.empty_view(self.state), local_depths)
        return local_depths if possible else None

    def _bind(self, gang: Gang, target: View, hosts: list[tuple[str, int]]) -> None:
        """Place the gang on ``hosts``: its capacity taken, its queue charged."""
        job, spec = gang.job, gang.spec
        members = members_for(gang, target, hosts)
        commit(self.table, spec.resources, members)
        self.plan.placements.append(GangPlacement(job.job_id, job.attempts_made, members))
        if self.usage is not None:
            self.usage.add(spec.queue, gang_request(spec))
        if self.preempt is not None:
            self.preempt.placed(spec.queue, gang_request(spec))
        end = self.now_ms + spec.time_limit_ms if spec.time_limit_ms else None
        running = self.placed[job.job_id] = Running(end, spec.resources, members)
        if self.running is not None:
            self.running[job.job_id] = running

    def _preempt(self, gang: Gang, depths: list[int]) -> bool:
        """Victims for a gang that found no room; whether there were."""
        assert self.preempt is not None
        chosen = self.preempt.try_for(gang, self.table, self.view, depths, self.usage)
        if chosen is None:
            return False
        self.plan.preemptions.append(chosen)
        job = gang.job
        self.plan.reasons[job.job_id] = waiting_for(self.preempt.chosen_of(chosen), job)
        return True

    def _wait(self, gang: Gang, depths: list[int]) -> None:
        """A gang that waits: the pass's first one reserves where it will start; the
        others say why they wait (behind the reservation when they would fit)."""
        plan, view, state = self.plan, self.view, self.state
        job_id = gang.job.job_id
        reservation = plan.reservation
        if reservation is None:
            if self.running is None:
                self.running = running_gangs(state, self.placed)
            made = self.answers.reserve(
                gang, view, depths, self.running, lambda: self.empty_view(state)
            )
            if made is not None:
                plan.reservation = made
                self.restricted = view.without(made.nodes)
            plan.reasons[job_id] = self.explainer.why_waiting(gang, view, depths, made, self.now_ms)
        else:
            blocked = self.answers.fits(gang, view, depths)
            plan.reasons[job_id] = self.explainer.why_waiting(
                gang, view, depths, None, self.now_ms, behind=reservation if blocked else None
            )


# Reasons a gang gives when nothing else explains its wait better than the minimum run
# time of the gangs it may preempt.
_NO_ROOM = frozenset(
    {ReasonCode.WAITING_CAPACITY, ReasonCode.FIRST_IN_LINE_RESERVED, ReasonCode.WAITING_QUOTA}
)


def _with_causes(state: ClusterState, plan: Plan) -> Plan:
    """The plan with its reasons' causes and the reasons that changed. A gang queued
    again after an attempt ended says how that attempt ended (a disruption that requeued
    it, or a failure being retried)."""
    for job_id, why in plan.reasons.items():
        last = state.jobs[job_id].attempt
        if why.cause is None and last is not None and last.outcome is not None:
            plan.reasons[job_id] = Reason(why.code, why.params, last.outcome)
    plan.changed_reasons = [
        (job_id, why)
        for job_id, why in sorted(plan.reasons.items())
        if state.jobs[job_id].reason != why
    ]
    return plan


class Answers:
    """What this pass already worked out for a gang shape on a version of a view.

    Whether a gang fits, where ``place`` finds no room and where the reservation search
    finds no start depend only on the gang's shape (per-member request, member count,
    whether it needs image support), the depths searched and the free capacity the view
    shows, which the view and the table's version name exactly (``Table.version``). A
    long queue of alike gangs, the common case under a stream of submissions, therefore
    costs one search per shape and capacity change instead of one per gang. Only answers
    that leave the table as it was are kept (no room, fits or not, no reservation): a
    placement changes the version. ``enabled=False`` keeps nothing.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.no_room: set[tuple[object, ...]] = set()
        self.fit: dict[tuple[object, ...], bool] = {}
        self.no_start: set[tuple[object, ...]] = set()
        self.searched: dict[tuple[str, str], tuple[list[int], list[int] | None]] = {}

    @staticmethod
    def _key(gang: Gang, view: View, depths: list[int]) -> tuple[object, ...]:
        # Plain ints, not the Resources value: they hash and compare without Python code.
        req = gang.req
        return (
            req.gpu,
            req.cpu_milli,
            req.memory_mib,
            gang.n,
            bool(gang.spec.image),
            gang.avoid,
            tuple(depths),
            view,
            view.version,
        )

    def depths(
        self, state: ClusterState, spec: JobSpec, levels: int
    ) -> tuple[list[int], list[int] | None]:
        """The depths a gang searches and those it searches while it waits for locality
        (:func:`search_depths`, :func:`locality_depths`), per topology request. The lists
        are shared: callers do not change them."""
        key = (spec.topology_required, spec.topology_preferred)
        hit = self.searched.get(key) if self.enabled else None
        if hit is None:
            depths = search_depths(state, spec, levels)
            hit = (depths, locality_depths(state, spec, depths))
            if self.enabled:
                self.searched[key] = hit
        return hit

    def place(self, gang: Gang, view: View, depths: list[int]) -> list[tuple[str, int]] | None:
        if not self.enabled:
            return place(gang, view, depths)
        key = self._key(gang, view, depths)
        if key in self.no_room:
            return None
        hosts = place(gang, view, depths)
        if hosts is None:
            self.no_room.add(key)
        return hosts

    def fits(self, gang: Gang, view: View, depths: list[int]) -> bool:
        if not self.enabled:
            return fits(gang, view, depths)
        key = self._key(gang, view, depths)
        hit = self.fit.get(key)
        if hit is None:
            hit = self.fit[key] = fits(gang, view, depths)
        return hit

    def reserve(
        self,
        gang: Gang,
        view: View,
        depths: list[int],
        running: dict[str, Running],
        empty_view: Callable[[], View],
    ) -> Reservation | None:
        """:func:`reserve`; a shape that found no start finds none again until the
        capacity changes (which is also when the running gangs change: a placement)."""
        if not self.enabled:
            return reserve(gang, view, depths, running, empty_view)
        key = self._key(gang, view, depths)
        if key in self.no_start:
            return None
        made = reserve(gang, view, depths, running, empty_view)
        if made is None:
            self.no_start.add(key)  # the search undid its changes: the same version
        return made
