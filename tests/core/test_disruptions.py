"""Disruptions requeue, failures retry (DESIGN §4); start timeouts; draining; Configure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import MAX_REQUEUES, ClusterConfig
from synapse_ha.core.model import AttemptState, JobState, NodeStatus
from synapse_ha.core.reasons import ReasonCode, reason, render
from synapse_ha.core.scheduler import explain
from synapse_ha.core.views import due_start_timeouts
from tests.core.harness import Cluster, job, node


def two_node_gang(retries: int = 0, **config: int) -> tuple[Cluster, str]:
    cl = Cluster(state=replace_config(**config)) if config else Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8), node("n3", gpus=8))
    j = cl.submit(job(replicas=2, gpu=8, retries=retries, backoff_s=30))
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    return cl, j


def replace_config(**changes: int):  # type: ignore[no-untyped-def]
    from synapse_ha.core.model import ClusterState

    return ClusterState(config=replace(ClusterConfig(), **changes))  # type: ignore[arg-type]


def confirm_stopped(cl: Cluster, j: str) -> None:
    """Every member of the job's ended attempt reports its exit (the worker stopped it)."""
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None and attempt.ended_at_ms is not None
    for m in attempt.members:
        if cl.state.nodes[m.node_id].status is NodeStatus.DEAD:
            continue
        ev = c.MemberEvent(j, attempt.fencing_token, m.rank, c.MemberEventKind.EXITED, 143)
        cl.do(c.ReportMembers(m.node_id, (ev,), now_ms=cl.now))


def fenced_exit(cl: Cluster, j: str, rank: int, cause: c.ExitCause) -> c.Result:
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    ev = c.MemberEvent(
        j, attempt.fencing_token, rank, c.MemberEventKind.EXITED, 137, "fenced: no lease", cause
    )
    return cl.do(c.ReportMembers(attempt.members[rank].node_id, (ev,), now_ms=cl.now))


def test_node_death_requeues_without_a_retry_or_back_off_and_keeps_the_fencing_rule() -> None:
    cl, j = two_node_gang(retries=0)
    cl.start_all(j)
    old = cl.state.jobs[j].attempt
    assert old is not None
    dead = old.members[0].node_id
    cl.do(c.MarkNodeDead(dead, "silent", jitter_seed=1, now_ms=cl.now))
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert record.reason.code is ReasonCode.REQUEUED_NODE_DEAD
    assert (record.requeues, record.retries_used) == (1, 0)
    assert record.retry_not_before_ms == cl.now  # no back-off
    assert old.state is AttemptState.REQUEUED
    assert old.outcome is not None and old.outcome.code is ReasonCode.NODE_DEAD
    assert "requeue 1 of 5, not counted against retries" in render(record.reason)
    # The member on the surviving node is not confirmed stopped: no new attempt yet.
    cl.run_pass()
    assert cl.state_of(j) is JobState.PENDING
    assert record.reason.code is ReasonCode.WAITING_STOP_CONFIRMED
    assert record.reason.cause is not None and record.reason.cause.code is ReasonCode.NODE_DEAD
    assert "(requeued after a disruption: node " in render(record.reason)
    confirm_stopped(cl, j)
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    assert cl.state.jobs[j].fencing_token > old.fencing_token
    assert dead not in cl.nodes_of(j)


@pytest.mark.parametrize(
    ("cause", "code"),
    [
        (c.ExitCause.FENCED, ReasonCode.REQUEUED_FENCED),
        (c.ExitCause.LOST, ReasonCode.REQUEUED_LOST),
    ],
)
def test_a_fenced_or_lost_member_requeues_the_gang(cause: c.ExitCause, code: ReasonCode) -> None:
    cl, j = two_node_gang(retries=0)
    cl.start_all(j)
    fenced_exit(cl, j, 1, cause)
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert record.reason.code is code
    assert (record.requeues, record.retries_used) == (1, 0)
    assert "exited" not in render(record.reason)


