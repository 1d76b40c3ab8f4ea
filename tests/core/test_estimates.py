"""Run-time estimates (core/queues/estimates.py): a queue's default time limit and the
estimate learned from alike finished runs, used by reservations and backfill only; the
queue fields' validation and format; the explain line."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.codec.versioned import decode_command, encode_command
from synapse_ha.core.machine import apply
from synapse_ha.core.model import Attempt, ClusterState, Job, JobState
from synapse_ha.core.queues.estimates import (
    MIN_RUNS,
    Estimate,
    Estimates,
    EstimateSource,
    describe,
    estimate_of,
    estimated_end,
    percentile,
)
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.scheduler import explain
from tests.core.harness import Cluster, job, node

HOUR = 3_600_000


def test_the_percentile_is_a_value_of_the_list_by_nearest_rank() -> None:
    assert percentile([5]) == 5
    assert percentile(list(range(1, 11))) == 9  # the 9th of 10
    assert percentile(list(range(1, 12))) == 10  # ceil(9.9): the 10th of 11
    assert percentile([30, 10, 20, 40, 50]) == 50  # ceil(4.5): the 5th of 5
    assert percentile([30, 10, 20, 40, 50], 50) == 30


def _finished(
    state: ClusterState,
    n: int,
    owner: str,
    name: str,
    run_ms: int,
    queue: str = "gpu",
    end: JobState = JobState.SUCCEEDED,
) -> None:
    """``n`` finished jobs whose last attempt ran ``run_ms`` (the i-th i ms longer)."""
    for i in range(n):
        job_id = f"job-{len(state.jobs) + 1:06d}"
        attempt = Attempt(1, 1, (), 29_500, 0, [], 10_000, 10_000 + run_ms + i)
        spec = job(name, queue=queue)
        state.jobs[job_id] = Job(
            job_id, spec, job_id, len(state.jobs), 0, end, attempt=attempt, owner=owner
        )


def _state(**queue: object) -> ClusterState:
    state = ClusterState()
    state.queues["gpu"] = Queue("gpu", **queue)  # type: ignore[arg-type]
    return state


def _pending(owner: str, name: str, queue: str = "gpu", limit_ms: int = 0) -> Job:
    spec = dataclasses.replace(job(name, queue=queue), time_limit_ms=limit_ms)
    return Job("job-999999", spec, "r", 999, 0, owner=owner)


def test_a_time_limit_comes_first_then_learned_runs_then_the_queue_default() -> None:
    state = _state(default_time_limit_ms=4 * HOUR, learned_estimates=True)
    _finished(state, MIN_RUNS, "alice", "train", HOUR)
    estimates = Estimates(state)
    assert estimates.of(_pending("alice", "train", limit_ms=60_000)) == Estimate(
        60_000, EstimateSource.TIME_LIMIT
    )
    assert estimates.of(_pending("alice", "train")) == Estimate(
        HOUR + MIN_RUNS - 1, EstimateSource.LEARNED_NAME, MIN_RUNS
    )
    # Another name of the same owner and queue: the owner's runs in the queue.
    assert estimates.of(_pending("alice", "eval")) == Estimate(
        HOUR + MIN_RUNS - 1, EstimateSource.LEARNED_QUEUE, MIN_RUNS
    )
    # Another owner has no runs: the queue's default.
    assert estimates.of(_pending("bob", "train")) == Estimate(
        4 * HOUR, EstimateSource.QUEUE_DEFAULT
    )
    assert estimates.of(_pending("bob", "train", queue="default")) is None
    assert estimates.of(_pending("bob", "train", queue="gone")) is None


def test_learning_needs_five_runs_counts_failures_and_leaves_out_cancelled_ones() -> None:
    state = _state(learned_estimates=True)
    _finished(state, MIN_RUNS - 1, "alice", "train", HOUR)
    _finished(state, 3, "alice", "train", 9 * HOUR, end=JobState.CANCELLED)
    assert estimate_of(state, _pending("alice", "train")) is None
    _finished(state, 1, "alice", "train", 2 * HOUR, end=JobState.FAILED)
    learned = estimate_of(state, _pending("alice", "train"))
    assert learned == Estimate(2 * HOUR, EstimateSource.LEARNED_NAME, MIN_RUNS)


def test_a_queue_without_learned_estimates_ignores_its_history() -> None:
    state = _state(default_time_limit_ms=HOUR)
    _finished(state, 10, "alice", "train", 5 * HOUR)
    guess = estimate_of(state, _pending("alice", "train"))
    assert guess == Estimate(HOUR, EstimateSource.QUEUE_DEFAULT)


def test_the_explain_words_name_the_source() -> None:
    alice = _pending("alice", "train")
    learned = Estimate(2 * HOUR + 10 * 60_000 + 59_999, EstimateSource.LEARNED_NAME, 12)
    assert describe(learned, alice) == "2h10m (p90 of 12 runs of alice/train in gpu)"
    by_queue = Estimate(45_000, EstimateSource.LEARNED_QUEUE, 7)
    assert describe(by_queue, alice) == "45s (p90 of 7 runs of alice in gpu)"
    default = Estimate(4 * HOUR, EstimateSource.QUEUE_DEFAULT)
    assert describe(default, alice) == "4h (the default time limit of queue gpu)"


def _running(state: ClusterState, started_ms: int, limit_ms: int = 0) -> Job:
    spec = dataclasses.replace(job(queue="gpu"), time_limit_ms=limit_ms)
    attempt = Attempt(1, 1, (), 29_500, started_ms - 5, [], started_ms)
    running = Job("job-000100", spec, "r", 100, 0, JobState.RUNNING, attempt=attempt)
    state.jobs[running.job_id] = running
    return running


def test_a_running_job_past_its_estimate_has_an_unknown_end_and_past_its_limit_not() -> None:
    state = _state(default_time_limit_ms=HOUR)
    running = _running(state, 1_000)
    state.last_time_ms = 1_000 + HOUR - 1
    assert estimated_end(state, running) == 1_000 + HOUR
    state.last_time_ms = 1_000 + HOUR
    assert estimated_end(state, running) is None  # it runs on; no reservation counts on it
    limited = _running(state, 1_000, limit_ms=HOUR)
    assert estimated_end(state, limited) == 1_000 + HOUR  # it is being stopped
    pending = _pending("alice", "train")
    assert estimated_end(state, pending) is None


# ------------------------------------------------------------------ the queue fields


def test_a_bad_default_time_limit_is_refused_naming_the_field_and_changes_nothing() -> None:
    cl = Cluster()
    before = dict(cl.state.queues)
    for bad in (-1, 366 * 24 * HOUR + 1):
        result = cl.do(c.SetQueue(Queue("gpu", default_time_limit_ms=bad), cl.now))
        assert result.code is c.ResultCode.INVALID
        assert "default_time_limit_ms" in result.message and "366 days" in result.message
        assert cl.state.queues == before
    assert cl.do(c.SetQueue(Queue("gpu", default_time_limit_ms=366 * 24 * HOUR), cl.now)).ok


def test_the_estimate_fields_need_format_15_and_survive_the_codec() -> None:
    state = ClusterState()
    assert state.format_floor < FORMAT
    queue = Queue("gpu", default_time_limit_ms=4 * HOUR, learned_estimates=True)
    for early in (queue, Queue("gpu", learned_estimates=True)):
        refused = apply(state, c.SetQueue(early, 1))
        assert refused.code is c.ResultCode.CONFLICT and "needs format 15" in refused.message
    assert "gpu" not in state.queues
    assert apply(state, c.RaiseFormat(FORMAT, (), 2)).ok
    command = c.SetQueue(queue, 3, "user:root")
    assert decode_command(encode_command(command)) == command
    assert apply(state, command).ok and state.queues["gpu"] == queue


# ------------------------------------------------------------------ the pass


def _busy_cluster(default_s: int = 0, learned: bool = False) -> tuple[Cluster, str]:
    """Two 8-GPU nodes: one held for 100 s, one half-held for 50 s; a big gang first in
    line reserves both from 100 s on. Queue ``gpu`` expects ``default_s`` of a job, and
    with ``learned`` what its history says: 5 runs of ``quick`` (20 s) and of ``slow``
    (15 min) first."""
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    queue = Queue("gpu", default_time_limit_ms=default_s * 1000, learned_estimates=learned)
    assert cl.do(c.SetQueue(queue, cl.now)).ok
    for name, run_s in (("quick", 20), ("slow", 900)) if learned else ():
        for _ in range(MIN_RUNS):
            done = cl.submit(job(name, gpu=1, queue="gpu"))
            cl.run_pass()
            cl.start_all(done)
            cl.now += run_s * 1000
            assert cl.exit_member(done, 0, 0).ok
    a = cl.submit(job("a", gpu=8, time_limit_s=100))
    b = cl.submit(job("b", gpu=4, time_limit_s=50))
    cl.run_pass()
    cl.start_all(a)
    cl.start_all(b)
    big = cl.submit(job("big", replicas=2, gpu=8, priority=10))
    return cl, big


def test_a_job_with_its_queues_default_backfills_and_one_without_does_not() -> None:
    cl, big = _busy_cluster(default_s=30)
    without = cl.submit(job("plain", gpu=4))  # queue default: no estimate
    estimated = cl.submit(job("short", gpu=4, queue="gpu"))  # 30 s, within the 100 s
    plan = cl.run_pass()
    assert plan.reservation is not None and plan.reservation.job_id == big
    assert plan.reservation.start_ms == cl.now + 100_000
    assert cl.state_of(estimated) is JobState.SCHEDULED
    assert cl.state_of(without) is JobState.PENDING
    assert cl.state.jobs[without].reason.code is ReasonCode.RESERVED_FOR_OTHER
    # The default is an estimate, never a limit: the backfilled job is not given one.
    assert cl.state.jobs[estimated].spec.time_limit_ms == 0


def test_a_default_longer_than_the_wait_does_not_backfill() -> None:
    cl, _ = _busy_cluster(default_s=500)
    estimated = cl.submit(job("long", gpu=4, queue="gpu"))
    cl.run_pass()
    assert cl.state_of(estimated) is JobState.PENDING


def test_a_running_job_with_a_queue_default_times_the_reservation_until_it_overruns() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=8))
    assert cl.do(c.SetQueue(Queue("gpu", default_time_limit_ms=200_000), cl.now)).ok
    held = cl.submit(job("held", gpu=8, queue="gpu"))
    cl.run_pass()
    cl.start_all(held)
    started = cl.now
    big = cl.submit(job("big", gpu=8, priority=10))
    plan = cl.run_pass()
    assert plan.reservation is not None and plan.reservation.job_id == big
    assert plan.reservation.start_ms == started + 200_000
    # Past its estimate (by the state's clock) it runs on and its end is unknown.
    cl.now = started + 200_000
    cl.do(c.SetQueue(Queue("other"), cl.now))  # any command moves the state's clock
    plan = cl.run_pass()
    assert plan.reservation is not None and plan.reservation.start_ms is None
    assert cl.state_of(held) is JobState.RUNNING


def test_learned_estimates_let_a_job_of_short_history_backfill() -> None:
    cl, big = _busy_cluster(learned=True)
    quick = cl.submit(job("quick", gpu=4, queue="gpu"))
    slow = cl.submit(job("slow", gpu=4, queue="gpu"))
    plan = cl.run_pass()
    assert plan.reservation is not None and plan.reservation.job_id == big
    assert cl.state_of(quick) is JobState.SCHEDULED
    assert cl.state_of(slow) is JobState.PENDING
    said = explain(cl.state, slow, cl.now, plan)
    assert said.endswith(f"\nbackfill estimate: 15m (p90 of {MIN_RUNS} runs of /slow in gpu)")


def test_explain_says_nothing_of_estimates_for_a_job_with_a_time_limit() -> None:
    cl, _ = _busy_cluster(default_s=500)
    limited = cl.submit(job("long", gpu=4, queue="gpu", time_limit_s=500))
    plain = cl.submit(job("long", gpu=4, queue="gpu"))
    plan = cl.run_pass()
    assert "estimate" not in explain(cl.state, limited, cl.now, plan)
    said = explain(cl.state, plain, cl.now, plan)
    assert said.endswith("backfill estimate: 8m (the default time limit of queue gpu)")


@pytest.mark.parametrize("learned", [False, True])
def test_the_queue_fields_default_to_no_estimate(learned: bool) -> None:
    queue = dataclasses.replace(Queue("q"), learned_estimates=learned)
    state = ClusterState()
    state.queues["q"] = queue
    assert estimate_of(state, _pending("alice", "train", queue="q")) is None
