"""Fair-sharing preemption: a queue below its fair share takes what a borrowing queue
above it holds, where the cohort they meet in allows it (DESIGN §8,
synapse_ha/core/queues/fair_preemption.py)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import (
    ClusterConfig,
    Cohort,
    PreemptionKind,
    PreemptionMode,
    Queue,
    QueueHistory,
)
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.model import ClusterState, JobState, Resources
from synapse_ha.core.queues.fairshare import share
from synapse_ha.core.queues.quota import gang_request
from synapse_ha.core.reasons import ReasonCode, render
from tests.core.harness import Cluster, job, node
from tests.core.test_queues import run


def lab(
    *queues: Queue,
    cohorts: tuple[Cohort, ...] = (Cohort("lab", gpu=16, fair_sharing_preemption=True),),
    hosts: int = 4,
    mode: PreemptionMode = PreemptionMode.TOPOLOGY,
) -> Cluster:
    """``hosts`` 8-GPU hosts, two to a rack, with ``cohorts`` and ``queues`` set."""
    config = ClusterConfig(preemption=mode, locality_wait_ms=0)
    cl = Cluster(state=ClusterState(config=config))
    for h in range(hosts):
        cl.add(node(f"h{h}", gpus=8, rack=f"r{h // 2}"))
    for record in cohorts:
        assert cl.do(c.SetCohort(record, cl.now)).ok
    for q in queues:
        assert cl.do(c.SetQueue(q, cl.now)).ok
    return cl


A = Queue("a", gpu=8, cohort="lab")
B = Queue("b", gpu=8, cohort="lab")


def b_borrows_16() -> tuple[Cluster, list[str]]:
    """32 GPUs: a holds its nominal 8, b 24 (8 nominal, 16 borrowed of the cohort's)."""
    cl = lab(A, B)
    run(cl, "a", 8)
    theirs = [run(cl, "b", 8) for _ in range(3)]
    cl.now += 60_000
    return cl, theirs


def test_a_queue_below_its_share_preempts_a_borrower_that_stays_at_or_above_it() -> None:
    cl, theirs = b_borrows_16()
    mine = cl.submit(job(queue="a", gpu=8))
    plan = cl.run_pass()
    # a would hold 16 (share 2.0); b keeps 16 (2.0): at or above, so allowed.
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.FAIR_SHARE]
    (victim,) = plan.preemptions[0].victims
    assert victim.job_id in theirs
    assert cl.state.jobs[mine].reason.code is ReasonCode.WAITING_FOR_VICTIMS
    assert all(cl.do(p).ok for p in plan.preempt_commands(cl.now))  # apply agrees
    attempt = cl.state.jobs[victim.job_id].attempt
    assert attempt is not None and attempt.preemption is PreemptionKind.FAIR_SHARE
    assert "fair share: a queue below its fair share" in render(cl.state.jobs[victim.job_id].reason)


def test_the_anti_thrash_rule_keeps_the_victim_at_or_above_the_preemptors_share() -> None:
    # 24 GPUs: a holds 8 (share 1.0), b 16 (2.0). a's gang of 8 would take a to 2.0 and
    # b to 1.0: a is below b now, but b would end below a, so nothing is preempted.
    cl = lab(A, B, cohorts=(Cohort("lab", gpu=8, fair_sharing_preemption=True),), hosts=3)
    run(cl, "a", 8)
    run(cl, "b", 8)
    run(cl, "b", 8)
    mine = cl.submit(job(queue="a", gpu=8))
    plan = cl.run_pass()
    assert plan.preemptions == []
    assert cl.state_of(mine) is JobState.PENDING


def test_the_switch_is_off_by_default() -> None:
    cl = lab(A, B, cohorts=(Cohort("lab", gpu=16),))
    run(cl, "a", 8)
    for _ in range(3):
        run(cl, "b", 8)
    mine = cl.submit(job(queue="a", gpu=8))
    assert cl.run_pass().preemptions == []
    assert cl.state_of(mine) is JobState.PENDING


def test_a_victims_queue_keeps_its_nominal() -> None:
    # 24 GPUs: a holds its 8, b 16 of its 12 (borrows 4) with a long past: its share
    # stays far above a's after losing 8, but it would fall to 8 of its 12.
    cl = lab(
        A,
        Queue("b", gpu=12, cohort="lab"),
        cohorts=(Cohort("lab", gpu=12, fair_sharing_preemption=True),),
        hosts=3,
    )
    run(cl, "a", 8)
    run(cl, "b", 8)
    run(cl, "b", 8)
    cl.now += 60_000
    half_life = cl.state.config.fair_share_half_life_ms
    cl.state.queue_history = {"b": QueueHistory(gpu_ms=64 * half_life, at_ms=cl.now)}
    mine = cl.submit(job(queue="a", gpu=8))
    assert cl.run_pass().preemptions == []
    assert cl.state_of(mine) is JobState.PENDING