def test_a_members_own_non_zero_exit_is_a_failure_counted_against_retries() -> None:
    cl, j = two_node_gang(retries=1)
    cl.start_all(j)
    cl.exit_member(j, 0, 2)
    record = cl.state.jobs[j]
    assert record.reason.code is ReasonCode.RETRY_BACKOFF
    assert record.retry_not_before_ms >= cl.now
    assert (record.requeues, record.retries_used) == (0, 1)
    assert record.attempt is not None and record.attempt.state is AttemptState.FAILED
    cl.now = record.retry_not_before_ms
    confirm_stopped(cl, j)
    cl.run_pass()
    cl.start_all(j)
    cl.exit_member(j, 1, 2)
    assert cl.state_of(j) is JobState.FAILED
    assert record.reason.code is ReasonCode.FAILED_EXIT
    assert record.reason.cause is not None and record.reason.cause.num("exit_code") == 2
    assert "1 retries used" in render(record.reason)


def test_requeues_and_retries_are_counted_apart() -> None:
    cl, j = two_node_gang(retries=1)
    cl.start_all(j)
    fenced_exit(cl, j, 0, c.ExitCause.FENCED)  # requeue, not a retry
    confirm_stopped(cl, j)
    cl.run_pass()
    cl.start_all(j)
    cl.exit_member(j, 0, 1)  # the job's own failure: its one retry
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING and record.reason.code is ReasonCode.RETRY_BACKOFF
    assert (record.requeues, record.retries_used, record.attempts_made) == (1, 1, 2)


def test_a_job_past_max_requeues_fails_saying_so() -> None:
    cl, j = two_node_gang(retries=3, max_requeues=2)
    for _ in range(2):
        cl.start_all(j)
        fenced_exit(cl, j, 0, c.ExitCause.FENCED)
        assert cl.state_of(j) is JobState.PENDING
        confirm_stopped(cl, j)
        cl.run_pass()
        assert cl.state_of(j) is JobState.SCHEDULED
    cl.start_all(j)
    fenced_exit(cl, j, 0, c.ExitCause.FENCED)
    record = cl.state.jobs[j]
    assert record.state is JobState.FAILED
    assert record.reason.code is ReasonCode.FAILED_MAX_REQUEUES
    assert (record.reason.num("requeues"), record.reason.num("max_requeues")) == (2, 2)
    assert "max_requeues (2) reached" in render(record.reason)
    assert record.retries_used == 0  # the retries were never touched


def test_a_requeued_gang_keeps_its_place_in_line() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    first = cl.submit(job("first", replicas=2, gpu=8))
    cl.run_pass()
    later = cl.submit(job("later", replicas=2, gpu=8))
    cl.run_pass()
    assert cl.state_of(later) is JobState.PENDING
    cl.start_all(first)
    fenced_exit(cl, first, 0, c.ExitCause.FENCED)
    confirm_stopped(cl, first)
    cl.run_pass()
    # Both wait for the same two nodes; the requeued gang, submitted first, wins.
    assert cl.state_of(first) is JobState.SCHEDULED
    assert cl.state_of(later) is JobState.PENDING


def test_explain_says_a_requeued_job_was_disrupted() -> None:
    cl, j = two_node_gang()
    cl.start_all(j)
    cl.do(c.MarkNodeDead(cl.nodes_of(j)[0], "silent", now_ms=cl.now))
    confirm_stopped(cl, j)
    cl.run_pass()
    cl.start_all(j)
    assert "1 requeue(s) after disruptions" in explain(cl.state, j, cl.now)


# ------------------------------------------------------------------ start timeout


def test_members_not_running_after_the_start_timeout_fail_the_attempt() -> None:
    cl, j = two_node_gang(retries=0, start_timeout_ms=30_000)
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    ev = c.MemberEvent(j, attempt.fencing_token, 0, c.MemberEventKind.STARTED)
    cl.do(c.ReportMembers(attempt.members[0].node_id, (ev,), now_ms=cl.now))
    assert due_start_timeouts(cl.state, attempt.bound_at_ms + 29_999) == []
    due = due_start_timeouts(cl.state, attempt.bound_at_ms + 30_000)
    assert [d.job_id for d in due] == [j]
    why = due[0].reason
    assert why.code is ReasonCode.START_TIMEOUT
    assert (why.text("ranks"), why.text("nodes")) == ("1", attempt.members[1].node_id)
    early = replace(due[0], now_ms=attempt.bound_at_ms + 1)
    assert cl.do(early).code is c.ResultCode.CONFLICT
    assert cl.do(due[0]).ok
    record = cl.state.jobs[j]
    assert record.state is JobState.FAILED
    assert record.reason.code is ReasonCode.FAILED_START_TIMEOUT
    assert f"rank(s) 1 on {attempt.members[1].node_id} not running 30s" in render(record.reason)


