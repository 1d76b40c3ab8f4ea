"""Elastic gangs give back quota to a reclaim (core/scheduler/shrink_victims.py): an
elastic gang of a borrowing queue above its min shrinks instead of being preempted whole,
costing only the members it loses; one preemptor's victims may be some shrinks and some
whole gangs; the preemptor's claim waits for the shrunk members too."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.model import JobSpec, JobState
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler.elastic import plan_growth, plan_shrink
from synapse_ha.core.scheduler.plan import Plan
from tests.core.harness import Cluster, job
from tests.core.test_queues import cluster as queues_cluster

HOUR = 3_600_000


def elastic(spec: JobSpec, fewest: int) -> JobSpec:
    return dataclasses.replace(spec, elastic=ElasticPolicy(fewest))


def lab(a_gpu: int, b_gpu: int) -> Cluster:
    """4 nodes of 8 GPUs (2 racks of 2); queues a and b of cohort lab."""
    return queues_cluster(Queue("a", gpu=a_gpu, cohort="lab"), Queue("b", gpu=b_gpu, cohort="lab"))


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


def token(cl: Cluster, job_id: str) -> int:
    attempt = cl.state.jobs[job_id].attempt
    assert attempt is not None
    return attempt.fencing_token


def propose(cl: Cluster, plan: Plan) -> None:
    """As the leader does: the bind, then the shrinks, then the preemptions."""
    bind = plan.command(cl.now)
    if bind is not None:
        cl.do(bind)
    for command in [*plan.shrink_commands(), *plan.preempt_commands(cl.now)]:
        result = cl.do(command)
        assert result.ok, result.message


def test_a_reclaim_shrinks_an_elastic_borrower_by_only_the_members_it_needs() -> None:
    cl = lab(16, 16)
    # b borrows a's idle 16 GPUs for its elastic gang; its priority is above a's gang,
    # so no shrink for room alone gives the room back: only a reclaim does.
    big = start(cl, elastic(job("big", queue="b", gpu=8, replicas=4, priority=5), 1))
    assert size(cl, big) == 4
    cl.now += HOUR
    mine = cl.submit(job("mine", queue="a", gpu=8, replicas=1))
    plan = cl.plan()
    # Preempting it whole would take b below its nominal; one member given back will do.
    (p,) = plan.preemptions
    assert p.preemptor == mine and p.victims == () and p.kind.value == "reclaim"
    assert p.shrinks == (c.ShrinkMembers(big, token(cl, big), 3, mine, cl.now),)
    assert plan.preempt_commands(cl.now) == []  # nothing is preempted whole
    propose(cl, plan)
    assert plan_shrink(cl.state, cl.now) == [] and plan_growth(cl.state, cl.now) is None
    # The preemptor waits for the member given back and holds its claim.
    cl.run_pass()
    why = cl.state.jobs[mine].reason
    assert why.code is ReasonCode.WAITING_FOR_VICTIMS and why.text("victims") == big
    cl.exit_member(big, 3, 143)
    assert size(cl, big) == 3
    cl.run_pass()
    assert cl.state_of(mine) is JobState.SCHEDULED
    assert cl.state_of(big) is JobState.RUNNING


def test_one_preemptor_shrinks_one_gang_and_preempts_another_whole() -> None:
    cl = lab(24, 8)
    grow = start(cl, elastic(job("grow", queue="b", gpu=8, replicas=2, priority=5), 1))
    fixed = start(cl, job("fixed", queue="b", gpu=8, replicas=2, priority=5))
    cl.now += HOUR
    mine = cl.submit(job("mine", queue="a", gpu=8, replicas=3))
    plan = cl.plan()
    # b borrows 24: both gangs whole (32) would take it below its nominal; the shrink of
    # one (8) and the other whole (16) give back just what it borrows.
    (p,) = plan.preemptions
    assert [v.job_id for v in p.victims] == [fixed]
    assert [(s.job_id, s.size, s.for_job) for s in p.shrinks] == [(grow, 1, mine)]
    propose(cl, plan)
    assert cl.state.jobs[fixed].attempt.preempted_by == mine  # type: ignore[union-attr]
    # Its victims stop one by one; the claim waits for the shrunk member too.
    attempt = cl.state.jobs[fixed].attempt
    assert attempt is not None
    for m in attempt.members:
        cl.exit_member(fixed, m.rank, 143)
    cl.run_pass()
    why = cl.state.jobs[mine].reason
    assert cl.state_of(mine) is JobState.PENDING
    assert why.code is ReasonCode.WAITING_FOR_VICTIMS and why.text("victims") == grow
    cl.exit_member(grow, 1, 143)
    cl.run_pass()
    assert cl.state_of(mine) is JobState.SCHEDULED and size(cl, grow) == 1


def test_a_whole_gang_that_costs_less_is_preempted_rather_than_a_shrink() -> None:
    cl = lab(24, 8)
    grow = start(cl, elastic(job("grow", queue="b", gpu=8, replicas=2, priority=5), 1))
    cl.now += HOUR
    fixed = start(cl, job("fixed", queue="b", gpu=8, replicas=2, priority=5))
    # The fixed gang has run a minute, the elastic one an hour: its member loses more.
    cl.now += 60_000
    mine = cl.submit(job("mine", queue="a", gpu=8, replicas=1))
    (p,) = cl.plan().preemptions
    assert p.preemptor == mine and [v.job_id for v in p.victims] == [fixed]
    assert p.shrinks == () and size(cl, grow) == 2


def test_a_shrink_that_costs_less_is_preferred_to_a_whole_gang() -> None:
    cl = lab(24, 8)
    fixed = start(cl, job("fixed", queue="b", gpu=8, replicas=2, priority=5))
    cl.now += HOUR
    grow = start(cl, elastic(job("grow", queue="b", gpu=8, replicas=2, priority=5), 1))
    cl.now += 60_000
    mine = cl.submit(job("mine", queue="a", gpu=8, replicas=1))
    (p,) = cl.plan().preemptions
    assert p.preemptor == mine and p.victims == ()
    assert [(s.job_id, s.size) for s in p.shrinks] == [(grow, 1)] and size(cl, fixed) == 2


def test_an_elastic_gang_is_preempted_whole_when_its_shrink_needs_a_costlier_victim_too() -> None:
    cl = lab(16, 16)
    old = [start(cl, job(f"old{i}", queue="b", gpu=8, replicas=1, priority=5)) for i in (1, 2)]
    cl.now += HOUR
    grow = start(cl, elastic(job("grow", queue="b", gpu=8, replicas=2, priority=5), 1))
    cl.now += 60_000
    mine = cl.submit(job("mine", queue="a", gpu=8, replicas=2))
    # Its shrink (one member, a minute's work) and an old gang (an hour's) cost more than
    # the young elastic gang whole (two members, a minute's work).
    (p,) = cl.plan().preemptions
    assert p.preemptor == mine and [v.job_id for v in p.victims] == [grow]
    assert p.shrinks == () and all(size(cl, j) == 1 for j in old)


def test_an_elastic_victim_taken_whole_gives_back_only_the_members_it_holds() -> None:
    cl = lab(16, 16)
    old = start(cl, job("old", queue="b", gpu=8, replicas=2, priority=5))
    cl.now += HOUR
    grow = start(cl, elastic(job("grow", queue="b", gpu=8, replicas=4, priority=5), 1))
    assert size(cl, grow) == 2  # b borrows 16: its two members, not its max of 4
    cl.now += 60_000
    mine = cl.submit(job("mine", queue="a", gpu=8, replicas=2))
    # The young elastic gang whole takes b back to its nominal and no further.
    (p,) = cl.plan().preemptions
    assert p.preemptor == mine and [v.job_id for v in p.victims] == [grow]
    assert p.shrinks == () and size(cl, old) == 2
