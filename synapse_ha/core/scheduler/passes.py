"""One scheduling pass: walk the queue and place, reserve or explain each gang."""

from __future__ import annotations

from collections.abc import Callable

from synapse_ha.core.commands import GangPlacement
from synapse_ha.core.model import ClusterState, Resources, unconfirmed_members
from synapse_ha.core.reasons import Reason, ReasonCode, ranks_text, reason
from synapse_ha.core.scheduler.capacity import CachedTable, CapacityCache, View
from synapse_ha.core.scheduler.explainer import Explainer
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
from synapse_ha.core.scheduler.plan import Plan
from synapse_ha.core.scheduler.reservation import Running, reserve, running_gangs


def schedule(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None = None,
    *,
    cache: CapacityCache | None = None,
) -> Plan:
    """Plan one scheduling pass over ``state`` at time ``now_ms``. Pure; never mutates.

    ``on_decision(job_id, placed)`` is called after each gang's decision; benchmarks
    use it to time decisions without the core reading a clock.

    With a ``cache``, the free-capacity table is kept between passes and updated from
    the nodes that changed, which makes a pass cost what changed rather than the
    cluster's size. The plan is the same without one (a table built from scratch).
    """
    cached = cache.borrow(state) if cache is not None else CachedTable(state)
    table = cached.table
    # Should _plan raise, the table may be mid-change: it is dropped, never reused.
    plan = _plan(state, now_ms, on_decision, cached.view, cached.empty_view)
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
) -> Plan:
    plan = Plan()
    table = view.table
    restricted: View | None = None  # the view without the reserved nodes
    levels = len(state.config.topology_levels)
    explainer = Explainer(state.config.levels_with_host())
    placed: dict[str, Running] = {}  # gangs placed by this pass
    wait_ms = state.config.locality_wait_ms
    fits_local: dict[tuple[Resources, int, bool, int], bool] = {}  # on an empty cluster
    running: dict[str, Running] | None = None  # every gang holding capacity; on first need

    for job in state.pending_jobs():
        spec = job.spec
        if now_ms < job.retry_not_before_ms:
            continue  # its reason was set when the attempt failed
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
        depths = search_depths(state, spec, levels)
        reservation = plan.reservation
        backfill_ok = (
            reservation is not None
            and reservation.start_ms is not None
            and spec.time_limit_ms > 0
            and now_ms + spec.time_limit_ms <= reservation.start_ms
        )
        target = restricted if restricted is not None and not backfill_ok else view
        local = locality_depths(state, spec, depths) if wait_ms and gang.n > 1 else None
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
        hosts = place(gang, target, local if local is not None else depths)
        if hosts is None and local is not None and fits(gang, target, depths):
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
            end = now_ms + spec.time_limit_ms if spec.time_limit_ms else None
            placed[job.job_id] = Running(end, spec.resources, members)
            if running is not None:
                running[job.job_id] = placed[job.job_id]
            if on_decision is not None:
                on_decision(job.job_id, True)
            continue
        if reservation is None:
            if running is None:
                running = running_gangs(state, placed)
            made = reserve(gang, view, depths, running, lambda: empty_view(state))
            if made is not None:
                plan.reservation = made
                restricted = view.without(made.nodes)
            plan.reasons[job.job_id] = explainer.why_waiting(gang, view, depths, made, now_ms)
        else:
            blocked = fits(gang, view, depths)
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
