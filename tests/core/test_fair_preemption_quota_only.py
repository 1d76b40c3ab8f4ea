"""Fair-sharing preemption for room is for a queue owed it: a gang its queue's quota admits
already preempts by fair share only while the queue holds less than its nominal; at or
above it, the gang waits for room like any borrowing gang (format 18,
synapse_ha/core/queues/fair_preemption.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Cohort, PreemptionKind, Queue, QueueHistory
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.model import JobState
from synapse_ha.core.queues.fair_preemption import QUOTA_ONLY_FORMAT
from synapse_ha.core.queues.quota import QueueUsage, gang_request
from synapse_ha.core.reasons import render
from tests.core.harness import Cluster, job
from tests.core.test_fair_preemption import A, B, lab


def _started(cl: Cluster, queue: str, gpu: int, cpu: float = 1) -> str:
    j = cl.submit(job(queue=queue, gpu=gpu, cpu=cpu))
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED, render(cl.state.jobs[j].reason)
    cl.start_all(j)
    return j


def room_not_quota(floor: int = FORMAT, a_holds: int = 8) -> tuple[Cluster, str, list[str]]:
    """Four 8-GPU hosts of 64 CPUs, cohort lab lending 16: a holds ``a_holds`` of its
    nominal 8, b its 8 and two one-GPU gangs that each take a whole host's CPUs (b borrows
    2), with a long past that keeps b's share far above a's. a's gang of 8 fits a's quota
    (14 GPUs of the cohort's are free to borrow) but no host: only b's CPU-bound gangs
    stand in its way. The cluster reads format ``floor``."""
    cl = lab(A, B)
    cl.state.format_floor = floor
    _started(cl, "a", a_holds)
    _started(cl, "b", 8)
    hogs = [_started(cl, "b", 1, cpu=64) for _ in range(2)]
    cl.now += 60_000
    half_life = cl.state.config.fair_share_half_life_ms
    cl.state.queue_history = {"b": QueueHistory(gpu_ms=64 * half_life, at_ms=cl.now)}
    mine = cl.submit(job(queue="a", gpu=8))
    return cl, mine, hogs


def test_a_gang_its_quota_admits_preempts_nobody_while_its_queue_holds_its_nominal() -> None:
    cl, mine, _ = room_not_quota()
    keeps = QueueUsage.kept_after_reclaims(cl.state, besides=mine)
    assert keeps.shortfall("a", gang_request(cl.state.jobs[mine].spec)) is None
    plan = cl.run_pass()
    assert plan.preemptions == []
    assert cl.state_of(mine) is JobState.PENDING


def test_a_queue_below_its_nominal_still_preempts_for_room() -> None:
    # a holds 4 of its 8: its gang of 8 is bigger than what it misses (no reclaim), and
    # it is owed room: the fair-share preemption stands.
    cl, _, hogs = room_not_quota(a_holds=4)
    plan = cl.run_pass()
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.FAIR_SHARE]
    assert plan.preemptions[0].victims[0].job_id in hogs
    assert all(cl.do(p).ok for p in plan.preempt_commands(cl.now))


def test_before_format_18_the_same_gang_preempted_for_room() -> None:
    cl, _, hogs = room_not_quota(floor=17)
    plan = cl.run_pass()
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.FAIR_SHARE]
    assert plan.preemptions[0].victims[0].job_id in hogs
    assert all(cl.do(p).ok for p in plan.preempt_commands(cl.now))  # apply agreed then


def test_apply_refuses_a_fair_share_preemption_for_room_of_a_queue_at_its_nominal() -> None:
    cl, mine, hogs = room_not_quota()
    token = cl.state.jobs[hogs[0]].attempt.fencing_token  # type: ignore[union-attr]
    victims = (c.Victim(hogs[0], token),)
    result = cl.do(c.Preempt(mine, 0, victims, PreemptionKind.FAIR_SHARE, cl.now))
    assert result.code is c.ResultCode.CONFLICT
    assert "queue a's quota admits the gang without victims and it holds 8 GPUs of its " in (
        result.message
    )
    assert cl.state.jobs[hogs[0]].attempt.preempted_by == ""  # type: ignore[union-attr]


def test_a_gang_its_quota_refuses_still_preempts_by_fair_share() -> None:
    # The cohort lends 16 and b borrows all of it: a's gang of 8 needs quota back.
    cl = lab(A, B)
    _started(cl, "a", 8)
    theirs = [_started(cl, "b", 8) for _ in range(3)]
    cl.now += 60_000
    mine = cl.submit(job(queue="a", gpu=8))
    keeps = QueueUsage.kept_after_reclaims(cl.state, besides=mine)
    assert keeps.shortfall("a", gang_request(cl.state.jobs[mine].spec)) is not None
    plan = cl.run_pass()
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.FAIR_SHARE]
    assert plan.preemptions[0].victims[0].job_id in theirs
    assert all(cl.do(p).ok for p in plan.preempt_commands(cl.now))


def test_the_rule_is_format_18s() -> None:
    assert QUOTA_ONLY_FORMAT == 18 <= FORMAT


# --------------------------------------------------------------------- property


@st.composite
def _tenancy(draw: st.DrawFn) -> tuple[list[int], list[list[tuple[int, int]]], list[int], int]:
    """Three queues of one flat cohort lending 16 on six hosts: nominals, the gangs each
    runs (GPUs, CPUs), each one's past GPU-ms in half-lives, the preemptor's queue."""
    nominals = [draw(st.sampled_from([4, 8, 16])) for _ in range(3)]
    gang = st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 32, 64]))
    gangs = [draw(st.lists(gang, max_size=5)) for _ in range(3)]
    past = [draw(st.integers(0, 32)) for _ in range(3)]
    return nominals, gangs, past, draw(st.integers(0, 2))


@settings(max_examples=100, deadline=None)
@given(_tenancy(), st.sampled_from([2, 4, 8]))
def test_a_queue_at_its_nominal_preempts_by_fair_share_only_for_quota(
    drawn: tuple[list[int], list[list[tuple[int, int]]], list[int], int], size: int
) -> None:
    nominals, gangs, past, who = drawn
    names = ["q0", "q1", "q2"]
    queues = [Queue(n, gpu=g, cohort="lab") for n, g in zip(names, nominals, strict=True)]
    cl = lab(*queues, cohorts=(Cohort("lab", gpu=16, fair_sharing_preemption=True),), hosts=6)
    for name, sizes in zip(names, gangs, strict=True):
        for gpus, cpus in sizes:
            j = cl.submit(job(queue=name, gpu=gpus, cpu=cpus))
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
    keeps = QueueUsage.kept_after_reclaims(cl.state, besides=mine)
    admitted = keeps.shortfall(names[who], gang_request(cl.state.jobs[mine].spec)) is None
    owed_room = keeps.used(names[who]).gpu < nominals[who]
    plan = cl.run_pass()
    fair = [p for p in plan.preemptions if p.kind is PreemptionKind.FAIR_SHARE]
    if admitted and not owed_room:
        assert fair == []
    for p in fair:
        assert p.preemptor == mine
    assert all(cl.do(command).ok for command in plan.preempt_commands(cl.now))
