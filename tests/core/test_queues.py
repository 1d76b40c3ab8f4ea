"""Queues in the scheduling pass: quota admission, fair share, and preemption (DESIGN §8)."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import (
    ClusterConfig,
    PreemptionKind,
    PreemptionMode,
    Queue,
    QueueHistory,
)
from synapse_ha.core.model import ClusterState, JobState, NodeStatus, Resources
from synapse_ha.core.queues.fairshare import add_usage, decay, share
from synapse_ha.core.queues.quota import QuotaShortfall
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler.pass_preemptions import CLAIM_WINDOW_MS
from tests.core.harness import Cluster, job, node


def cluster(
    *queues: Queue,
    mode: PreemptionMode = PreemptionMode.TOPOLOGY,
    racks: int = 2,
    per_rack: int = 2,
) -> Cluster:
    cl = Cluster(state=ClusterState(config=ClusterConfig(preemption=mode, locality_wait_ms=0)))
    for r in range(racks):
        for h in range(per_rack):
            cl.add(node(f"r{r}h{h}", gpus=8, rack=f"r{r}"))
    for q in queues:
        assert cl.do(c.SetQueue(q, cl.now)).ok
    return cl


def run(cl: Cluster, spec_queue: str, gpu: int, replicas: int = 1, cls: str = "") -> str:
    j = cl.submit(job(queue=spec_queue, gpu=gpu, replicas=replicas, priority_class=cls))
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED, render(cl.state.jobs[j].reason)
    cl.start_all(j)
    return j


def apply_preemptions(cl: Cluster) -> list[c.Result]:
    plan = cl.plan()
    bind = plan.command(cl.now)
    if bind is not None:
        cl.do(bind)
    return [cl.do(p) for p in plan.preempt_commands(cl.now)]


def stop_all(cl: Cluster, j: str) -> None:
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    for m in attempt.members:
        cl.exit_member(j, m.rank, 143)


# ------------------------------------------------------------------------ quotas


def test_a_gang_beyond_its_quota_waits_with_a_reason_naming_the_limit() -> None:
    cl = cluster(
        Queue("team-a", gpu=16, cohort="lab", borrowing_limit_gpu=0),
        Queue("team-b", gpu=16, cohort="lab"),
    )
    run(cl, "team-a", 8, 2)
    j = cl.submit(job(queue="team-a", gpu=8))
    cl.run_pass()
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert record.reason.code is ReasonCode.WAITING_QUOTA
    assert render(record.reason) == (
        "queue team-a uses 16/16 GPUs, borrowing limit 0, 0 idle GPU(s) of its cohort to "
        "borrow; this gang needs 8"
    )


def test_a_quota_shortfall_reason_names_its_resource_unless_gpus() -> None:
    cpu = QuotaShortfall("q", "cpu_milli", 4000, 4000, None, 0, 1000).reason()
    assert cpu.code is ReasonCode.WAITING_QUOTA
    assert cpu.params == (
        ("borrowable", 0),
        ("need", 1000),
        ("nominal", 4000),
        ("queue", "q"),
        ("resource", "cpu_milli"),
        ("used", 4000),
    )
    gpu = QuotaShortfall("q", "gpu", 8, 8, 2, 1, 4).reason()
    assert dict(gpu.params) == {
        "borrowable": 1,
        "borrowing_limit": 2,
        "need": 4,
        "nominal": 8,
        "queue": "q",
        "used": 8,
    }


def test_a_queue_borrows_idle_cohort_quota_up_to_its_borrowing_limit() -> None:
    cl = cluster(
        Queue("team-a", gpu=8, cohort="lab", borrowing_limit_gpu=8),
        Queue("team-b", gpu=24, cohort="lab", lending_limit_gpu=16),
    )
    run(cl, "team-a", 8, 2)  # 8 nominal + 8 borrowed
    j = cl.submit(job(queue="team-a", gpu=8))
    cl.run_pass()
    assert cl.state.jobs[j].reason.code is ReasonCode.WAITING_QUOTA
    assert "borrowing limit 8" in render(cl.state.jobs[j].reason)
    # team-b still has its own nominal.
    run(cl, "team-b", 8, 2)


def test_a_gang_blocked_by_its_quota_takes_no_reservation() -> None:
    cl = cluster(Queue("small", gpu=8), racks=1, per_rack=2)
    run(cl, "default", 8)
    big = cl.submit(job(queue="small", gpu=8, replicas=2))  # beyond its quota
    other = cl.submit(job(gpu=8))
    plan = cl.run_pass()
    assert cl.state.jobs[big].reason.code is ReasonCode.WAITING_QUOTA
    assert plan.reservation is None or plan.reservation.job_id != big
    assert cl.state_of(other) is JobState.SCHEDULED


def test_a_lender_takes_its_nominal_back_and_gangs_without_gpus_still_start() -> None:
    """In one pass: qa borrows qb's idle quota, then qb's gang takes qb's nominal (always
    its own), which leaves qa over what it may borrow (a reclaim can take it back). A
    gang of qa that needs no GPU takes none of the quota, and starts."""
    cl = cluster(Queue("qa", gpu=4, cohort="c1"), Queue("qb", gpu=8, cohort="c1"), racks=1)
    borrower = cl.submit(job(queue="qa", gpu=4, replicas=2, priority_class="high"))
    no_gpu = cl.submit(job(queue="qa", gpu=0, cpu=0.5))
    lender = cl.submit(job(queue="qb", gpu=4, replicas=2, priority_class="high"))
    cl.run_pass()
    assert [cl.state_of(j) for j in (borrower, no_gpu, lender)] == [JobState.SCHEDULED] * 3
    more = cl.submit(job(queue="qa", gpu=1))
    cl.run_pass()
    assert cl.state.jobs[more].reason.code is ReasonCode.WAITING_QUOTA


# --------------------------------------------------------------------- fair share


def test_decay_halves_per_half_life_with_integers_only() -> None:
    assert decay(1 << 20, 1000, 1000) == 1 << 19
    assert decay(1 << 20, 3000, 1000) == 1 << 17
    half = decay(1 << 20, 500, 1000)
    assert abs(half - int((1 << 20) * 2**-0.5)) <= 2
    assert decay(12345, 0, 1000) == 12345
    assert decay(12345, 70 * 1000, 1000) == 0
    h = add_usage(None, Resources(gpu=4), 1000, 5000, 1000)
    assert (h.gpu_ms, h.at_ms) == (4000, 5000)
    assert add_usage(h, Resources(gpu=4), 0, 6000, 1000).gpu_ms == 2000


def test_share_is_dominant_usage_against_entitlement() -> None:
    q = Queue("a", gpu=8, cpu_milli=8000)
    idle = share(q, None, Resources(), 0, 1000)
    assert idle == 0
    gpu_heavy = share(q, None, Resources(cpu_milli=1000, gpu=8), 0, 1000)
    cpu_heavy = share(q, None, Resources(cpu_milli=8000, gpu=1), 0, 1000)
    assert gpu_heavy == cpu_heavy == 1_000_000
    past = share(q, QueueHistory(gpu_ms=8 * 1000, at_ms=0), Resources(), 0, 1000)
    assert past == 1_000_000
    assert share(Queue("free"), None, Resources(gpu=64), 0, 1000) == 0


def test_queues_of_a_cohort_interleave_by_fair_share() -> None:
    cl = cluster(Queue("a", gpu=16, cohort="lab"), Queue("b", gpu=16, cohort="lab"))
    a_jobs = [cl.submit(job(queue="a", gpu=8)) for _ in range(4)]
    b_jobs = [cl.submit(job(queue="b", gpu=8)) for _ in range(4)]
    cl.run_pass()
    placed = [j for j in a_jobs + b_jobs if cl.state_of(j) is JobState.SCHEDULED]
    # Four 8-GPU slots: two for each queue although a's jobs were submitted first.
    assert sorted(placed) == sorted(a_jobs[:2] + b_jobs[:2])


def test_past_usage_puts_a_queue_behind() -> None:
    cl = cluster(
        Queue("a", gpu=16, cohort="lab"), Queue("b", gpu=16, cohort="lab"), racks=1, per_rack=1
    )
    first = run(cl, "a", 8)
    cl.now += 60_000
    cl.exit_member(first, 0, 0)  # a used 8 GPUs for a minute
    a = cl.submit(job(queue="a", gpu=8))
    b = cl.submit(job(queue="b", gpu=8))
    cl.run_pass()
    assert cl.state.queue_history["a"].gpu_ms == 8 * 60_000
    assert cl.state_of(b) is JobState.SCHEDULED
    assert cl.state_of(a) is JobState.PENDING


# --------------------------------------------------------------------- preemption


def test_priority_preemption_evicts_whole_lower_gangs_and_the_preemptor_gets_their_gpus() -> None:
    cl = cluster(Queue("q", gpu=32), racks=1, per_rack=4)
    low = [run(cl, "q", 8, 2, cls="low") for _ in range(2)]
    high = cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    results = apply_preemptions(cl)
    assert len(results) == 1 and results[0].ok, results
    preempted = [j for j in low if cl.state.jobs[j].attempt.preempted_by == high]  # type: ignore[union-attr]
    assert len(preempted) == 1  # one whole gang is enough
    victim = preempted[0]
    assert cl.state.jobs[high].reason.code is ReasonCode.WAITING_FOR_VICTIMS
    # Not proposed twice while the victim stops.
    assert cl.plan().preemptions == []
    stop_all(cl, victim)
    cl.run_pass()
    assert cl.state_of(high) is JobState.SCHEDULED
    assert set(cl.nodes_of(high)) == {m.node_id for m in cl.state.jobs[victim].attempt.members}  # type: ignore[union-attr]
    assert cl.state_of(victim) is JobState.PENDING


def test_a_class_that_does_not_preempt_never_preempts() -> None:
    cl = cluster(Queue("q", gpu=32), racks=1, per_rack=2)
    run(cl, "q", 8, 2, cls="low")
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="normal"))
    assert cl.plan().preemptions == []


def test_priority_preemption_stays_within_the_queue() -> None:
    cl = cluster(Queue("q", gpu=32), Queue("r", gpu=32), racks=1, per_rack=2)
    run(cl, "r", 8, 2, cls="low")
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    assert cl.plan().preemptions == []


def test_preemption_off_never_preempts() -> None:
    cl = cluster(Queue("q", gpu=32), racks=1, per_rack=2, mode=PreemptionMode.OFF)
    run(cl, "q", 8, 2, cls="low")
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    assert cl.plan().preemptions == []


def test_reclaim_takes_only_from_borrowers_and_never_below_nominal() -> None:
    cl = cluster(
        Queue("a", gpu=16, cohort="lab"), Queue("b", gpu=16, cohort="lab"), racks=1, per_rack=4
    )
    b_jobs = [run(cl, "b", 8) for _ in range(4)]  # b borrows a's 16
    a1 = cl.submit(job(queue="a", gpu=8))
    a2 = cl.submit(job(queue="a", gpu=8))
    a3 = cl.submit(job(queue="a", gpu=8))  # would take a beyond its nominal: no reclaim
    results = apply_preemptions(cl)
    assert [r.ok for r in results] == [True, True]
    preempted = [j for j in b_jobs if cl.state.jobs[j].attempt.preempted_by]  # type: ignore[union-attr]
    assert len(preempted) == 2  # b keeps its nominal 16
    for j in preempted:
        assert cl.state.jobs[j].attempt.preemption is PreemptionKind.RECLAIM  # type: ignore[union-attr]
    assert cl.state.jobs[a3].reason.code is not ReasonCode.WAITING_FOR_VICTIMS
    for j in preempted:
        stop_all(cl, j)
    cl.run_pass()
    assert cl.state_of(a1) is JobState.SCHEDULED and cl.state_of(a2) is JobState.SCHEDULED
    # The reclaimed gangs cannot reclaim back: b is at its nominal.
    assert cl.plan().preemptions == []


def test_topology_preemption_clears_a_whole_rack_at_least_cost() -> None:
    cl = cluster(Queue("q", gpu=64), racks=2, per_rack=2)
    # Rack r0: one old 16-GPU gang. Rack r1: two young 8-GPU gangs.
    old = run(cl, "q", 8, 2, cls="low")
    assert cl.racks_of(old) == {"r0"}
    cl.now += 3_600_000
    young = [run(cl, "q", 8, cls="low") for _ in range(2)]
    assert all(cl.racks_of(j) == {"r1"} for j in young)
    cl.now += 60_000
    high = cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high", required="rack"))
    plan = cl.plan()
    assert len(plan.preemptions) == 1
    assert sorted(v.job_id for v in plan.preemptions[0].victims) == sorted(young)
    for p in plan.preempt_commands(cl.now):
        assert cl.do(p).ok
    for j in young:
        stop_all(cl, j)
    cl.run_pass()
    assert cl.racks_of(high) == {"r1"}


def test_blind_preemption_takes_lowest_priority_newest_first_wherever_they_are() -> None:
    cl = cluster(Queue("q", gpu=64), racks=2, per_rack=2, mode=PreemptionMode.BLIND)
    old = run(cl, "q", 8, 2, cls="low")
    cl.now += 3_600_000
    young = [run(cl, "q", 8, cls="low")]
    cl.now += 1_000
    young.append(run(cl, "q", 8, cls="low"))
    cl.now += 60_000
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high", required="rack"))
    plan = cl.plan()
    assert len(plan.preemptions) == 1
    chosen = [v.job_id for v in plan.preemptions[0].victims]
    assert chosen == [young[1], young[0]]  # newest first, until 16 GPUs are free
    assert old not in chosen


def test_no_cascade_a_victim_is_chosen_once_per_pass() -> None:
    cl = cluster(Queue("q", gpu=64), racks=1, per_rack=2)
    run(cl, "q", 8, 2, cls="low")
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    plan = cl.plan()
    assert len(plan.preemptions) == 1


def test_a_victim_leaves_what_it_freed_to_its_preemptor_for_a_while() -> None:
    """No churn: a requeued victim is not bound again while its preemptor, unable to be
    placed for now (here its rack was cordoned), still has first claim; afterwards it is."""
    cl = cluster(Queue("q", gpu=32), racks=2, per_rack=1)
    low = run(cl, "q", 8, cls="low")
    other = run(cl, "q", 8, cls="low")
    high = cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    assert [r.ok for r in apply_preemptions(cl)] == [True]
    stop_all(cl, low)
    stop_all(cl, other)
    assert cl.do(c.SetNodeStatus("r0h0", NodeStatus.CORDONED, now_ms=cl.now)).ok
    cl.run_pass()
    assert cl.state_of(high) is JobState.PENDING
    for victim in (low, other):
        assert cl.state_of(victim) is JobState.PENDING
        why = cl.state.jobs[victim].reason
        assert why.code is ReasonCode.WAITING_FOR_PREEMPTOR, render(why)
        assert high in render(why)
    cl.now += CLAIM_WINDOW_MS
    cl.run_pass()
    assert sorted(cl.state_of(j) for j in (low, other)).count(JobState.SCHEDULED) == 1