def test_the_minimum_run_time_is_respected() -> None:
    cl = lab(A, replace(B, min_runtime_ms=3_600_000))
    run(cl, "a", 8)
    for _ in range(3):
        run(cl, "b", 8)
    cl.now += 60_000
    mine = cl.submit(job(queue="a", gpu=8))
    assert cl.run_pass().preemptions == []
    assert cl.state.jobs[mine].reason.code is ReasonCode.WAITING_MIN_RUNTIME
    cl.now += 3_600_000
    plan = cl.run_pass()
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.FAIR_SHARE]


def test_no_gang_is_preempted_for_a_preemptor_its_quota_would_still_refuse() -> None:
    cl = lab(replace(A, borrowing_limit_gpu=4), B)
    run(cl, "a", 8)
    for _ in range(3):
        run(cl, "b", 8)
    cl.now += 60_000
    mine = cl.submit(job(queue="a", gpu=8))
    assert cl.run_pass().preemptions == []
    assert cl.state.jobs[mine].reason.code is ReasonCode.WAITING_QUOTA


def _teams(org_gpu: int, *b_queues: Queue) -> Cluster:
    cohorts = (
        Cohort("org", gpu=org_gpu, fair_sharing_preemption=True),
        Cohort("team-a", "org"),
        Cohort("team-b", "org"),
    )
    return lab(Queue("a1", gpu=8, cohort="team-a"), *b_queues, cohorts=cohorts)


def test_hierarchical_shares_are_compared_where_the_queues_meet() -> None:
    # org -> team-a (a1: 8), team-b (b1: 8, b2: 8 idle). a1 holds 8, b1 24. After a1's
    # gang of 8, a1 and b1 would both stand at 2.0 (queue shares allow it), but team a
    # would stand at 16/8 = 2.0 and team b at 16/16 = 1.0: the teams decide, no preemption.
    cl = _teams(8, Queue("b1", gpu=8, cohort="team-b"), Queue("b2", gpu=8, cohort="team-b"))
    run(cl, "a1", 8)
    for _ in range(3):
        run(cl, "b1", 8)
    cl.now += 60_000
    mine = cl.submit(job(queue="a1", gpu=8))
    assert cl.run_pass().preemptions == []
    assert cl.state_of(mine) is JobState.PENDING


def test_a_team_above_the_preemptors_team_loses_a_gang() -> None:
    # Without b2, team b is b1 alone (8): 24/8 = 3.0, 16/8 = 2.0 after, at a's 2.0.
    cl = _teams(16, Queue("b1", gpu=8, cohort="team-b"))
    run(cl, "a1", 8)
    theirs = [run(cl, "b1", 8) for _ in range(3)]
    cl.now += 60_000
    cl.submit(job(queue="a1", gpu=8))
    plan = cl.run_pass()
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.FAIR_SHARE]
    assert plan.preemptions[0].victims[0].job_id in theirs


def test_apply_verifies_the_rule_from_the_state() -> None:
    cl = lab(A, B, cohorts=(Cohort("lab", gpu=8, fair_sharing_preemption=True),), hosts=3)
    run(cl, "a", 8)
    theirs = [run(cl, "b", 8) for _ in range(2)]
    mine = cl.submit(job(queue="a", gpu=8))
    token = cl.state.jobs[theirs[0]].attempt.fencing_token  # type: ignore[union-attr]
    victims = (c.Victim(theirs[0], token),)
    result = cl.do(c.Preempt(mine, 0, victims, PreemptionKind.FAIR_SHARE, cl.now))
    assert result.code is c.ResultCode.CONFLICT
    assert "queue b would end at share 1.000, below queue a at 2.000" in result.message
    assert cl.state.jobs[theirs[0]].attempt.preempted_by == ""  # type: ignore[union-attr]


def test_apply_refuses_a_fair_share_preemption_where_the_switch_is_off() -> None:
    cl = lab(A, B, cohorts=(Cohort("lab", gpu=16),))
    run(cl, "a", 8)
    theirs = [run(cl, "b", 8) for _ in range(3)]
    mine = cl.submit(job(queue="a", gpu=8))
    token = cl.state.jobs[theirs[0]].attempt.fencing_token  # type: ignore[union-attr]
    victims = (c.Victim(theirs[0], token),)
    result = cl.do(c.Preempt(mine, 0, victims, PreemptionKind.FAIR_SHARE, cl.now))
    assert result.code is c.ResultCode.CONFLICT
    assert "no cohort with fair_sharing_preemption on" in result.message


def test_apply_refuses_victims_the_preemptors_quota_would_not_let_it_use() -> None:
    cl = lab(replace(A, borrowing_limit_gpu=4), B)
    run(cl, "a", 8)
    theirs = [run(cl, "b", 8) for _ in range(3)]
    mine = cl.submit(job(queue="a", gpu=8))
    token = cl.state.jobs[theirs[0]].attempt.fencing_token  # type: ignore[union-attr]
    victims = (c.Victim(theirs[0], token),)
    result = cl.do(c.Preempt(mine, 0, victims, PreemptionKind.FAIR_SHARE, cl.now))
    assert result.code is c.ResultCode.CONFLICT
    assert "queue a would still not fit the gang's 8 gpu" in result.message


