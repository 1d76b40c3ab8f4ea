"""Incremental planning: a pass that visits only the gangs whose outcome can have changed.

A scheduling pass (:func:`.passes.schedule`) is a function of the state and the time.
:class:`IncrementalPlanner` keeps the previous pass's plan with the snapshot it was made
on, and on the next snapshot works out what changed by record identity (snapshots share
every record no command touched, :mod:`synapse_ha.core.snapshot`). It keeps the previous
plan when that is provably the plan a full pass would make, and otherwise runs one:

* **Nothing the pass reads changed.** Node records, queues, their history, arrays and
  the configuration are equal; every job record that changed differs only in its
  ``reason`` (what the plan's own :class:`~synapse_ha.core.commands.BindPlan` writes). A
  pass reads a pending job's reason in two places only: which reasons changed
  (``changed_reasons``), and whether a throttled task's reason is restated; both are
  brought up to date for the changed jobs alone.
* **Time alone changed nothing.** The plan *stands* from the pass's ``now_ms`` until the
  earliest time the clock alone may change any decision in it (:func:`stands_until`):
  its ``wake_ms`` (locality waits, claim windows, minimum run times), a back-off ending,
  a node's unfit back-off ending, a timed reservation's start, the moment a gang that
  may backfill before one no longer may. Meanwhile the only part of the plan that moves
  with the clock is how far off each timed reservation starts, which the reasons of the
  gangs waiting for it say: those reasons are brought up to date. A plan stands only at
  the time it was made when it reads the clock otherwise: the fair-share order between
  queues (usage decays), a preemption search that had candidates (their cost is the
  work they would lose), or a plan that binds or preempts (the next snapshot holds its
  effects).
* **New gangs that come last.** Gangs submitted since, each after every gang the
  previous pass considered in queue order (the order is plain: one queue, or no quotas;
  no preemptor goes first), are decided after them, as a full pass would at its end; the
  gangs before them are unaffected, since a pass decides in order. This needs the pass's
  working state at its end, which :func:`.passes.extend` rebuilds from a previous pass
  that took no capacity (no placement, preemption or claim).

Anything else (a bind, a release, a node's change, a cancel, a purge, a new queue) runs
a full pass. The hot spares (:mod:`synapse_ha.core.spares`) are a function of what is
compared here (the configuration, the nodes, the jobs' attempts and members) and a job
added since has no member anywhere, so a plan is never kept, nor extended, across a change
of the spares. Pure: the caller passes the time; the planner keeps only values.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from itertools import islice
from typing import TypeVar

from synapse_ha.core.model import ClusterState, Job, JobState, Node
from synapse_ha.core.reasons import Reason
from synapse_ha.core.scheduler.capacity import CapacityCache
from synapse_ha.core.scheduler.passes import PassEnd, extend, run
from synapse_ha.core.scheduler.plan import Plan

_R = TypeVar("_R", Job, Node)

# What a pass reads of a job, but for its reason.
_JOB_FIELDS = tuple(f.name for f in fields(Job) if f.name != "reason")
# State fields no pass reads (counters, request ids, tokens, the node index), and the
# records compared one by one; every other field (a field added later too) is compared
# whole.
_NOT_READ = frozenset(
    {
        "nodes",
        "jobs",
        "request_ids",
        "tokens",
        "next_job_seq",
        "last_fencing_token",
        "applied_commands",
        "last_time_ms",
        "_nodes",  # derived from the jobs, which are compared one by one
        "_fits",  # derived from the nodes, which are compared one by one
        "_members",  # derived from the jobs, which are compared one by one
    }
)
_STATE_FIELDS = tuple(f.name for f in fields(ClusterState) if f.name not in _NOT_READ)


def stands_until(state: ClusterState, now_ms: int, end: PassEnd) -> int:
    """The end (exclusive) of the time from ``now_ms`` during which a pass over
    ``state`` makes ``end.plan`` again, judged from what the pass read of the clock."""
    until = _plan_stands_until(now_ms, end)
    for node in state.nodes.values():
        for unfit in node.unfit:
            until = _sooner(until, unfit.until_ms, now_ms)
    return until


def _plan_stands_until(now_ms: int, end: PassEnd) -> int:
    """:func:`stands_until` but for the nodes' unfit back-offs."""
    plan = end.plan
    if (
        plan.placements
        or plan.preemptions
        or plan.drains  # their costs read the clock (core/scheduler/defrag.py)
        or end.searches
        or (end.quotas and len(end.queues) > 1)
        or (plan.wake_ms is not None and plan.wake_ms <= now_ms)
    ):
        return now_ms + 1
    until = _NEVER
    if plan.wake_ms is not None:
        until = plan.wake_ms
    starts = [made.start_ms for made in plan.reservations]
    for at in (end.next_retry_ms, end.backfill_ends_ms, *starts):
        if at is not None:
            until = _sooner(until, at, now_ms)
    return until


_NEVER = 1 << 62


def _sooner(until: int, at: int, now_ms: int) -> int:
    return at if now_ms < at < until else until


