"""One scheduling pass: walk the queue and place, reserve or explain each gang."""

from __future__ import annotations

from collections.abc import Callable

from synapse_ha.core.commands import GangPlacement, Victim
from synapse_ha.core.model import (
    ClusterState,
    Job,
    JobSpec,
    JobState,
    PreemptionMode,
    Resources,
    unconfirmed_members,
)
from synapse_ha.core.quota import QueueUsage, gang_request, has_quotas
from synapse_ha.core.reasons import Reason, ReasonCode, ranks_text, reason
from synapse_ha.core.scheduler.capacity import CachedTable, CapacityCache, Table, View
from synapse_ha.core.scheduler.explainer import Explainer
from synapse_ha.core.scheduler.order import ordered_pending
from synapse_ha.core.scheduler.placement import (
    Gang,
    commit,
    fits,
    locality_depths,
    members_for,
    pending_since,
    place,
    search_depths,
)
from synapse_ha.core.scheduler.plan import Plan, Preemption, Reservation
from synapse_ha.core.scheduler.preemption import (
    MAX_TRIALS_PER_PASS,
    Budget,
    Candidate,
    choose,
    fits_with,
    live_candidates,
    rules_for,
)
from synapse_ha.core.scheduler.reservation import Running, reserve, running_gangs


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
    plan = Plan()
    table = view.table
    restricted: View | None = None  # the view without the reserved nodes
    levels = len(state.config.topology_levels)
    explainer = Explainer(state.config.levels_with_host(), recall=answers.enabled)
    placed: dict[str, Running] = {}  # gangs placed by this pass
    wait_ms = state.config.locality_wait_ms
    fits_local: dict[tuple[Resources, int, bool, int], bool] = {}  # on an empty cluster
    running: dict[str, Running] | None = None  # every gang holding capacity; on first need
    usage = QueueUsage.of(state) if has_quotas(state) else None
    claims = claimants(state)
    preempt = (
        Preempting(state, now_ms, claims)
        if state.config.preemption is not (PreemptionMode.OFF)
        else None
    )

    for job in ordered_pending(state, now_ms, usage, set(claims)):
        spec = job.spec
        if now_ms < job.retry_not_before_ms:
            continue  # its reason was set when the attempt failed
        last = job.attempt
        if (
            last is not None
            and last.preempted_by in claims
            and last.ended_at_ms is not None
            and now_ms < last.ended_at_ms + CLAIM_WINDOW_MS
        ):
            # A victim does not take back what it freed while its preemptor waits for it
            # (else it is bound again, and, having lost nothing yet, is the cheapest victim
            # of the next pass).
            until = last.ended_at_ms + CLAIM_WINDOW_MS
            plan.reasons[job.job_id] = reason(
                ReasonCode.WAITING_FOR_PREEMPTOR, preemptor=last.preempted_by, until_ms=until
            )
            if plan.wake_ms is None or until < plan.wake_ms:
                plan.wake_ms = until
            if on_decision is not None:
                on_decision(job.job_id, False)
            continue
        stopping = unconfirmed_members(job)
        if stopping:
            plan.reasons[job.job_id] = reason(
                ReasonCode.WAITING_STOP_CONFIRMED,
                attempt=job.attempts_made,
                count=len(stopping),
                ranks=ranks_text(stopping),
            )
            continue
        gang = Gang(job, spec, spec.resources, spec.replicas)
        depths, local_depths = answers.depths(state, spec, levels)
        short = usage.shortfall(spec.queue, gang_request(spec)) if usage is not None else None
        victims_left = claims.get(job.job_id)
        if victims_left:
            # Its victims are still stopping: keep what it needs from everyone else.
            hold(table, gang, view, depths, victims_left)
            plan.reasons[job.job_id] = waiting_for(victims_left, job)
            if on_decision is not None:
                on_decision(job.job_id, False)
            continue
        if short is not None:
            chosen = (
                preempt.try_for(gang, table, view, depths, usage) if preempt is not None else None
            )
            if chosen is not None:
                plan.preemptions.append(chosen)
                plan.reasons[job.job_id] = waiting_for(victims_of(preempt, chosen), job)
            else:
                plan.reasons[job.job_id] = short.reason()
            if on_decision is not None:
                on_decision(job.job_id, False)
            continue
        reservation = plan.reservation
        backfill_ok = (
            reservation is not None
            and reservation.start_ms is not None
            and spec.time_limit_ms > 0
            and now_ms + spec.time_limit_ms <= reservation.start_ms
        )
        target = restricted if restricted is not None and not backfill_ok else view
        # A preemptor's victims were chosen for its topology: it waits for no locality.
        local = local_depths if wait_ms and gang.n > 1 and job.job_id not in claims else None
        deadline = pending_since(job) + wait_ms
        if local is not None and now_ms < deadline:
            key = (gang.req, gang.n, bool(spec.image), local[-1])
            possible = fits_local.get(key)
            if possible is None:
                possible = fits_local[key] = fits(gang, empty_view(state), local)
            if not possible:
                local = None
        else:
            local = None
        hosts = answers.place(gang, target, local if local is not None else depths)
        if hosts is None and local is not None and answers.fits(gang, target, depths):
            plan.reasons[job.job_id] = explainer.why_waiting_for_locality(
                gang, target, local, wait_ms
            )
            if plan.wake_ms is None or deadline < plan.wake_ms:
                plan.wake_ms = deadline
            if on_decision is not None:
                on_decision(job.job_id, False)
            continue
        if hosts is not None:
            members = members_for(gang, target, hosts)
            commit(table, spec.resources, members)
            plan.placements.append(GangPlacement(job.job_id, job.attempts_made, members))
            if usage is not None:
                usage.add(spec.queue, gang_request(spec))
            if preempt is not None:
                preempt.placed(spec.queue, gang_request(spec))
            end = now_ms + spec.time_limit_ms if spec.time_limit_ms else None
            placed[job.job_id] = Running(end, spec.resources, members)
            if running is not None:
                running[job.job_id] = placed[job.job_id]
            if on_decision is not None:
                on_decision(job.job_id, True)
            continue
        if preempt is not None:
            chosen = preempt.try_for(gang, table, view, depths, usage)
            if chosen is not None:
                plan.preemptions.append(chosen)
                plan.reasons[job.job_id] = waiting_for(preempt.chosen_of(chosen), job)
                if on_decision is not None:
                    on_decision(job.job_id, False)
                continue
        if reservation is None:
            if running is None:
                running = running_gangs(state, placed)
            made = answers.reserve(gang, view, depths, running, lambda: empty_view(state))
            if made is not None:
                plan.reservation = made
                restricted = view.without(made.nodes)
            plan.reasons[job.job_id] = explainer.why_waiting(gang, view, depths, made, now_ms)
        else:
            blocked = answers.fits(gang, view, depths)
            plan.reasons[job.job_id] = explainer.why_waiting(
                gang, view, depths, None, now_ms, behind=reservation if blocked else None
            )
        if on_decision is not None:
            on_decision(job.job_id, False)

    # A gang queued again after an attempt ended says how that attempt ended (a
    # disruption that requeued it, or a failure being retried).
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


