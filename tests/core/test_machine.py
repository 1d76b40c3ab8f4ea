"""Lifecycle, fencing and failure handling of the state machine."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, Timeouts
from synapse_ha.core.machine import apply, retry_delay_ms
from synapse_ha.core.model import ClusterState, JobState, MemberState, NodeStatus, Resources
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.views import desired_members, due_time_limits
from tests.core.harness import Cluster, job, node


def bound_cluster(**spec: object) -> tuple[Cluster, str]:
    cl = Cluster()
    cl.add(node("n1", gpus=8, rack="r1"), node("n2", gpus=8, rack="r1"))
    j = cl.submit(job(replicas=2, gpu=8, **spec))  # type: ignore[arg-type]
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    return cl, j


def test_submission_is_idempotent_by_request_id() -> None:
    cl = Cluster()
    first = cl.do(c.SubmitJob(job(), "same", cl.now))
    again = cl.do(c.SubmitJob(job("other-name"), "same", cl.now + 5))
    assert first.ok and again.ok
    assert first.job_id == again.job_id
    assert len(cl.state.jobs) == 1


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (job(replicas=0), "replicas"),
        (job("Bad_Name"), "name"),
        (job(required="galaxy"), "topology.required"),
        (job(gpu=-1), "resources"),
    ],
)
def test_invalid_submission_is_an_error_value_and_changes_nothing(spec: object, field: str) -> None:
    state = ClusterState()
    result = apply(state, c.SubmitJob(spec, "r", 1))  # type: ignore[arg-type]
    assert result.code is c.ResultCode.INVALID
    assert field in result.message
    assert state.jobs == {} and state.request_ids == {}


def test_members_started_then_all_exit_zero_succeeds_and_frees_resources() -> None:
    cl, j = bound_cluster()
    cl.start_all(j)
    assert cl.state_of(j) is JobState.RUNNING
    cl.exit_member(j, 0, 0)
    assert cl.state_of(j) is JobState.RUNNING  # rank 1 still runs
    cl.exit_member(j, 1, 0)
    assert cl.state_of(j) is JobState.SUCCEEDED
    assert all(n.allocated == Resources() for n in cl.state.nodes.values())


def test_one_member_failing_fails_the_gang_and_retries_with_a_new_token() -> None:
    cl, j = bound_cluster(retries=2, backoff_s=10)
    cl.start_all(j)
    old_token = cl.state.jobs[j].fencing_token
    cl.exit_member(j, 1, 3, seed=11)
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert "rank 1 on n2 exited with code 3" in render(record.reason)
    assert "retry 1 of 2" in render(record.reason)
    assert record.retry_not_before_ms == cl.now + retry_delay_ms(record.spec, 1, 11, j)
    assert desired_members(cl.state, "n1") == []  # rank 0 must be stopped too
    # Not before the back-off ends.
    cl.run_pass()
    assert cl.state_of(j) is JobState.PENDING
    cl.now = record.retry_not_before_ms
    # Rank 0 of the failed attempt has not been confirmed stopped: no new attempt yet,
    # or it could overlap the old one.
    cl.run_pass()
    assert cl.state_of(j) is JobState.PENDING
    assert "waiting for 1 member(s) of attempt 1 to be confirmed stopped" in render(record.reason)
    stopped = c.MemberEvent(j, old_token, 0, c.MemberEventKind.EXITED, exit_code=143)
    assert cl.do(c.ReportMembers("n1", (stopped,), now_ms=cl.now)).accepted_events == 1
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    assert cl.state.jobs[j].fencing_token > old_token
    assert cl.state.jobs[j].attempt.number == 2  # type: ignore[union-attr]


def test_a_dead_node_confirms_its_members_of_a_failed_attempt_stopped() -> None:
    cl, j = bound_cluster(retries=1, backoff_s=0)
    cl.add(node("n3", gpus=8, rack="r1"))
    cl.start_all(j)
    cl.exit_member(j, 1, 1)  # rank 1 on n2 fails; rank 0 on n1 goes silent
    cl.run_pass()
    assert cl.state_of(j) is JobState.PENDING
    cl.do(c.MarkNodeDead("n1", "silent", now_ms=cl.now))
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    assert "n1" not in cl.nodes_of(j)


def test_retries_exhausted_fail_the_job() -> None:
    cl, j = bound_cluster(retries=0)
    cl.start_all(j)
    cl.exit_member(j, 0, 1)
    assert cl.state_of(j) is JobState.FAILED
    assert "0 retries used" in render(cl.state.jobs[j].reason)


def test_reports_with_a_stale_token_or_wrong_node_are_ignored() -> None:
    cl, j = bound_cluster(retries=1, backoff_s=0)
    cl.start_all(j)
    old = cl.state.jobs[j].fencing_token
    cl.exit_member(j, 0, 1)
    cl.exit_member(j, 1, 143)  # the worker stopped rank 1 and reports it
    cl.run_pass()
    new = cl.state.jobs[j].fencing_token
    assert new > old
    late = c.MemberEvent(j, old, 0, c.MemberEventKind.EXITED, exit_code=1)
    result = cl.do(c.ReportMembers("n1", (late,), now_ms=cl.now))
    assert result.stale_events == 1 and result.accepted_events == 0
    assert cl.state_of(j) is JobState.SCHEDULED
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    wrong_node = "n2" if attempt.members[0].node_id == "n1" else "n1"
    ev = c.MemberEvent(j, new, 0, c.MemberEventKind.STARTED)
    assert cl.do(c.ReportMembers(wrong_node, (ev,), now_ms=cl.now)).stale_events == 1
    assert attempt.member_status[0].state is MemberState.BOUND


def test_duplicate_reports_are_harmless() -> None:
    cl, j = bound_cluster()
    cl.start_all(j)
    cl.start_all(j)
    cl.exit_member(j, 0, 0)
    cl.exit_member(j, 0, 0)
    cl.exit_member(j, 1, 0)
    assert cl.state_of(j) is JobState.SUCCEEDED


def test_dead_node_requeues_its_gangs_and_they_are_replaced_elsewhere() -> None:
    cl, j = bound_cluster(retries=0)
    cl.add(node("n3", gpus=8, rack="r1"))
    cl.start_all(j)
    result = cl.do(c.MarkNodeDead("n1", "silent for 10s", jitter_seed=3, now_ms=cl.now))
    assert result.ok and result.stopped == (j,) and result.bound == ()
    assert cl.state.nodes["n1"].status is NodeStatus.DEAD
    assert cl.state_of(j) is JobState.PENDING  # no retries, yet requeued
    why = cl.state.jobs[j].reason
    assert why.code is ReasonCode.REQUEUED_NODE_DEAD
    assert why.cause is not None and why.cause.text("node") == "n1"
    assert "node n1 was declared dead" in render(why)
    assert (cl.state.jobs[j].requeues, cl.state.jobs[j].retries_used) == (1, 0)
    old = cl.state.jobs[j].attempt
    assert old is not None
    on_n2 = next(m.rank for m in old.members if m.node_id == "n2")
    cl.run_pass()
    assert cl.state_of(j) is JobState.PENDING  # the member on n2 is still being stopped
    stopped = c.MemberEvent(j, old.fencing_token, on_n2, c.MemberEventKind.EXITED, 143)
    cl.do(c.ReportMembers("n2", (stopped,), now_ms=cl.now))
    cl.run_pass()
    assert sorted(cl.nodes_of(j)) == ["n2", "n3"]
    # The node returns: it is ready and empty.
    cl.add(node("n1", gpus=8, rack="r1"))
    assert cl.state.nodes["n1"].status is NodeStatus.READY


def test_cancel_releases_resources_and_is_idempotent() -> None:
    cl, j = bound_cluster()
    assert cl.do(c.CancelJob(j, now_ms=cl.now)).ok
    assert cl.state_of(j) is JobState.CANCELLED
    assert cl.do(c.CancelJob(j, now_ms=cl.now)).ok
    assert desired_members(cl.state, "n1") == []
    assert cl.do(c.CancelJob("job-404")).code is c.ResultCode.NOT_FOUND


def test_time_limit_expiry_stops_the_job_without_retry() -> None:
    cl, j = bound_cluster(time_limit_s=60, retries=3)
    cl.start_all(j)
    assert due_time_limits(cl.state, cl.now + 59_999) == []
    early = c.ExpireTimeLimit(j, cl.state.jobs[j].fencing_token, cl.now + 1)
    assert cl.do(early).code is c.ResultCode.CONFLICT
    due = due_time_limits(cl.state, cl.now + 60_000)
    assert [d.job_id for d in due] == [j]
    assert cl.do(due[0]).ok
    assert cl.state_of(j) is JobState.FAILED
    assert "time limit" in render(cl.state.jobs[j].reason)


def test_desired_members_carry_the_rank_environment() -> None:
    cl = Cluster()
    cl.add(node("a", gpus=8), node("b", gpus=8))
    j = cl.submit(job(replicas=3, gpu=4))
    cl.run_pass()
    on_a = desired_members(cl.state, "a")
    on_b = desired_members(cl.state, "b")
    assert [m.rank for m in on_a] == [0, 1] and [m.rank for m in on_b] == [2]
    assert [m.local_rank for m in on_a] == [0, 1] and on_b[0].local_world_size == 1
    assert {m.world_size for m in on_a + on_b} == {3}
    addr_a = cl.state.nodes["a"].info.address
    assert on_b[0].master_addr == addr_a
    assert on_b[0].member_hosts[0] == addr_a
    assert set(on_a[0].gpus).isdisjoint(on_a[1].gpus)
    assert on_a[0].master_port == on_b[0].master_port
    assert on_a[0].fencing_token == cl.state.jobs[j].fencing_token


def test_finished_jobs_leave_the_state_after_the_retention_window() -> None:
    cl, j = bound_cluster()
    assert cl.do(c.CancelJob(j, now_ms=cl.now)).ok
    retention = cl.state.config.retention_ms
    assert cl.do(c.PurgeFinished(cl.now + retention - 1)).purged == ()
    assert cl.do(c.PurgeFinished(cl.now + retention)).purged == (j,)
    assert j not in cl.state.jobs and cl.state.request_ids == {}


def test_node_status_commands() -> None:
    cl = Cluster()
    cl.add(node("n1"))
    assert cl.do(c.SetNodeStatus("n1", NodeStatus.CORDONED, "maintenance")).ok
    assert cl.state.nodes["n1"].status is NodeStatus.CORDONED
    # Draining a node that holds nothing leaves it cordoned at once.
    assert cl.do(c.SetNodeStatus("n1", NodeStatus.DRAINING, "maintenance")).ok
    assert cl.state.nodes["n1"].status is NodeStatus.CORDONED
    assert cl.do(c.SetNodeStatus("n1", NodeStatus.DEAD)).code is c.ResultCode.INVALID
    assert cl.do(c.SetNodeStatus("nope", NodeStatus.READY)).code is c.ResultCode.NOT_FOUND
    cl.do(c.MarkNodeDead("n1"))
    assert cl.do(c.SetNodeStatus("n1", NodeStatus.READY)).code is c.ResultCode.CONFLICT


def test_register_refuses_a_capacity_below_what_is_bound() -> None:
    cl, _ = bound_cluster()
    smaller = node("n1", gpus=4, rack="r1")
    result = cl.do(c.RegisterNode(smaller, cl.now))
    assert result.code is c.ResultCode.CONFLICT
    assert cl.state.nodes["n1"].info.capacity.gpu == 8


def test_register_rejects_islands_that_do_not_cover_the_gpus() -> None:
    state = ClusterState()
    bad = node("x", gpus=4, islands=((0, 1), (1, 2)))
    result = apply(state, c.RegisterNode(bad))
    assert result.code is c.ResultCode.INVALID and "gpu_islands" in result.message
    assert state.nodes == {}


def test_configure_rejects_unsafe_timeouts() -> None:
    state = ClusterState()
    unsafe = ClusterConfig(timeouts=Timeouts(dead_timeout_ms=5_000))
    result = apply(state, c.Configure(unsafe))
    assert result.code is c.ResultCode.INVALID and "dead_timeout" in result.message
    assert state.config == ClusterConfig()


def test_time_never_runs_backwards() -> None:
    state = ClusterState()
    apply(state, c.Barrier(now_ms=5_000))
    apply(state, c.SubmitJob(job(), "r", now_ms=10))
    assert state.jobs["job-000001"].submitted_at_ms == 5_000


def test_bind_plan_with_unknown_pieces_is_rejected_not_raised() -> None:
    from synapse_ha.core.model import MemberPlacement

    cl = Cluster()
    cl.add(node("n1", gpus=2))
    j = cl.submit(job(replicas=1, gpu=1))
    bad = [
        c.GangPlacement("job-404", 0, ()),
        c.GangPlacement(j, 0, (MemberPlacement(0, "ghost", (0,)),)),
        c.GangPlacement(j, 0, (MemberPlacement(0, "n1", (5,)),)),
        c.GangPlacement(j, 0, (MemberPlacement(0, "n1", (0, 1)),)),
        c.GangPlacement(j, 0, (MemberPlacement(1, "n1", (0,)),)),
    ]
    result = cl.do(c.BindPlan(tuple(bad), now_ms=cl.now))
    assert result.bound == () and len(result.rejected) == 5
    assert cl.state_of(j) is JobState.PENDING


def test_gpus_double_booked_within_one_plan_are_rejected() -> None:
    from synapse_ha.core.model import MemberPlacement

    cl = Cluster()
    cl.add(node("n1", gpus=2))
    a = cl.submit(job("a", gpu=1))
    b = cl.submit(job("b", gpu=1))
    same = (MemberPlacement(0, "n1", (0,)),)
    result = cl.do(c.BindPlan((c.GangPlacement(a, 0, same), c.GangPlacement(b, 0, same))))
    assert result.bound == (a,)
    assert "GPU 0 on n1 is already in use" in result.rejected[0].message


def test_retry_delay_is_full_jitter_within_the_exponential_cap() -> None:
    spec = job(retries=10, backoff_s=10)
    delays = [retry_delay_ms(spec, n, seed, "job-1") for n in range(1, 8) for seed in range(20)]
    assert all(0 <= d <= 600_000 for d in delays)
    assert max(retry_delay_ms(spec, 1, s, "job-1") for s in range(50)) <= 10_000
    assert retry_delay_ms(spec, 3, 5, "job-1") == retry_delay_ms(spec, 3, 5, "job-1")
    assert len({retry_delay_ms(spec, 3, s, "job-1") for s in range(20)}) > 1


def test_live_attempts_on_one_master_node_get_distinct_ports_and_release_them() -> None:
    cl = Cluster()
    cl.add(node("a", gpus=8))
    first, second = cl.submit(job(gpu=1)), cl.submit(job(gpu=1))
    cl.run_pass()
    ports = [cl.state.jobs[j].attempt.master_port for j in (first, second)]  # type: ignore[union-attr]
    assert len(set(ports)) == 2
    assert cl.state.nodes["a"].master_ports == sorted(ports)
    assert cl.do(c.CancelJob(first, now_ms=cl.now)).ok
    assert cl.state.nodes["a"].master_ports == [ports[1]]
    third = cl.submit(job(gpu=1))
    cl.run_pass()
    assert cl.state.jobs[third].attempt.master_port != ports[1]  # type: ignore[union-attr]
    assert len(cl.state.nodes["a"].master_ports) == 2