def test_the_switch_and_the_kind_need_format_16() -> None:
    assert format_needed(c.SetCohort(Cohort("lab", fair_sharing_preemption=True))) == 16
    assert format_needed(c.SetCohort(Cohort("lab"))) == 7
    assert format_needed(c.Preempt("j", 0, (c.Victim("v", 1),), PreemptionKind.FAIR_SHARE)) == 16


# --------------------------------------------------------------------- property


@st.composite
def _tenancy(draw: st.DrawFn) -> tuple[list[int], list[list[int]], list[int], int, int]:
    """Three queues of one flat cohort: nominals, the gangs (GPUs) each runs, each one's
    past GPU-ms in half-lives, the preemptor's queue and its gang's GPUs."""
    nominals = [draw(st.sampled_from([4, 8, 16])) for _ in range(3)]
    gangs = [draw(st.lists(st.sampled_from([2, 4, 8]), max_size=4)) for _ in range(3)]
    past = [draw(st.integers(0, 32)) for _ in range(3)]
    return nominals, gangs, past, draw(st.integers(0, 2)), draw(st.sampled_from([2, 4, 8]))


@settings(max_examples=100, deadline=None)
@given(_tenancy())
def test_the_fair_rule_never_takes_a_queue_below_the_preemptors_share(
    drawn: tuple[list[int], list[list[int]], list[int], int, int],
) -> None:
    nominals, gangs, past, who, size = drawn
    names = ["q0", "q1", "q2"]
    queues = [Queue(n, gpu=g, cohort="lab") for n, g in zip(names, nominals, strict=True)]
    cl = lab(*queues, cohorts=(Cohort("lab", gpu=32, fair_sharing_preemption=True),), hosts=6)
    for name, sizes in zip(names, gangs, strict=True):
        for gpus in sizes:
            j = cl.submit(job(queue=name, gpu=gpus))
            cl.run_pass()
            if cl.state_of(j) is JobState.SCHEDULED:
                cl.start_all(j)
            else:  # only the one gang below preempts
                assert cl.do(c.CancelJob(j, now_ms=cl.now)).ok
    half_life = cl.state.config.fair_share_half_life_ms
    cl.state.queue_history = {
        n: QueueHistory(gpu_ms=p * half_life, at_ms=cl.now)
        for n, p in zip(names, past, strict=True)
    }
    cl.now += 60_000
    mine = cl.submit(job(queue=names[who], gpu=size))
    plan = cl.run_pass()
    held = {n: Resources() for n in names}
    for record in cl.state.jobs.values():
        if record.live_attempt() is not None and record.job_id not in _victims(plan):
            held[record.spec.queue] += gang_request(record.spec)
    held[names[who]] += gang_request(cl.state.jobs[mine].spec)
    for p in plan.preemptions:
        assert p.preemptor == mine
        if p.kind is not PreemptionKind.FAIR_SHARE:
            continue
        assert all(cl.do(command).ok for command in plan.preempt_commands(cl.now))
        ours = _share(cl, names[who], held[names[who]])
        for v in p.victims:
            queue = cl.state.jobs[v.job_id].spec.queue
            assert held[queue].gpu >= cl.state.queues[queue].gpu  # type: ignore[operator]
            assert _share(cl, queue, held[queue]) >= ours


def _victims(plan: object) -> set[str]:
    return {v.job_id for p in plan.preemptions for v in p.victims}  # type: ignore[attr-defined]


def _share(cl: Cluster, name: str, held: Resources) -> int:
    half_life = cl.state.config.fair_share_half_life_ms
    history = cl.state.queue_history.get(name)
    return share(cl.state.queues[name], history, held, cl.now, half_life)


def test_an_elastic_victim_gives_up_what_it_runs_not_its_max() -> None:
    # 48 GPUs: a holds its 8; b holds 40: three old 8-GPU gangs and an elastic gang of 2
    # of at most 4 members, started a minute ago (the cheapest victim). Taking the
    # elastic gang whole leaves b 24 GPUs (3.0), above a's 16 (2.0): allowed. Counted at
    # its max of 32, b would fall to 8 (1.0), and an old gang would be preempted instead.
    cl = lab(A, B, cohorts=(Cohort("lab", gpu=32, fair_sharing_preemption=True),), hosts=6)
    run(cl, "a", 8)
    for _ in range(3):
        run(cl, "b", 8)
    cl.now += 6_000_000
    spec = replace(job(queue="b", gpu=8, replicas=4), elastic=ElasticPolicy(1, "SIGUSR1"))
    flexible = cl.submit(spec)
    cl.run_pass()
    cl.start_all(flexible)
    attempt = cl.state.jobs[flexible].attempt
    assert attempt is not None and len(attempt.members) == 2
    cl.now += 60_000
    cl.submit(job(queue="a", gpu=8))
    plan = cl.run_pass()
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.FAIR_SHARE]
    assert [v.job_id for v in plan.preemptions[0].victims] == [flexible]
    assert all(cl.do(p).ok for p in plan.preempt_commands(cl.now))  # apply agrees
