"""Elastic gangs and queue quotas (core/elastic.py, core/queues/quota.py): a queue is
charged for the members an elastic gang's attempt holds, a pending elastic gang is
admitted at its ``min`` and starts with no more members than the quota admits, and growth
never takes its queue over its quota (plan and apply)."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.model import JobSpec, JobState, MemberPlacement
from synapse_ha.core.queues.quota import MEMBERS_CHARGED_FORMAT, QueueUsage, charges_members
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler.elastic import plan_growth
from tests.core.harness import Cluster, job
from tests.core.test_queues import cluster as queues_cluster


def elastic(spec: JobSpec, fewest: int) -> JobSpec:
    return dataclasses.replace(spec, elastic=ElasticPolicy(fewest))


def lab(a_gpu: int = 16, a_borrowing: int | None = 0, racks: int = 2) -> Cluster:
    """``racks`` racks of 2 nodes of 8 GPUs; queues a and b of cohort lab."""
    return queues_cluster(
        Queue("a", gpu=a_gpu, cohort="lab", borrowing_limit_gpu=a_borrowing),
        Queue("b", gpu=16, cohort="lab"),
        racks=racks,
    )


def start(cl: Cluster, spec: JobSpec) -> str:
    j = cl.submit(spec)
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED, render(cl.state.jobs[j].reason)
    cl.start_all(j)
    return j


def size(cl: Cluster, job_id: str) -> int:
    attempt = cl.state.jobs[job_id].attempt
    assert attempt is not None
    return len(attempt.members)


def charged(cl: Cluster, queue: str) -> int:
    return QueueUsage.of(cl.state).used(queue).gpu


def test_an_elastic_gang_starts_within_its_queues_quota_and_is_charged_its_members() -> None:
    cl = lab()
    j = start(cl, elastic(job(queue="a", gpu=8, replicas=4), 1))
    # Its max (32 GPUs) is over a's 16 with nothing to borrow: it starts with 2 of 4.
    assert size(cl, j) == 2
    assert charged(cl, "a") == 16
    # A fixed gang of the same size waits for the quota.
    fixed = cl.submit(job(queue="a", gpu=8, replicas=4))
    cl.run_pass()
    assert cl.state.jobs[fixed].reason.code is ReasonCode.WAITING_QUOTA


def test_a_pending_elastic_gang_is_admitted_at_its_min_not_its_max() -> None:
    cl = lab()
    start(cl, job(queue="a", gpu=8, replicas=1))
    j = cl.submit(elastic(job(queue="a", gpu=8, replicas=4), 2))
    cl.run_pass()
    # 8 of 16 used: its min of 2 (16 GPUs) does not fit; the reason names its min.
    reason = cl.state.jobs[j].reason
    assert reason.code is ReasonCode.WAITING_QUOTA and reason.num("need") == 16
    k = start(cl, elastic(job(queue="a", gpu=8, replicas=4), 1))
    assert size(cl, k) == 1 and charged(cl, "a") == 16


def test_a_shrink_gives_the_quota_back_once_its_members_are_dropped() -> None:
    cl = lab(a_gpu=32, racks=2)
    j = start(cl, elastic(job(queue="a", gpu=8, replicas=4), 1))
    assert size(cl, j) == 4 and charged(cl, "a") == 32
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    assert cl.do(c.ShrinkMembers(j, attempt.fencing_token, 2, "", cl.now)).ok
    # The members being given back count until they are dropped...
    assert charged(cl, "a") == 32
    assert QueueUsage.of(cl.state, counting_preempted=False).used("a").gpu == 16
    cl.exit_member(j, 2, 143)
    assert charged(cl, "a") == 32
    cl.exit_member(j, 3, 143)
    # ...and not once they are.
    assert size(cl, j) == 2 and charged(cl, "a") == 16


def test_growth_stops_at_the_quota_in_the_plan_and_at_apply() -> None:
    cl = lab()
    j = start(cl, elastic(job(queue="a", gpu=8, replicas=4), 1))
    assert size(cl, j) == 2
    # Two nodes are free, but a's quota admits no more members: no growth is planned.
    assert plan_growth(cl.state, cl.now) is None
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    used = {m.node_id for m in attempt.members}
    free = sorted(n for n in cl.state.nodes if n not in used)
    grown = (MemberPlacement(2, free[0], tuple(range(8)), attempt.membership + 1),)
    before = repr(cl.state.jobs), repr(cl.state.nodes)
    result = cl.do(c.GrowMembers((c.MemberGrowth(j, attempt.fencing_token, grown),), now_ms=cl.now))
    assert result.ok and not result.bound
    assert [r.code for r in result.rejected] == [c.RejectCode.OVER_QUOTA]
    assert (
        "members: queue a uses 16/16 gpu, 0 borrowable; 1 more member(s) need 8"
        in result.rejected[0].message
    )
    assert (repr(cl.state.jobs), repr(cl.state.nodes)) == before


def test_growth_takes_what_the_queue_may_borrow_and_no_more() -> None:
    cl = lab(a_gpu=8, a_borrowing=16, racks=2)
    j = start(cl, elastic(job(queue="a", gpu=8, replicas=4), 1))
    assert size(cl, j) == 3  # 8 nominal + 16 borrowed
    fixed = start(cl, job(queue="b", gpu=8, replicas=1))
    cl.exit_member(fixed, 0, 0)
    assert plan_growth(cl.state, cl.now) is None  # room on a node, none in the quota
    assert charged(cl, "a") == 24


def test_below_format_16_an_elastic_gang_is_charged_its_max_as_format_15_releases_do() -> None:
    # A cluster in the middle of an upgrade from a release of format 15: its floor is 15,
    # and every replica must charge the same. The gang's max (32 GPUs) is over a's 16:
    # admitted and bound only as a whole gang would be, so it waits.
    cl = lab()
    cl.state = dataclasses.replace(cl.state, format_floor=MEMBERS_CHARGED_FORMAT - 1)
    assert not charges_members(cl.state)
    waiting = cl.submit(elastic(job(queue="a", gpu=8, replicas=4), 1))
    cl.run_pass()
    assert cl.state_of(waiting) is JobState.PENDING
    assert cl.state.jobs[waiting].reason.code is ReasonCode.WAITING_QUOTA
    # Apply agrees: two of its members (16 GPUs, within a's quota by members) are
    # charged its max, over the quota.
    members = (
        MemberPlacement(0, "r0h0", tuple(range(8))),
        MemberPlacement(1, "r0h1", tuple(range(8))),
    )
    bind = c.BindPlan((c.GangPlacement(waiting, 0, members),), (), cl.now)
    assert not cl.do(bind).bound
    # A gang of at most 2 members (16 GPUs at its max) starts, and is charged 16.
    start(cl, elastic(job(queue="a", gpu=8, replicas=2), 1))
    assert charged(cl, "a") == 16
