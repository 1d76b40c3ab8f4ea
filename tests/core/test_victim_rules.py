"""Who may be a victim and what it costs (core/queues/victim_rules.py, DESIGN §8): the cost counts
from a gang's checkpoint mark, the minimum run time of a class or a queue protects a gang
from its bind, and a reclaim that has waited past ``reclaim_wait_max_ms`` overrides it."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import (
    DEFAULT_PRIORITY_CLASSES,
    ClusterConfig,
    PreemptionKind,
    PriorityClass,
    Queue,
)
from synapse_ha.core.codec.formats import format_needed, held_back_config
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.queues.victim_rules import lost_gpu_ms, protected_until_ms
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.spec.validation import check_cluster_config, check_queue
from tests.core.harness import Cluster, job
from tests.core.test_queues import cluster as queues_cluster
from tests.core.test_queues import run as queues_run
from tests.core.test_queues import stop_all

HOUR = 3_600_000
MINUTE = 60_000


def classes(low_min_ms: int = 0) -> tuple[PriorityClass, ...]:
    return tuple(
        dataclasses.replace(p, min_runtime_ms=low_min_ms) if p.name == "low" else p
        for p in DEFAULT_PRIORITY_CLASSES
    )


def cluster(
    *queues: Queue, low_min_ms: int = 0, racks: int = 2, per_rack: int = 2, **config: int
) -> Cluster:
    """A cluster of test_queues' shape whose ``low`` class has ``low_min_ms`` as its
    minimum run time, with ``config`` (e.g. ``reclaim_wait_max_ms``) set."""
    cl = queues_cluster(*queues, racks=racks, per_rack=per_rack)
    wanted = dataclasses.replace(cl.state.config, priority_classes=classes(low_min_ms), **config)
    assert cl.do(c.Configure(wanted, cl.now)).ok
    return cl


def run(cl: Cluster, queue: str, gpu: int, replicas: int = 1, cls: str = "low") -> str:
    return queues_run(cl, queue, gpu, replicas, cls)


def mark_all(cl: Cluster, j: str, step: int) -> None:
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    for m in attempt.members:
        event = c.MemberEvent(
            j, attempt.fencing_token, m.rank, c.MemberEventKind.CHECKPOINT, step=step, mark_seq=1
        )
        assert cl.do(c.ReportMembers(m.node_id, (event,), now_ms=cl.now)).ok


def victims_planned(cl: Cluster) -> list[list[str]]:
    return [sorted(v.job_id for v in p.victims) for p in cl.plan().preemptions]


# -------------------------------------------------------------------------- cost


def test_the_cost_of_a_victim_counts_from_its_gangs_checkpoint_mark() -> None:
    # Rack r0: one old 16-GPU gang. Rack r1: two young 8-GPU gangs. Without a mark the
    # young ones are cheaper (test_queues); once the old gang's every member has marked a
    # checkpoint a minute ago, it loses 16 GPU-minutes against their 2 x 8 x 61.
    cl = cluster(Queue("q", gpu=64))
    old = run(cl, "q", 8, 2)
    cl.now += HOUR
    young = [run(cl, "q", 8) for _ in range(2)]
    cl.now += MINUTE
    mark_all(cl, old, step=900)
    cl.now += MINUTE
    attempt = cl.state.jobs[old].attempt
    assert attempt is not None
    assert lost_gpu_ms(attempt, 16, cl.now) == 16 * MINUTE
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high", required="rack"))
    assert victims_planned(cl) == [[old]]
    assert all(cl.state.jobs[j].attempt.preempted_by == "" for j in young)  # type: ignore[union-attr]


def test_a_mark_of_only_some_members_does_not_lower_the_cost() -> None:
    # The gang can resume only from a point every member has passed.
    cl = cluster(Queue("q", gpu=64))
    old = run(cl, "q", 8, 2)
    cl.now += HOUR
    young = [run(cl, "q", 8) for _ in range(2)]
    attempt = cl.state.jobs[old].attempt
    assert attempt is not None
    event = c.MemberEvent(old, attempt.fencing_token, 0, c.MemberEventKind.CHECKPOINT, mark_seq=1)
    assert cl.do(c.ReportMembers(attempt.members[0].node_id, (event,), now_ms=cl.now)).ok
    cl.now += MINUTE
    assert lost_gpu_ms(attempt, 16, cl.now) == 16 * (HOUR + MINUTE)
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high", required="rack"))
    assert victims_planned(cl) == [sorted(young)]


# ---------------------------------------------------------------- minimum run time


def test_a_class_min_runtime_protects_a_gang_from_its_bind_and_a_mark_does_not_extend_it() -> None:
    cl = cluster(Queue("q", gpu=32), low_min_ms=HOUR, racks=1)
    low = run(cl, "q", 8, 2)
    bound = cl.state.jobs[low].attempt.bound_at_ms  # type: ignore[union-attr]
    assert protected_until_ms(cl.state, cl.state.jobs[low], cl.state.jobs[low].attempt) == (  # type: ignore[arg-type]
        bound + HOUR
    )
    high = cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    cl.now += HOUR - 1_000
    mark_all(cl, low, step=10)  # cheap now, but still within its minimum
    assert victims_planned(cl) == []
    plan = cl.plan()
    why = plan.reasons[high]
    assert why.code is ReasonCode.WAITING_MIN_RUNTIME, render(why)
    assert (why.num("count"), why.num("until_ms"), plan.wake_ms) == (1, bound + HOUR, bound + HOUR)
    assert render(why).startswith(
        "no room yet: 1 gang(s) it may preempt (priority: a higher priority class of the same "
        "queue) are within their minimum run time; it may preempt from "
    )
    cl.now += 1_000
    assert victims_planned(cl) == [[low]]
    for p in cl.plan().preempt_commands(cl.now):
        assert cl.do(p).ok
    stop_all(cl, low)
    cl.run_pass()
    assert cl.state_of(high) is JobState.SCHEDULED


def test_a_queue_min_runtime_protects_its_gangs_and_the_longer_minimum_holds() -> None:
    cl = cluster(Queue("q", gpu=32, min_runtime_ms=2 * HOUR), low_min_ms=HOUR, racks=1)
    low = run(cl, "q", 8, 2)
    cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    cl.now += HOUR
    assert victims_planned(cl) == []
    cl.now += HOUR
    assert victims_planned(cl) == [[low]]


def test_apply_refuses_a_preempt_of_a_protected_victim_and_changes_nothing() -> None:
    cl = cluster(Queue("q", gpu=32), low_min_ms=HOUR, racks=1)
    low = run(cl, "q", 8, 2)
    high = cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    cl.now += 30 * MINUTE
    before, clock = encode_state(cl.state), cl.state.last_time_ms
    token = cl.state.jobs[low].fencing_token
    result = cl.do(c.Preempt(high, 0, (c.Victim(low, token),), PreemptionKind.PRIORITY, cl.now))
    assert result.code is c.ResultCode.CONFLICT
    assert f"victim {low} is within its minimum run time for another 1800s" in result.message
    cl.state.applied_commands -= 1
    cl.state.last_time_ms = clock  # the command's time is seen, as every command's is
    assert encode_state(cl.state) == before


def reclaim_cluster(wait_ms: int) -> tuple[Cluster, list[str]]:
    cl = cluster(
        Queue("team-a", gpu=8, cohort="lab"),
        Queue("team-b", gpu=8, cohort="lab", min_runtime_ms=HOUR),
        racks=1,
        reclaim_wait_max_ms=wait_ms,
    )
    borrowers = [run(cl, "team-b", 8, cls="normal") for _ in range(2)]
    return cl, borrowers


def test_a_reclaim_waits_for_the_minimum_run_time_until_it_has_waited_past_its_limit() -> None:
    cl, borrowers = reclaim_cluster(wait_ms=10 * MINUTE)
    beyond = cl.submit(job(queue="team-a", gpu=8, replicas=2))  # beyond its nominal: no reclaim
    within = cl.submit(job(queue="team-a", gpu=8))
    cl.now += 10 * MINUTE - 1
    assert victims_planned(cl) == []
    reasons = cl.plan().reasons
    assert reasons[beyond].code is ReasonCode.WAITING_QUOTA
    assert reasons[within].code is ReasonCode.WAITING_MIN_RUNTIME, render(reasons[within])
    queued = cl.state.jobs[within].submitted_at_ms
    assert reasons[within].num("until_ms") == queued + 10 * MINUTE  # before the hour ends
    assert "(reclaim: its queue takes back quota" in render(reasons[within])
    cl.now += 1
    # team-b borrows 8 (one gang): only one is taken, never below its nominal.
    planned = victims_planned(cl)
    assert len(planned) == 1 and len(planned[0]) == 1 and planned[0][0] in borrowers
    for p in cl.plan().preempt_commands(cl.now):
        assert cl.do(p).ok


def test_a_priority_preemption_never_overrides_the_minimum_run_time() -> None:
    cl = cluster(Queue("q", gpu=32), low_min_ms=HOUR, racks=1, reclaim_wait_max_ms=0)
    low = run(cl, "q", 8, 2)
    high = cl.submit(job(queue="q", gpu=8, replicas=2, priority_class="high"))
    cl.now += 30 * MINUTE
    assert victims_planned(cl) == []
    token = cl.state.jobs[low].fencing_token
    result = cl.do(c.Preempt(high, 0, (c.Victim(low, token),), PreemptionKind.PRIORITY, cl.now))
    assert result.code is c.ResultCode.CONFLICT and "minimum run time" in result.message


# ----------------------------------------------------------- settings and format


@pytest.mark.parametrize("value", [-1, 7 * 86_400_000 + 1])
def test_min_runtime_and_reclaim_wait_out_of_range_are_refused_naming_the_field(
    value: int,
) -> None:
    queue = Queue("q", gpu=8, min_runtime_ms=value)
    assert [v.field for v in check_queue(queue, DEFAULT_PRIORITY_CLASSES)] == ["min_runtime_ms"]
    config = ClusterConfig(priority_classes=classes(value), reclaim_wait_max_ms=value)
    fields = [v.field for v in check_cluster_config(config)]
    assert fields == ["priority_classes[0].min_runtime_ms", "reclaim_wait_max_ms"]


def test_the_settings_need_format_6_and_the_leader_holds_them_back_below_it() -> None:
    assert format_needed(c.SetQueue(Queue("q", gpu=8), 0)) < 6
    assert format_needed(c.SetQueue(Queue("q", gpu=8, min_runtime_ms=1), 0)) == 6
    wanted = ClusterConfig(priority_classes=classes(HOUR), reclaim_wait_max_ms=MINUTE)
    assert format_needed(c.Configure(wanted, 0)) == 6
    held = held_back_config(wanted, ClusterConfig(), 5)
    assert held == ClusterConfig()
    assert format_needed(c.Configure(held, 0)) < 6
    assert held_back_config(wanted, ClusterConfig(), 6) == wanted
    # A cluster below format 6 refuses a queue with a minimum run time, with the reason.
    state = ClusterState()
    assert apply(state, c.RaiseFormat(5, ("r1",), 0)).ok
    result = apply(state, c.SetQueue(Queue("q", gpu=8, min_runtime_ms=1), 0))
    assert not result.ok and "needs format 6" in result.message
    assert "q" not in state.queues
