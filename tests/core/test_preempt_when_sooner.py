"""A gang that waits for room preempts only when that makes it start sooner
(core/scheduler/pass_preemptions.py): when gangs estimated to end free its room no later
than its victims would stop (their grace), it preempts nobody and says so; apply still
verifies every preemption the scheduler does plan."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import DEFAULT_GRACE_MS, Queue
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.model import JobState, unconfirmed_members
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler import IncrementalPlanner, schedule
from synapse_ha.core.scheduler.pass_preemptions import STARTS_FORMAT
from tests.core.harness import Cluster, job
from tests.core.test_queues import apply_preemptions, cluster, stop_all

SECOND = 1_000


def running(cl: Cluster, gpu: int = 8, limit_s: int = 0, cls: str = "low") -> str:
    """A gang of one ``gpu``-GPU member in queue q, bound and started now."""
    j = cl.submit(job(queue="q", gpu=gpu, time_limit_s=limit_s, priority_class=cls))
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED, render(cl.state.jobs[j].reason)
    cl.start_all(j)
    return j


def full_rack(limit_s: int) -> tuple[Cluster, str, str]:
    """One rack of two 8-GPU hosts, each held by a low gang: ``ending`` with a time limit
    of ``limit_s``, ``open_ended`` without one."""
    cl = cluster(Queue("q", gpu=64), racks=1, per_rack=2)
    ending = running(cl, limit_s=limit_s)
    open_ended = running(cl)
    return cl, ending, open_ended


def test_a_gang_whose_room_frees_within_the_grace_preempts_nobody() -> None:
    cl, ending, _ = full_rack(limit_s=600)
    ends_at = cl.state.jobs[ending].attempt.bound_at_ms + 600 * SECOND  # type: ignore[union-attr]
    cl.now = ends_at - DEFAULT_GRACE_MS + SECOND  # it ends 29 s from now
    high = cl.submit(job(queue="q", gpu=8, priority_class="high"))
    plan = cl.plan()
    assert plan.preemptions == []
    why = plan.reasons[high]
    assert why.code is ReasonCode.STARTS_WITHOUT_PREEMPTING, render(why)
    assert (why.num("start_ms"), why.text("jobs"), why.num("count")) == (ends_at, ending, 1)
    assert (why.num("grace_ms"), why.num("until_ms"), plan.wake_ms) == (
        DEFAULT_GRACE_MS,
        ends_at + 1,
        ends_at + 1,
    )
    assert render(why).startswith("no room yet; it starts by ~1970-01-01T00:10:")
    assert f"when {ending} end(s) (their time limits or estimates)" in render(why)
    assert "a grace of 30s), so it preempts nobody" in render(why)
    # The leader ends the gang at its limit: the gang is placed on what it freed.
    cl.now = ends_at
    attempt = cl.state.jobs[ending].attempt
    assert attempt is not None
    assert cl.do(c.ExpireTimeLimit(ending, attempt.fencing_token, cl.now)).ok
    for rank in unconfirmed_members(cl.state.jobs[ending]):
        cl.exit_member(ending, rank, 143)
    cl.run_pass()
    assert cl.state_of(high) is JobState.SCHEDULED, render(cl.state.jobs[high].reason)
    assert cl.nodes_of(high) == [m.node_id for m in attempt.members]


def test_a_gang_whose_room_frees_only_after_the_grace_preempts() -> None:
    cl, ending, _ = full_rack(limit_s=600)
    ends_at = cl.state.jobs[ending].attempt.bound_at_ms + 600 * SECOND  # type: ignore[union-attr]
    cl.now = ends_at - DEFAULT_GRACE_MS - SECOND  # it ends 31 s from now
    high = cl.submit(job(queue="q", gpu=8, priority_class="high"))
    plan = cl.plan()
    assert len(plan.preemptions) == 1
    assert plan.reasons[high].code is ReasonCode.WAITING_FOR_VICTIMS


def test_once_the_start_has_passed_and_the_gang_still_runs_it_preempts() -> None:
    cl, ending, _ = full_rack(limit_s=600)
    ends_at = cl.state.jobs[ending].attempt.bound_at_ms + 600 * SECOND  # type: ignore[union-attr]
    cl.now = ends_at - 10 * SECOND
    high = cl.submit(job(queue="q", gpu=8, priority_class="high"))
    assert cl.plan().preemptions == []
    cl.now = ends_at + 1  # past its limit, not yet stopped: not counted on
    results = apply_preemptions(cl)
    assert len(results) == 1 and results[0].ok, results
    assert cl.state.jobs[high].reason.code is ReasonCode.WAITING_FOR_VICTIMS


def test_one_ending_gang_is_counted_on_by_one_waiting_gang_only() -> None:
    cl = cluster(Queue("q", gpu=64), racks=1, per_rack=3)
    ending = running(cl, limit_s=600)
    others = [running(cl), running(cl)]
    cl.now = cl.state.jobs[ending].attempt.bound_at_ms + 590 * SECOND  # type: ignore[union-attr]
    first = cl.submit(job(queue="q", gpu=8, priority_class="high"))
    second = cl.submit(job(queue="q", gpu=8, priority_class="high"))
    plan = cl.plan()
    assert plan.reasons[first].code is ReasonCode.STARTS_WITHOUT_PREEMPTING
    assert [p.preemptor for p in plan.preemptions] == [second]
    assert {v.job_id for v in plan.preemptions[0].victims} <= set(others)


def test_a_gang_short_of_its_quota_is_not_held_back_by_estimated_ends() -> None:
    # Its queue's quota, not room, keeps it waiting: the room another queue's gang frees
    # soon would not admit it, a priority preemption within its queue does.
    cl = cluster(Queue("q", gpu=16), Queue("r", gpu=8), racks=1, per_rack=3)
    lows = {running(cl), running(cl)}
    other = cl.submit(job(queue="r", gpu=8, time_limit_s=600))
    cl.run_pass()
    cl.start_all(other)
    cl.now = cl.state.jobs[other].attempt.bound_at_ms + 590 * SECOND  # type: ignore[union-attr]
    high = cl.submit(job(queue="q", gpu=8, priority_class="high"))
    plan = cl.plan()
    assert [p.preemptor for p in plan.preemptions] == [high], render(plan.reasons[high])
    assert {v.job_id for v in plan.preemptions[0].victims} < lows


def test_below_the_format_that_reads_its_reason_a_gang_preempts_as_before() -> None:
    assert STARTS_FORMAT == format_needed(ReasonCode.STARTS_WITHOUT_PREEMPTING) == 16
    cl, ending, _ = full_rack(limit_s=600)
    cl.now = cl.state.jobs[ending].attempt.bound_at_ms + 590 * SECOND  # type: ignore[union-attr]
    cl.submit(job(queue="q", gpu=8, priority_class="high"))
    older = dataclasses.replace(cl.state, format_floor=STARTS_FORMAT - 1)
    assert len(schedule(older, cl.now).preemptions) == 1
    assert schedule(cl.state, cl.now).preemptions == []


def test_the_incremental_planner_makes_the_same_plan() -> None:
    cl, ending, _ = full_rack(limit_s=600)
    ends_at = cl.state.jobs[ending].attempt.bound_at_ms + 600 * SECOND  # type: ignore[union-attr]
    cl.now = ends_at - 20 * SECOND
    cl.submit(job(queue="q", gpu=8, priority_class="high"))
    planner = IncrementalPlanner()
    for now in (cl.now, cl.now + 5 * SECOND, ends_at, ends_at + 1, ends_at + 2):
        assert planner.plan(cl.state, now) == schedule(cl.state, now), now


def test_apply_still_verifies_a_preemption_planned_after_the_start_passed() -> None:
    # The plan's preemption is refused whole once its victim is no longer live.
    cl, ending, open_ended = full_rack(limit_s=600)
    ends_at = cl.state.jobs[ending].attempt.bound_at_ms + 600 * SECOND  # type: ignore[union-attr]
    cl.now = ends_at + 1
    cl.submit(job(queue="q", gpu=8, priority_class="high"))
    [planned] = cl.plan().preempt_commands(cl.now)
    [gone] = [v.job_id for v in planned.victims]
    stop_all(cl, gone)
    result = cl.do(planned)
    assert result.code is c.ResultCode.CONFLICT, result.message
    assert {open_ended, ending} >= {gone}