# --------------------------------------------------------------------- queues, preemption


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
            table.adjust(m.node_id, v.job.spec.resources, m.gpus, +1)
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
        self.keeps: QueueUsage | None = None
        self.claimed: set[str] = set()
        self.searches = 0
        self.failed: set[tuple[object, ...]] = set()
        self.victims: dict[str, list[Candidate]] = {}
        self.budget = Budget(MAX_TRIALS_PER_PASS)
        self.binds: list[tuple[str, Resources]] = []

    def _keeps(self) -> QueueUsage:
        if self.keeps is None:
            self.keeps = QueueUsage.of(self.state, counting_preempted=False)
            # Gangs still waiting for victims to stop will take their share (as apply
            # counts them); one whose victims have all stopped counts once bound.
            for job_id in sorted(self.claims):
                if self.claims[job_id]:
                    spec = self.state.jobs[job_id].spec
                    self.keeps.add(spec.queue, gang_request(spec))
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
    ) -> Preemption | None:
        """Choose victims for ``gang`` and keep its claim, or None."""
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
        )
        if self.searches >= MAX_SEARCHES or key in self.failed:
            return None
        if self.candidates is None:
            self.candidates = live_candidates(self.state, self.now_ms)
        options = rules_for(self.state, gang, self.candidates, usage, self._keeps(), self.claimed)
        if not options:
            self.failed.add(key)
            return None
        self.searches += 1
        for rules in options:
            choice = choose(
                self.state,
                gang,
                table,
                view,
                depths,
                rules,
                self.state.config.preemption,
                self.budget,
            )
            if choice is None:
                continue
            victims = list(choice.victims)
            self.claimed.update(v.job_id for v in victims)
            self.victims[gang.job.job_id] = victims
            # As apply sees the next preemption: these victims leave, this gang takes.
            keeps = self._keeps()
            keeps.add(spec.queue, gang_request(spec))
            for v in victims:
                keeps.remove(v.queue, gang_request(v.job.spec))
            if usage is not None:
                # The victims count until they stop (apply verifies binds so) and the
                # preemptor has first claim on its queue's quota: later gangs of the
                # pass see both.
                usage.add(spec.queue, gang_request(spec))
            hold(table, gang, view, depths, victims, choice.hosts)
            return Preemption(
                gang.job.job_id,
                gang.job.attempts_made,
                tuple(Victim(v.job_id, v.attempt.fencing_token) for v in victims),
                choice.kind,
            )
        self.failed.add(key)
        return None


def victims_of(preempt: Preempting | None, chosen: Preemption) -> list[Candidate]:
    assert preempt is not None
    return preempt.chosen_of(chosen)
