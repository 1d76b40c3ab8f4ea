"""The node's fault is never the job's (DESIGN §4): a member its node could not start is
a disruption, and the node learns it (skipped for that owner for a back-off, cordoned
after repeated failures)."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.health.fitness import Unfit
from synapse_ha.core.model import ClusterState, JobState, MemberPlacement, NodeStatus
from synapse_ha.core.reasons import ReasonCode, render, withheld
from tests.core.harness import Cluster, job, node

NO_ACCOUNT = "node n1 has no account for user alice (and no --user-map entry)"


def cluster(nodes: int = 2, **config: int) -> Cluster:
    cl = Cluster(state=ClusterState(config=ClusterConfig(**config)))  # type: ignore[arg-type]
    cl.add(*(node(f"n{i}", gpus=8) for i in range(1, nodes + 1)))
    return cl


def submit(cl: Cluster, owner: str, name: str = "train") -> str:
    result = cl.do(c.SubmitJob(job(name, gpu=8), f"{owner}-{name}-{cl.now}", cl.now, owner))
    assert result.ok, result.message
    return result.job_id


def cannot_run(cl: Cluster, job_id: str, detail: str = NO_ACCOUNT) -> c.Result:
    attempt = cl.state.jobs[job_id].attempt
    assert attempt is not None
    event = c.MemberEvent(
        job_id,
        attempt.fencing_token,
        0,
        c.MemberEventKind.EXITED,
        exit_code=126,
        detail=detail,
        cause=c.ExitCause.NODE_CANNOT_RUN,
    )
    return cl.do(c.ReportMembers(attempt.members[0].node_id, (event,), 3, cl.now))


def test_a_member_its_node_cannot_start_requeues_the_gang_elsewhere() -> None:
    cl = cluster()
    j = submit(cl, "alice")
    cl.run_pass()
    first = cl.nodes_of(j)[0]
    assert cannot_run(cl, j).ok
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert (record.retries_used, record.requeues) == (0, 1)
    assert record.reason.code is ReasonCode.REQUEUED_NODE_CANNOT_RUN
    assert "could not be started by its node" in render(record.reason)
    backoff = cl.state.config.unfit_backoff_ms
    assert cl.state.nodes[first].unfit == (Unfit("alice", NO_ACCOUNT, cl.now + backoff),)
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    assert cl.nodes_of(j) != [first]


def test_the_node_still_runs_other_owners_and_the_owner_again_after_the_back_off() -> None:
    cl = cluster(nodes=1)
    j = submit(cl, "alice")
    cl.run_pass()
    cannot_run(cl, j)
    cl.run_pass()
    assert cl.state_of(j) is JobState.PENDING  # the only node skips alice for now
    bob = submit(cl, "bob")
    cl.run_pass()
    assert cl.state_of(bob) is JobState.SCHEDULED
    assert cl.do(c.CancelJob(bob, now_ms=cl.now)).ok
    cl.now += cl.state.config.unfit_backoff_ms
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED


def test_a_plan_onto_a_node_unfit_for_the_owner_is_refused_at_apply() -> None:
    cl = cluster(nodes=1)
    j = submit(cl, "alice")
    cl.run_pass()
    cannot_run(cl, j)
    attempt = cl.state.jobs[j]
    placement = c.GangPlacement(
        j, attempt.attempts_made, (MemberPlacement(0, "n1", tuple(range(8))),)
    )
    result = cl.do(c.BindPlan((placement,), now_ms=cl.now))
    assert [r.code for r in result.rejected] == [c.RejectCode.NODE_UNFIT]
    assert "could not start members of alice" in result.rejected[0].message


def test_repeated_start_failures_cordon_the_node_and_a_program_run_resets_the_count() -> None:
    cl = cluster(nodes=1, cordon_after_start_failures=2)
    first = submit(cl, "alice", "a")
    cl.run_pass()
    cannot_run(cl, first)
    ok = submit(cl, "bob", "b")
    cl.run_pass()
    cl.start_all(ok)  # reported started: its pre-start check may still fail
    assert cl.state.nodes["n1"].start_failures == 1
    cl.exit_member(ok, 0, 1)  # its program ran here to its exit: the run of failures ends
    assert cl.state.nodes["n1"].start_failures == 0
    for owner in ("carol", "dave"):
        other = submit(cl, owner, owner)
        cl.run_pass()
        cannot_run(cl, other, "podman: no such file or directory")
    node = cl.state.nodes["n1"]
    assert node.status is NodeStatus.CORDONED
    assert node.status_reason == (
        "2 members in a row could not start here: podman: no such file or directory"
    )
    assert {u.owner for u in node.unfit} == {"alice", "carol", "dave"}


def test_the_detail_is_withheld_from_other_users() -> None:
    cl = cluster()
    j = submit(cl, "alice")
    cl.run_pass()
    cannot_run(cl, j)
    shown = render(withheld(cl.state.jobs[j].reason))
    assert "alice" not in shown and "[details withheld]" in shown


def test_members_reported_started_that_then_fail_their_node_still_cordon_it() -> None:
    cl = cluster(nodes=1, cordon_after_start_failures=2)
    for owner in ("alice", "bob"):
        j = submit(cl, owner, owner)
        cl.run_pass()
        cl.start_all(j)  # the supervisor started; the node's pre-start check then fails
        cannot_run(cl, j, "prestart check failed: nvidia-smi: no devices found")
    node = cl.state.nodes["n1"]
    assert node.status is NodeStatus.CORDONED
    assert "prestart check failed" in node.status_reason


def test_before_format_3_a_reported_start_ends_the_run_as_that_release_did() -> None:
    cl = cluster(nodes=1, cordon_after_start_failures=2)
    cl.state.format_floor = 2  # a cluster with a replica of the previous release
    for owner in ("alice", "bob"):
        j = submit(cl, owner, owner)
        cl.run_pass()
        cl.start_all(j)
        cannot_run(cl, j)
        assert cl.state.nodes["n1"].start_failures == 1
    assert cl.state.nodes["n1"].status is NodeStatus.READY
