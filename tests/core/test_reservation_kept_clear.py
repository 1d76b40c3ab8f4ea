"""A gang after the pass's reservation in queue order seeks its victims where it may be
placed (core/scheduler/passes.py): off the reserved nodes, unless it may backfill there.
Else a preemptor taking a victim on the reserved host would be placed there at its next
pass (it goes first, on what its victims freed), and the host kept for the first gang in
line would never empty."""

from __future__ import annotations

import pytest

from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.model import JobState
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.scheduler import IncrementalPlanner, schedule
from tests.core.harness import Cluster, job
from tests.core.test_queues import apply_preemptions, cluster, stop_all

HOUR = 3_600_000


def _batch(cl: Cluster) -> list[str]:
    """Eight one-GPU gangs of queue y, class low, bound and started now (one host)."""
    jobs = [cl.submit(job(queue="y", gpu=1, priority_class="low")) for _ in range(8)]
    cl.run_pass()
    for j in jobs:
        cl.start_all(j)
    return jobs


def _reserved_host_of_the_youngest(y_gpus: int) -> tuple[Cluster, str, str, set[str]]:
    """Two 8-GPU hosts full of queue y's low gangs, the younger ones on the host the pass
    reserves for ``big`` (queue x, 8 GPUs, first in line: x holds nothing); ``high``
    (queue y, class high) comes after it in queue order and must preempt one gang of y.
    With y's quota at 16 GPUs it waits for quota, at 24 for room."""
    cl = cluster(Queue("x", gpu=8), Queue("y", gpu=y_gpus), racks=1, per_rack=2)
    first = _batch(cl)
    cl.now += HOUR
    older = _batch(cl)
    for j in first:
        cl.exit_member(j, 0, 0)
    cl.now += HOUR
    younger = _batch(cl)
    (young_host,) = {n for j in younger for n in cl.nodes_of(j)}
    assert young_host not in {n for j in older for n in cl.nodes_of(j)}
    cl.now += 60_000
    big = cl.submit(job(queue="x", gpu=8))
    high = cl.submit(job(queue="y", gpu=1, priority_class="high"))
    return cl, big, high, set(older)


@pytest.mark.parametrize("y_gpus", [16, 24], ids=["waiting-for-quota", "waiting-for-room"])
def test_a_preemptor_after_the_reservation_takes_no_victim_on_its_host(y_gpus: int) -> None:
    cl, big, high, older = _reserved_host_of_the_youngest(y_gpus)
    plan = cl.plan()
    assert plan.reservation is not None and plan.reservation.job_id == big
    assert plan.reasons[big].code is ReasonCode.FIRST_IN_LINE_RESERVED
    (reserved,) = plan.reservation.nodes
    (preemption,) = plan.preemptions
    assert preemption.preemptor == high
    (victim,) = preemption.victims
    # The cheapest victim overall (the youngest) is on the reserved host; the one taken
    # is an older gang on the other host.
    assert victim.job_id in older and cl.nodes_of(victim.job_id) != [reserved]
    assert schedule(cl.state, cl.now, recall=False) == plan
    assert IncrementalPlanner().plan(cl.state, cl.now) == plan
    # The preemptor is placed on what its victim freed; the reserved host keeps its gangs.
    assert all(r.ok for r in apply_preemptions(cl))
    stop_all(cl, victim.job_id)
    cl.run_pass()
    assert cl.state_of(high) is JobState.SCHEDULED
    assert cl.nodes_of(high) != [reserved]