@dataclass(slots=True)
class _Base:
    """The previous pass: the snapshot and time it planned on, and until when it stands."""

    state: ClusterState
    now_ms: int
    end: PassEnd
    until_ms: int
    # The reasons that say how far off a timed reservation starts, and the time they
    # were worked out for.
    timed: tuple[str, ...] = ()
    timed_at_ms: int = 0


class IncrementalPlanner:
    """Plans like :func:`.passes.schedule`, visiting only what changed (module doc).

    Owned by whoever plans (the leader loop); fed snapshots, which are never changed
    once made. Not thread-safe. :meth:`reset` forgets the previous pass (a new leader
    starts with a full one). ``counts`` says how each plan was made: ``full``,
    ``kept``, ``extended``, and for each full pass after the first the reason it was
    needed (``fallback:<why>``).
    """

    def __init__(self, cache: CapacityCache | None = None) -> None:
        self.cache = cache if cache is not None else CapacityCache()
        self.counts: Counter[str] = Counter()
        self._base: _Base | None = None

    def reset(self) -> None:
        self._base = None

    def plan(self, state: ClusterState, now_ms: int) -> Plan:
        """The plan :func:`.passes.schedule` makes of ``state`` at ``now_ms``."""
        base = self._base
        if base is not None:
            kept = self._incremental(base, state, now_ms)
            if isinstance(kept, _Base):
                self._base = kept
                return kept.end.plan
            self.counts["fallback:" + kept] += 1
        self.counts["full"] += 1
        end = run(state, now_ms, cache=self.cache)
        until = stands_until(state, now_ms, end)
        self._base = _Base(state, now_ms, end, until, _timed(end.plan, now_ms), now_ms)
        return end.plan

    def _incremental(self, base: _Base, state: ClusterState, now_ms: int) -> _Base | str:
        """The base brought up to ``state`` and ``now_ms`` without a full pass, or why
        one is needed."""
        if not base.now_ms <= now_ms < base.until_ms:
            return "time"
        diff = _diff(base.state, state)
        if diff is None:
            return "changed"
        reworded, added = diff
        end = base.end
        if base.timed and now_ms != base.timed_at_ms:
            end = _retimed(state, end, base.timed, now_ms)
        if reworded:
            end = _reworded(state, end, reworded)
        if not added:
            self.counts["kept"] += 1
            return _Base(state, base.now_ms, end, base.until_ms, base.timed, now_ms)
        why = _appendable(end, added)
        if why is not None:
            return why
        more = extend(state, now_ms, end, added, self.cache)
        self.counts["extended"] += 1
        until = min(base.until_ms, _plan_stands_until(now_ms, more))
        timed = (*base.timed, *_timed(more.plan, now_ms))
        return _Base(state, now_ms, _merged(state, end, more), until, timed, now_ms)


def _timed(plan: Plan, now_ms: int) -> tuple[str, ...]:
    """The jobs whose reasons say how far off one of the plan's reservations starts (none
    of one that is due: they say it starts now)."""
    starts = _starts(plan)
    if not any(start is not None and start > now_ms for start in starts.values()):
        return ()
    return tuple(
        job_id
        for job_id, why in plan.reasons.items()
        if why.has(_START_IN) and (start := starts.get(_holder(job_id, why))) and start > now_ms
    )


_START_IN = "start_in_ms"


def _starts(plan: Plan) -> dict[str, int | None]:
    """The start of each reservation of ``plan``, by the job that holds it."""
    return {made.job_id: made.start_ms for made in plan.reservations}


def _holder(job_id: str, why: Reason) -> str:
    """The job holding the reservation that ``job_id``'s reason says it waits for: the one
    it names, else its own."""
    return why.text(_HOLDER) if why.has(_HOLDER) else job_id


_HOLDER = "holder"


def _retimed(state: ClusterState, end: PassEnd, job_ids: tuple[str, ...], now_ms: int) -> PassEnd:
    """``end`` at ``now_ms``, before its timed reservations start: the reasons of
    ``job_ids`` say how far off theirs is then (the only part of such a plan that moves
    with the clock while it stands)."""
    plan = end.plan
    starts = _starts(plan)
    reasons = dict(plan.reasons)
    changed = dict(plan.changed_reasons)
    for job_id in job_ids:
        why = reasons[job_id]
        start = starts[_holder(job_id, why)]
        assert start is not None and start > now_ms
        start_in = start - now_ms
        params = tuple((k, start_in if k == _START_IN else v) for k, v in why.params)
        why = reasons[job_id] = Reason(why.code, params, why.cause)
        if state.jobs[job_id].reason != why:
            changed[job_id] = why
        else:
            changed.pop(job_id, None)
    return _with_reasons(end, reasons, changed)


