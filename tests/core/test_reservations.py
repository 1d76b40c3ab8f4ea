"""More than one reservation per pass (``ClusterConfig.reservations_per_pass``,
core/scheduler/reservation.py): the first K gangs that cannot be placed each reserve, on
nodes no earlier one holds, and a later gang may use reserved nodes only if it ends
before every reservation holding them."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode
from synapse_ha.core.codec.formats import format_needed, held_back_config
from synapse_ha.core.model import JobState
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler import IncrementalPlanner, schedule
from synapse_ha.core.scheduler.reservation import RESERVATIONS_FORMAT
from synapse_ha.core.spec.validation import check_cluster_config
from tests.core.harness import Cluster, job, node

HOUR_S = 3_600


def _started(cl: Cluster, host: str, gpu: int, cpu: float, hours: float = 0) -> str:
    """A gang bound on ``host`` (registered for it) and started, with a time limit of
    ``hours`` (0: none)."""
    cl.add(node(host, gpus=8, cpu=16))
    j = cl.submit(job(gpu=gpu, cpu=cpu, time_limit_s=round(hours * HOUR_S)))
    cl.run_pass()
    assert cl.nodes_of(j) == [host]
    cl.start_all(j)
    return j


def _small_gang_first(reservations: int) -> tuple[Cluster, str, str]:
    """Three 8-GPU hosts of 16 CPUs: h0 runs a gang without a time limit (7 GPUs, every
    CPU: one GPU free beside no CPU), h1 an 8-GPU gang for an hour, h2 a 4-GPU gang for
    two. First in line, ``small`` (1 GPU and 16 CPUs) fits no host now; behind it ``big``
    (8 GPUs)."""
    config = ClusterConfig(
        locality_wait_ms=0, preemption=PreemptionMode.OFF, reservations_per_pass=reservations
    )
    cl = Cluster(state=dataclasses.replace(Cluster().state, config=config))
    _started(cl, "h0", gpu=7, cpu=16)
    _started(cl, "h1", gpu=8, cpu=1, hours=1)
    _started(cl, "h2", gpu=4, cpu=1, hours=2)
    small = cl.submit(job("small", gpu=1, cpu=16))
    big = cl.submit(job("big", gpu=8, cpu=1))
    return cl, small, big


def _same_plan(cl: Cluster) -> None:
    plan = schedule(cl.state, cl.now)
    assert schedule(cl.state, cl.now, recall=False) == plan
    assert IncrementalPlanner().plan(cl.state, cl.now) == plan


def test_a_small_gang_blocked_first_leaves_the_big_gang_behind_it_a_reservation() -> None:
    cl, small, big = _small_gang_first(4)
    plan = cl.plan()
    assert [(r.job_id, r.nodes) for r in plan.reservations] == [
        (small, frozenset({"h1"})),  # h1 frees first (in an hour)
        (big, frozenset({"h2"})),  # not on h1: the small gang holds it
    ]
    assert plan.reservation == plan.reservations[0]
    assert plan.reservations[1].start_ms == plan.reservations[0].start_ms + HOUR_S * 1000
    assert plan.reasons[big].code is ReasonCode.FIRST_IN_LINE_RESERVED
    assert "first in line" in render(plan.reasons[small])
    assert "in line behind 1 gang that also holds a reservation" in render(plan.reasons[big])
    _same_plan(cl)


def test_with_one_reservation_only_the_first_gang_in_line_reserves() -> None:
    cl, small, big = _small_gang_first(1)
    plan = cl.plan()
    assert [r.job_id for r in plan.reservations] == [small]
    assert plan.reasons[big].code is ReasonCode.WAITING_CAPACITY
    # A gang without an estimate takes half of the host the big gang needs.
    later = cl.submit(job("later", gpu=4, cpu=1))
    cl.run_pass()
    assert cl.nodes_of(later) == ["h2"]


def test_a_later_gang_keeps_off_a_second_reservation_it_does_not_end_before() -> None:
    cl, _, big = _small_gang_first(2)  # two: the later gangs reserve nothing
    # Ends after the big gang's reservation starts (in two hours): kept off h2.
    late = cl.submit(job("late", gpu=4, cpu=1, time_limit_s=3 * HOUR_S))
    plan = cl.run_pass()
    assert cl.state_of(late) is JobState.PENDING
    why = plan.reasons[late]
    # It would fit on h2 but for the big gang's reservation, not the small gang's (h1).
    assert why.code is ReasonCode.RESERVED_FOR_OTHER and why.text("holder") == big
    assert why.num("start_in_ms") == 2 * HOUR_S * 1000
    _same_plan(cl)
    # Ends after the small gang's start but before the big gang's: it may use h2, the
    # big gang's, though not h1.
    soon = cl.submit(job("soon", gpu=4, cpu=1, time_limit_s=HOUR_S + HOUR_S // 2))
    _same_plan(cl)
    cl.run_pass()
    assert cl.nodes_of(soon) == ["h2"]
    assert cl.state_of(late) is JobState.PENDING


def test_the_count_is_validated_and_gated_at_its_format() -> None:
    assert ClusterConfig().reservations_per_pass == 1
    for bad in (0, 17):
        problems = check_cluster_config(ClusterConfig(reservations_per_pass=bad))
        assert [p.field for p in problems] == ["reservations_per_pass"], problems
        assert str(problems[0]) == "reservations_per_pass: must be between 1 and 16"
    assert not check_cluster_config(ClusterConfig(reservations_per_pass=16))
    assert RESERVATIONS_FORMAT == 18
    assert format_needed(c.Configure(ClusterConfig(reservations_per_pass=4))) == 18
    wanted = ClusterConfig(reservations_per_pass=4)
    assert held_back_config(wanted, ClusterConfig(), 17).reservations_per_pass == 1
    assert held_back_config(wanted, ClusterConfig(), 18).reservations_per_pass == 4


@pytest.mark.parametrize("floor", [RESERVATIONS_FORMAT - 1, RESERVATIONS_FORMAT])
def test_below_its_format_a_pass_keeps_one_reservation(floor: int) -> None:
    cl, small, big = _small_gang_first(4)
    cl.state.format_floor = floor  # a replica of the previous release, or this one
    made = [r.job_id for r in cl.plan().reservations]
    assert made == ([small] if floor < RESERVATIONS_FORMAT else [small, big])