def test_a_start_timeout_is_refused_once_every_member_runs() -> None:
    cl, j = two_node_gang()
    cl.start_all(j)
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    later = attempt.bound_at_ms + cl.state.config.start_timeout_ms
    assert due_start_timeouts(cl.state, later) == []
    late = reason(ReasonCode.START_TIMEOUT, ranks="0", nodes="n1", timeout_ms=1)
    command = c.FailAttempt(j, attempt.fencing_token, late, 0, later)
    assert cl.do(command).code is c.ResultCode.CONFLICT
    assert cl.state_of(j) is JobState.RUNNING


# ------------------------------------------------------------------------ draining


def test_a_draining_node_becomes_cordoned_when_its_last_attempt_ends() -> None:
    cl, j = two_node_gang()
    cl.start_all(j)
    n = cl.nodes_of(j)[0]
    assert cl.do(c.SetNodeStatus(n, NodeStatus.DRAINING, "upgrade", cl.now)).ok
    assert cl.state.nodes[n].status is NodeStatus.DRAINING
    cl.exit_member(j, 0, 0)
    assert cl.state.nodes[n].status is NodeStatus.DRAINING  # rank 1 still runs elsewhere
    cl.exit_member(j, 1, 0)
    assert cl.state_of(j) is JobState.SUCCEEDED
    assert cl.state.nodes[n].status is NodeStatus.CORDONED
    assert cl.state.nodes[n].status_reason == "upgrade"


def test_a_draining_node_waits_for_stopped_members_to_be_confirmed() -> None:
    cl, j = two_node_gang(retries=1)
    cl.start_all(j)
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    n0, n1 = attempt.members[0].node_id, attempt.members[1].node_id
    cl.do(c.SetNodeStatus(n0, NodeStatus.DRAINING, "", cl.now))
    cl.exit_member(j, 1, 9)  # the attempt ends; rank 0 on n0 is still being stopped
    assert cl.state.nodes[n0].status is NodeStatus.DRAINING
    ev = c.MemberEvent(j, attempt.fencing_token, 0, c.MemberEventKind.EXITED, 143)
    cl.do(c.ReportMembers(n0, (ev,), now_ms=cl.now))
    assert cl.state.nodes[n0].status is NodeStatus.CORDONED
    assert cl.state.nodes[n1].status is NodeStatus.READY


# ----------------------------------------------------------------------- configure


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"max_requeues": -1}, "max_requeues"),
        ({"max_requeues": 10_000}, "max_requeues"),
        ({"start_timeout_ms": 0}, "start_timeout_ms"),
        ({"start_timeout_ms": 10**12}, "start_timeout_ms"),
    ],
)
def test_configure_validates_requeues_and_start_timeout(
    changes: dict[str, int], named: str
) -> None:
    cl = Cluster()
    result = cl.do(c.Configure(replace(ClusterConfig(), **changes)))  # type: ignore[arg-type]
    assert result.code is c.ResultCode.INVALID and named in result.message
    assert cl.state.config.max_requeues == MAX_REQUEUES


def test_configure_refuses_to_orphan_a_topology_level_in_use() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=8))
    j = cl.submit(job(replicas=2, gpu=8, required="block", wait_for_nodes=True))
    without_block = replace(ClusterConfig(), topology_levels=("zone", "rack"))
    result = cl.do(c.Configure(without_block))
    assert result.code is c.ResultCode.CONFLICT
    assert "'block'" in result.message and j in result.message
    assert result.details == (("block", j),)
    assert cl.state.config.topology_levels == ClusterConfig().topology_levels
    # Once the job is gone, the level may go too.
    cl.do(c.CancelJob(j, now_ms=cl.now))
    assert cl.do(c.Configure(without_block)).ok
    assert cl.state.config.topology_levels == ("zone", "rack")