def _diff(old: ClusterState, new: ClusterState) -> tuple[list[str], list[Job]] | None:
    """The jobs whose reason alone changed, and the jobs added (in the order the state
    holds them); None when anything else a pass reads changed."""
    for name in _STATE_FIELDS:
        a, b = getattr(old, name), getattr(new, name)
        if a is not b and a != b:
            return None
    if new.nodes is not old.nodes:
        if len(new.nodes) != len(old.nodes):
            return None
        # A node removed and another added in its place differ in their ids.
        for _ in _differing(list(old.nodes.values()), list(new.nodes.values())):
            return None
    if new.jobs is old.jobs:
        return [], []
    before, after = old.jobs, new.jobs
    kept = len(before)
    if len(after) < kept:
        return None  # a job removed (a purge)
    reworded: list[str] = []
    for a, b in _differing(list(before.values()), list(islice(after.values(), kept))):
        # A job removed and another added in its place differ in their ids.
        for name in _JOB_FIELDS:
            x, y = getattr(a, name), getattr(b, name)
            if x is not y and x != y:
                return None
        reworded.append(a.job_id)
    return reworded, list(islice(after.values(), kept, None))


def _differing(old: list[_R], new: list[_R]) -> Iterator[tuple[_R, _R]]:
    """The pairs at the same positions of two equally long lists of records that
    differ, found a chunk at a time (a list comparison runs in C, identity first)."""
    step = 512
    for start in range(0, len(old), step):
        a, b = old[start : start + step], new[start : start + step]
        if a != b:
            yield from ((x, y) for x, y in zip(a, b, strict=True) if x is not y and x != y)


def _reworded(state: ClusterState, end: PassEnd, job_ids: list[str]) -> PassEnd:
    """``end`` on ``state``, where only the reasons of ``job_ids`` changed: the plan's
    changed reasons, and the throttled tasks it restates, as a pass over ``state``."""
    plan = end.plan
    reasons = plan.reasons
    changed = dict(plan.changed_reasons)
    for job_id in job_ids:
        now = state.jobs[job_id].reason
        throttled = end.throttled.get(job_id)
        if throttled is not None:
            if reasons is plan.reasons:
                reasons = dict(reasons)
            if now != throttled:
                reasons[job_id] = throttled
            else:
                reasons.pop(job_id, None)
        why = reasons.get(job_id)
        if why is not None and why != now:
            changed[job_id] = why
        else:
            changed.pop(job_id, None)
    return _with_reasons(end, reasons, changed)


def _appendable(end: PassEnd, added: list[Job]) -> str | None:
    """None when a pass considers ``added`` (in this order) after every gang that the
    pass which ended in ``end`` considered, and that pass took no capacity and searched
    no victims; else why not."""
    plan = end.plan
    if plan.placements or plan.preemptions or end.claims or end.searches:
        return "took-capacity"
    if plan.drains:  # held hosts a new gang's pass would not know of
        return "drains"
    for job in added:
        if job.state is not JobState.PENDING or job.waiting_for or job.array_id:
            return "added-not-plain"
    if end.quotas and len(end.queues | {job.spec.queue for job in added}) > 1:
        return "fair-share-order"
    last = _order_key(end.last) if end.last is not None else None
    for job in added:
        key = _order_key(job)
        if last is not None and key <= last:
            return "added-not-last"
        last = key
    return None


def _order_key(job: Job) -> tuple[int, int, int]:
    return (-job.spec.priority, job.seq, job.array_index)


def _merged(state: ClusterState, end: PassEnd, more: PassEnd) -> PassEnd:
    """The base's plan followed by ``more``'s decisions, with the changed reasons."""
    plan, extra = end.plan, more.plan
    reasons = {**plan.reasons, **extra.reasons}
    changed = dict(plan.changed_reasons)
    for job_id, why in extra.reasons.items():
        if state.jobs[job_id].reason != why:
            changed[job_id] = why
    wake = plan.wake_ms
    if extra.wake_ms is not None and (wake is None or extra.wake_ms < wake):
        wake = extra.wake_ms
    merged = Plan(
        placements=[*plan.placements, *extra.placements],
        reasons=reasons,
        changed_reasons=sorted(changed.items()),
        reservations=extra.reservations,
        wake_ms=wake,
        preemptions=[*plan.preemptions, *extra.preemptions],
        drains=[*plan.drains, *extra.drains],
    )
    return _with_plan(more, merged)


def _with_reasons(end: PassEnd, reasons: dict[str, Reason], changed: dict[str, Reason]) -> PassEnd:
    """``end`` with its plan's reasons and changed reasons replaced."""
    fresh = replace(end.plan, reasons=reasons, changed_reasons=sorted(changed.items()))
    return _with_plan(end, fresh)


def _with_plan(end: PassEnd, plan: Plan) -> PassEnd:
    return PassEnd(
        plan=plan,
        claims=end.claims,
        unfit=end.unfit,
        last=end.last,
        queues=end.queues,
        throttled=end.throttled,
        next_retry_ms=end.next_retry_ms,
        backfill_ends_ms=end.backfill_ends_ms,
        quotas=end.quotas,
        searches=end.searches,
        failed=end.failed,
        protected=end.protected,
        unhealthy=end.unhealthy,
        recalled=end.recalled,
    )


__all__ = ["IncrementalPlanner", "stands_until"]
