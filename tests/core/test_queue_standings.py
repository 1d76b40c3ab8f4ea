"""Each queue's place in the fair-share order (core/scheduler/order.py ``queue_standings``,
reported by ``ListQueues`` through core/queues/usage.py ``queues_now``): the key a pass
orders queues by, so the positions are the order in which a pass first reaches each
queue's gangs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Cohort, Queue, QueueHistory
from synapse_ha.core.model import JobState
from synapse_ha.core.queues.fairshare import SHARE_SCALE
from synapse_ha.core.queues.quota import QueueUsage
from synapse_ha.core.queues.usage import cohort_usage, queue_usage, queues_now
from synapse_ha.core.scheduler.order import ordered_pending
from tests.core.harness import Cluster, job
from tests.core.test_queues import cluster, run

HOUR = 3_600_000
ORG = (Cohort("org"), Cohort("team-a", "org"), Cohort("team-b", "org"))
QUEUES = (
    Queue("a1", gpu=8, cohort="team-a"),
    Queue("a2", gpu=8, cohort="team-a"),
    Queue("b1", gpu=8, cohort="team-b"),
    Queue("solo", gpu=4),
    Queue("free"),  # no quota: no share, first among equals
)


def _first_reached(cl: Cluster) -> list[str]:
    """The queues in the order a pass first considers one of their gangs."""
    seen: list[str] = []
    usage = QueueUsage.of(cl.state)
    for j in ordered_pending(cl.state, cl.now, usage, set()):
        if j.spec.queue not in seen:
            seen.append(j.spec.queue)
    return seen


def test_past_usage_and_what_is_held_now_set_the_share_and_the_place() -> None:
    cl = cluster(Queue("a", gpu=16), Queue("b", gpu=16), Queue("idle", gpu=8), racks=1)
    run(cl, "a", 8)  # holds half its nominal now
    cl.state.queue_history["b"] = QueueHistory(gpu_ms=12 * HOUR, at_ms=cl.now)
    half_life = cl.state.config.fair_share_half_life_ms
    cl.submit(job(queue="a", gpu=8))
    cl.submit(job(queue="b", gpu=8))
    standings = queues_now(cl.state, cl.now).standings
    assert standings["a"].share == SHARE_SCALE // 2
    # 12 GPU-hours over one half-life, against 16 GPUs.
    assert standings["b"].share == 12 * HOUR * SHARE_SCALE // (16 * half_life)
    assert standings["idle"].share == 0
    # b used less than a holds: b first. idle and default, with nothing pending, come
    # after a queue with a gang waiting only at an equal share: first here (share 0).
    assert [n for n, _ in sorted(standings.items(), key=lambda s: s[1].position)] == [
        "default",
        "idle",
        "b",
        "a",
    ]
    assert _first_reached(cl) == ["b", "a"]
    # Time passes: b's past usage decays, a's held GPUs do not.
    cl.now += 10 * half_life
    later = queues_now(cl.state, cl.now).standings
    assert later["b"].share < standings["b"].share
    assert later["a"].share == standings["a"].share


def test_a_cohort_that_used_little_puts_all_its_queues_first() -> None:
    cl = cluster(*QUEUES, racks=2, per_rack=2)
    for cohort in ORG:
        assert cl.do(c.SetCohort(cohort, cl.now)).ok
    run(cl, "a1", 8)  # team-a holds 8 of its 16
    run(cl, "b1", 4)  # team-b holds 4 of its 8
    for name in ("a2", "b1", "a1"):
        cl.submit(job(queue=name, gpu=8))
    standings = queues_now(cl.state, cl.now).standings
    assert standings["a2"].share == 0 and standings["b1"].share == SHARE_SCALE // 2
    assert standings["a2"].cohort_shares == (SHARE_SCALE // 2,)  # team-a: 8 of 16
    assert standings["b1"].cohort_shares == (SHARE_SCALE // 2,)
    assert standings["solo"].cohort_shares == ()
    order = sorted(standings, key=lambda n: standings[n].position)
    # a2 (team-a 1/2, own 0) before b1 (team-b 1/2, own 1/2) before a1 (1/2, 1): the
    # pass reaches them so.
    assert [n for n in order if n in ("a1", "a2", "b1")] == ["a2", "b1", "a1"]
    assert _first_reached(cl) == ["a2", "b1", "a1"]


@settings(max_examples=25, deadline=None)
@given(
    held=st.fixed_dictionaries(
        {
            "a1": st.sampled_from([0, 4, 8]),
            "a2": st.sampled_from([0, 4, 8]),
            "b1": st.sampled_from([0, 8]),
            "solo": st.sampled_from([0, 4]),
            "free": st.sampled_from([0, 8]),
        }
    ),
    past=st.dictionaries(
        st.sampled_from([q.name for q in QUEUES]), st.integers(0, 64 * HOUR), max_size=5
    ),
    waiting=st.lists(
        st.tuples(st.sampled_from([q.name for q in QUEUES]), st.integers(0, 2)), max_size=8
    ),
    tree=st.booleans(),
)
def test_positions_are_the_order_a_pass_reaches_the_queues(
    held: dict[str, int], past: dict[str, int], waiting: list[tuple[str, int]], tree: bool
) -> None:
    cl = cluster(*QUEUES, racks=2, per_rack=3)
    if tree:
        for cohort in ORG:
            assert cl.do(c.SetCohort(cohort, cl.now)).ok
    for name, gpus in held.items():
        if gpus:
            run(cl, name, gpus)
    for name, gpu_ms in past.items():
        cl.state.queue_history[name] = QueueHistory(gpu_ms=gpu_ms, at_ms=cl.now - HOUR)
    for name, priority in waiting:
        j = cl.submit(job(queue=name, gpu=8, priority=priority))
        assert cl.state_of(j) is JobState.PENDING
    now = queues_now(cl.state, cl.now)
    positions = sorted(now.standings, key=lambda n: now.standings[n].position)
    assert sorted(s.position for s in now.standings.values()) == list(
        range(1, len(cl.state.queues) + 1)
    )
    with_gangs = [n for n in positions if any(w[0] == n for w in waiting)]
    assert with_gangs == _first_reached(cl)
    # One pass over the jobs gives what the separate functions give.
    assert now.usage == queue_usage(cl.state)
    assert now.cohorts == cohort_usage(cl.state)
