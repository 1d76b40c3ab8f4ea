"""Events and history records derived from applied commands."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.model import NodeStatus
from synapse_ha.core.snapshot import full_copy
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.history.tracker import INDEX_SHIFT, EventKind, Tracker
from tests.core.harness import job, node
from tests.history.observed import ObservedCluster


def run_to_success(cl: ObservedCluster, gpu: int = 4, replicas: int = 2) -> str:
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    j = cl.submit(job("train", replicas=replicas, gpu=gpu))
    cl.now += 100
    cl.run_pass()
    cl.now += 400
    cl.start_all(j)
    cl.now += 60_000
    for rank in range(replicas):
        cl.exit_member(j, rank, 0)
    return j


@pytest.mark.parametrize("everything", [False, True])
def test_a_gang_that_succeeds_is_submitted_bound_started_exited(everything: bool) -> None:
    cl = ObservedCluster(everything=everything)
    j = run_to_success(cl)
    assert cl.kinds(j) == ["submitted", "bound", "started", "exited"]
    indexes = [e.index for e in cl.events]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)
    bound = next(e for e in cl.events if e.kind is EventKind.BOUND)
    assert bound.attempt == 1 and bound.nodes and bound.job_name == "train"
    exited = next(e for e in cl.events if e.kind is EventKind.EXITED)
    assert exited.reason_code == "succeeded"
    # Node registrations are events too, before the job's.
    assert [str(e.kind) for e in cl.events[:2]] == ["node_registered"] * 2


def test_the_finished_job_and_its_attempt_are_recorded_once_with_gpu_time() -> None:
    cl = ObservedCluster()
    j = run_to_success(cl, gpu=4, replicas=2)
    assert [r.job_id for r in cl.jobs] == [j]
    (record,) = cl.jobs
    assert record.state == "SUCCEEDED" and record.attempts == 1 and record.queue == "default"
    (attempt,) = cl.attempts
    assert attempt.gpus == 8
    assert attempt.bound_at_ms == 1_100 and attempt.ended_at_ms == 61_500
    assert attempt.started_at_ms == 1_500
    assert attempt.gpu_ms == 8 * (61_500 - 1_100)
    assert attempt.applied_index == cl.state.applied_commands


def test_a_dead_node_requeues_the_gang_and_the_next_bind_is_attempt_two() -> None:
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8))
    j = cl.submit(job(gpu=8))
    cl.run_pass()
    cl.start_all(j)
    cl.now += 5_000
    assert cl.do(c.MarkNodeDead("n1", "silent", now_ms=cl.now)).ok
    cl.add(node("n2", gpus=8))
    cl.run_pass()
    assert cl.kinds(j) == ["submitted", "bound", "started", "requeued", "bound"]
    requeued = next(e for e in cl.events if e.kind is EventKind.REQUEUED)
    assert requeued.reason_code == "requeued_node_dead"
    assert [e.node_id for e in cl.events if e.kind is EventKind.NODE_DEAD] == ["n1"]
    assert [a.state for a in cl.attempts] == ["requeued"]
    assert cl.jobs == []  # not finished


def test_cancelling_a_pending_job_and_a_running_one() -> None:
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8))
    running = cl.submit(job("a", gpu=8))
    cl.run_pass()
    waiting = cl.submit(job("b", gpu=8))
    cl.do(c.CancelJob(waiting, now_ms=cl.now))
    cl.do(c.CancelJob(running, now_ms=cl.now))
    assert cl.kinds(waiting) == ["submitted", "cancelled"]
    assert cl.kinds(running) == ["submitted", "bound", "cancelled"]
    assert sorted(r.job_id for r in cl.jobs) == sorted([running, waiting])
    assert [a.job_id for a in cl.attempts] == [running]


def test_a_member_failure_without_retries_fails_the_job() -> None:
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8))
    j = cl.submit(job(gpu=1))
    cl.run_pass()
    cl.start_all(j)
    cl.exit_member(j, 0, 3)
    assert cl.kinds(j) == ["submitted", "bound", "started", "failed"]
    assert cl.jobs[0].state == "FAILED"


def test_node_status_and_leader_events() -> None:
    cl = ObservedCluster()
    cl.add(node("n1"), node("n2"))
    cl.do(c.Barrier("r2", now_ms=cl.now))
    cl.do(c.SetNodeStatus("n1", NodeStatus.CORDONED, "maintenance", now_ms=cl.now))
    cl.do(c.SetNodeStatus("n2", NodeStatus.DRAINING, now_ms=cl.now))  # empty: drained at once
    cl.do(c.SetNodeStatus("n1", NodeStatus.READY, now_ms=cl.now))
    kinds = [(str(e.kind), e.node_id or e.leader_id) for e in cl.events]
    assert kinds == [
        ("node_registered", "n1"),
        ("node_registered", "n2"),
        ("leader_changed", "r2"),
        ("node_cordoned", "n1"),
        ("node_draining", "n2"),
        ("node_drained", "n2"),
        ("node_ready", "n1"),
    ]


def test_event_indexes_come_from_the_applied_command_counter() -> None:
    cl = ObservedCluster()
    cl.add(node("n1"))
    (registered,) = cl.events
    assert registered.index == cl.state.applied_commands << INDEX_SHIFT


def test_a_tracker_rebuilt_from_a_snapshot_derives_the_same_events_as_one_that_ran() -> None:
    """A replica restored from a snapshot (or restarted) continues with the same events
    and indexes as a replica that applied every command itself."""
    whole = ObservedCluster()
    whole.add(node("n1", gpus=8), node("n2", gpus=8))
    a = whole.submit(job("a", gpu=8))
    whole.run_pass()
    b = whole.submit(job("b", gpu=8, replicas=2))
    snapshot = full_copy(whole.state)
    at = snapshot.applied_commands
    split = len(whole.log)
    whole.start_all(a)
    whole.exit_member(a, 0, 0)
    whole.run_pass()
    whole.start_all(b)
    whole.do(c.MarkNodeDead("n2", now_ms=whole.now))

    restored = ObservedCluster(state=snapshot)
    restored.tracker = Tracker()
    replayed = restored.tracker.reset(restored.state)
    assert [j.job_id for j in replayed.jobs] == []  # nothing had finished yet
    for command in whole.log[split:]:
        restored.do(command)
    tail = [e for e in whole.events if e.index > at << INDEX_SHIFT]
    assert restored.events == tail
    assert [str(e.kind) for e in restored.events if e.job_id == b] == [
        "bound",
        "started",
        "requeued",
    ]
    assert restored.jobs == [r for r in whole.jobs if r.applied_index > at]
    assert restored.jobs  # job a finished after the snapshot


def test_reset_re_records_what_the_restored_state_still_holds() -> None:
    cl = ObservedCluster()
    j = run_to_success(cl)
    again = Tracker().reset(full_copy(cl.state))
    assert [r.job_id for r in again.jobs] == [j]
    assert [(a.job_id, a.number, a.gpu_ms) for a in again.attempts] == [
        (a.job_id, a.number, a.gpu_ms) for a in cl.attempts
    ]


def test_purged_jobs_leave_no_event_and_are_forgotten() -> None:
    cl = ObservedCluster()
    j = run_to_success(cl)
    before = len(cl.events)
    cl.now += 10 * 3_600_000
    result = cl.do(c.PurgeFinished(now_ms=cl.now))
    assert result.purged == (j,)
    assert len(cl.events) == before
    assert j not in cl.tracker._jobs


def test_a_preempted_gang_streams_preempted_then_requeued_and_the_preemptor_binds() -> None:
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8))
    low = cl.submit(job("low", gpu=8))
    cl.run_pass()
    cl.start_all(low)
    cl.now += 60_000
    high = cl.submit(job("high", gpu=8, priority_class="high"))
    plan = cl.run_pass()
    commands = plan.preempt_commands(cl.now)
    assert len(commands) == 1
    assert cl.do(commands[0]).ok
    assert cl.kinds(low) == ["submitted", "bound", "started", "preempted"]
    preempted = next(e for e in cl.events if e.kind is EventKind.PREEMPTED)
    assert preempted.reason_code == "preempting" and preempted.attempt == 1
    cl.now += 1_000
    cl.exit_member(low, 0, 143)
    assert cl.kinds(low)[-1] == "requeued"
    requeued = [e for e in cl.events if e.kind is EventKind.REQUEUED][-1]
    assert requeued.reason_code == "requeued_preempted"
    cl.run_pass()
    assert cl.kinds(high) == ["submitted", "bound"]


@pytest.mark.parametrize("everything", [False, True])
def test_dependants_cancelled_down_a_chain_stream_their_cancellation(everything: bool) -> None:
    cl = ObservedCluster(everything=everything)
    cl.add(node("n1", gpus=8))
    first = cl.submit(job("a", gpu=8))
    second = cl.submit(
        dataclasses.replace(job("b", gpu=8), dependencies=Dependencies(after_ok=(first,)))
    )
    third = cl.submit(
        dataclasses.replace(job("c", gpu=8), dependencies=Dependencies(after_ok=(second,)))
    )
    cl.do(c.CancelJob(first, now_ms=cl.now))
    for waiting in (second, third):
        assert cl.kinds(waiting) == ["submitted", "cancelled"]
        (event,) = [e for e in cl.events if e.job_id == waiting and e.kind is EventKind.CANCELLED]
        assert event.reason_code == "dependency_never_satisfied"
    assert sorted(r.job_id for r in cl.jobs) == sorted([first, second, third])


def test_an_array_is_submitted_once_and_its_tasks_run_and_end_one_by_one() -> None:
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8))
    array_id = cl.submit(dataclasses.replace(job("sweep", gpu=8), array="0-2"))
    submitted = [e for e in cl.events if e.kind is EventKind.SUBMITTED]
    assert [(e.job_id, e.job_name) for e in submitted] == [(array_id, "sweep")]
    assert submitted[0].description == f"an array of 3 task(s): {array_id}_<index>"
    cl.run_pass()
    cl.do(c.CancelJob(array_id, now_ms=cl.now))
    assert cl.kinds(f"{array_id}_0") == ["bound", "cancelled"]
    assert cl.kinds(f"{array_id}_2") == ["cancelled"]
    assert sorted(r.job_id for r in cl.jobs) == [f"{array_id}_{i}" for i in range(3)]
