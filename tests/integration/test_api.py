"""The gRPC API against three real replicas: routing, jobs, nodes, status codes."""

from __future__ import annotations

import grpc
import pytest

from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.rpc.errors import LEADER_METADATA_KEY, Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from tests.integration.cluster import LocalCluster, job_spec, register_request, wait_for

pytestmark = pytest.mark.integration


def _call_error(fn: object, *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    return info.value


def test_one_leader_is_elected_and_every_replica_is_healthy(cluster: LocalCluster) -> None:
    leader = cluster.serving_leader()
    with cluster.client() as client:
        # A follower learns of a new leader from its first append: wait (bounded) for
        # every replica to know it rather than catching one in between.
        def all_healthy() -> pb.GetClusterStatusResponse | None:
            answer = client.cluster_status()
            return answer if all(r.healthy for r in answer.replicas) else None

        status = wait_for("every replica to know the leader", all_healthy)
    assert status.leader_id == leader.replica_id
    assert status.leader_address == leader.grpc
    roles = {r.replica_id: r.role for r in status.replicas}
    assert roles[leader.replica_id] == "leader"
    assert sorted(roles.values()) == ["follower", "follower", "leader"]
    assert all(r.healthy for r in status.replicas)
    assert len({r.term for r in status.replicas}) == 1
    assert {r.format_version for r in status.replicas} == {FORMAT}
    with cluster.client() as client:
        # Every replica reads this release's format: the leader's format gate opens.
        wait_for(
            "the cluster's format to rise to this release's",
            lambda: client.cluster_status().format_floor == FORMAT,
        )


def test_a_follower_redirects_writes_and_fresh_reads_to_the_leader(
    cluster: LocalCluster,
) -> None:
    leader = cluster.serving_leader()
    follower = cluster.followers(leader)[0]
    stub = cluster.stub(follower)
    error = _call_error(
        stub.SubmitJob, pb.SubmitJobRequest(spec=job_spec(), request_id="redirect-1"), timeout=5
    )
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    failure = failure_of(error)
    assert failure.reason is Reason.NOT_LEADER
    assert failure.metadata == {"leader_id": leader.replica_id, "leader_address": leader.grpc}
    assert (LEADER_METADATA_KEY, leader.grpc) in tuple(error.trailing_metadata() or ())

    error = _call_error(stub.ListJobs, pb.ListJobsRequest(), timeout=5)
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert failure_of(error).reason is Reason.NOT_LEADER

    with cluster.client() as client:
        submitted = client.submit_job(job_spec("redirected"), request_id="redirect-2")
    # The follower may answer a stale read, and says so, once it has applied the entry.
    answer = wait_for(
        "the follower to apply the submission",
        lambda: stub.GetJob(pb.GetJobRequest(job_id=submitted.job_id, allow_stale=True), timeout=2),
    )
    assert answer.stale
    assert answer.job.spec.name == "redirected"


def test_submit_get_list_cancel_and_idempotent_resubmission(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        first = client.submit_job(job_spec("lifecycle", replicas=4, gpu=8), request_id="life-1")
        again = client.submit_job(job_spec("lifecycle", replicas=4, gpu=8), request_id="life-1")
        assert first.created
        assert not again.created
        assert again.job_id == first.job_id

        job = client.get_job(first.job_id)
        assert job.spec.name == "lifecycle"
        assert job.spec.replicas == 4
        assert job.state == "PENDING"
        assert job.reason

        listed = client.list_jobs(name="lifecycle")
        assert [j.job_id for j in listed] == [first.job_id]
        assert client.list_jobs(states=["SUCCEEDED"], name="lifecycle") == []

        explained = client.explain_job(first.job_id)
        assert explained.state == "PENDING"
        assert explained.explanation

        cancelled = client.cancel_job(first.job_id, reason="changed my mind")
        assert cancelled.state == "CANCELLED"
        assert client.get_job(first.job_id).state == "CANCELLED"
        assert [j.job_id for j in client.list_jobs(states=["cancelled"], name="lifecycle")] == [
            first.job_id
        ]


def test_job_lists_come_in_pages(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        ids = [
            client.submit_job(job_spec("paged", gpu=1), request_id=f"paged-{i}").job_id
            for i in range(5)
        ]
        stub = cluster.stub(cluster.serving_leader())
        pages: list[list[str]] = []
        token = ""
        for _ in range(10):
            page = stub.ListJobs(
                pb.ListJobsRequest(name="paged", limit=2, page_token=token), timeout=5
            )
            pages.append([j.job_id for j in page.jobs])
            token = page.next_page_token
            if not token:
                break
        assert pages == [ids[0:2], ids[2:4], ids[4:5]]
        assert [j.job_id for j in client.list_jobs(name="paged")] == ids
        assert [j.job_id for j in client.list_jobs(name="paged", limit=3)] == ids[:3]
        for job_id in ids:  # leave the shared cluster's queue as it was
            client.cancel_job(job_id)


def test_a_gang_is_placed_and_its_members_reach_the_workers(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        for i in (1, 2):
            client.register_node(register_request(f"gang-node-{i}", f"10.0.0.{i}", gpu=8))
        submitted = client.submit_job(job_spec("gang", replicas=2, gpu=8), request_id="gang-1")
        job = wait_for(
            "the gang to be bound",
            lambda: (j := client.get_job(submitted.job_id)).state == "SCHEDULED" and j,
        )
        members = sorted((m.rank, m.node_id, tuple(m.gpus)) for m in job.attempt.members)
        assert [m[0] for m in members] == [0, 1]
        assert {m[1] for m in members} == {"gang-node-1", "gang-node-2"}
        assert all(m[2] == tuple(range(8)) for m in members)

        by_rank = {m.rank: m.node_id for m in job.attempt.members}
        desired = {}
        for node_id in ("gang-node-1", "gang-node-2"):
            reply = client.heartbeat(pb.HeartbeatRequest(node_id=node_id))
            assert reply.lease_ttl_ms > reply.heartbeat_interval_ms > 0
            (member,) = [d for d in reply.desired if d.job_id == submitted.job_id]
            desired[member.rank] = member
            assert by_rank[member.rank] == node_id
        master = desired[0]
        assert master.world_size == 2
        assert master.master_addr == "10.0.0." + by_rank[0][-1]
        assert list(master.member_hosts) == [
            "10.0.0." + by_rank[0][-1],
            "10.0.0." + by_rank[1][-1],
        ]
        assert master.fencing_token == job.attempt.fencing_token
        assert master.shell and list(master.command) == ["echo $RANK"]
        assert (master.local_rank, master.local_world_size) == (0, 1)

        token = job.attempt.fencing_token
        for rank, node_id in by_rank.items():
            started = pb.MemberReport(
                job_id=submitted.job_id,
                fencing_token=token,
                rank=rank,
                kind=pb.MemberReport.STARTED,
            )
            reply = client.heartbeat(pb.HeartbeatRequest(node_id=node_id, reports=[started]))
            assert reply.acked_reports == 1
        assert client.get_job(submitted.job_id).state == "RUNNING"
        for rank, node_id in by_rank.items():
            exited = pb.MemberReport(
                job_id=submitted.job_id,
                fencing_token=token,
                rank=rank,
                kind=pb.MemberReport.EXITED,
                exit_code=0,
            )
            client.heartbeat(pb.HeartbeatRequest(node_id=node_id, reports=[exited]))
        assert client.get_job(submitted.job_id).state == "SUCCEEDED"
        with pytest.raises(grpc.RpcError) as cancelled:
            client.cancel_job(submitted.job_id)
        assert failure_of(cancelled.value).reason is Reason.CONFLICT

        nodes = {n.node_id: n for n in client.list_nodes()}
        assert nodes["gang-node-1"].status == "ready"
        assert nodes["gang-node-1"].last_heartbeat_age_ms >= 0

        assert client.set_node_status("gang-node-1", "cordon") == "cordoned"
        assert client.set_node_status("gang-node-1", "uncordon") == "ready"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (pb.JobSpec(name="Bad_Name", replicas=1, shell_command="x"), "name"),
        (pb.JobSpec(name="ok", replicas=0, shell_command="x"), "replicas"),
        (pb.JobSpec(name="ok", replicas=10001, shell_command="x"), "replicas"),
        (pb.JobSpec(name="ok", replicas=1), "command"),
        (
            pb.JobSpec(name="ok", replicas=1, shell_command="x", resources=pb.Resources(gpu=-1)),
            "resources.gpu",
        ),
        (
            pb.JobSpec(name="ok", replicas=1, shell_command="x", topology_required="galaxy"),
            "topology.required",
        ),
        (
            pb.JobSpec(name="ok", replicas=1, shell_command="x", workdir="relative/dir"),
            "workdir",
        ),
    ],
)
def test_invalid_submissions_are_refused_naming_the_field(
    cluster: LocalCluster, spec: pb.JobSpec, field: str
) -> None:
    stub = cluster.stub(cluster.serving_leader())
    error = _call_error(stub.SubmitJob, pb.SubmitJobRequest(spec=spec), timeout=5)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    failure = failure_of(error)
    assert failure.reason is Reason.INVALID_FIELD
    assert failure.metadata["field"] == field
    assert [v.field for v in failure.violations] == [field]


def test_unknown_ids_and_bad_requests_get_the_right_codes(cluster: LocalCluster) -> None:
    leader = cluster.serving_leader()
    stub = cluster.stub(leader)
    agent = pb_grpc.NodeAgentServiceStub(cluster.channel(leader.grpc))
    not_found = grpc.StatusCode.NOT_FOUND
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (stub.GetJob, pb.GetJobRequest(job_id="job-999999"), not_found, Reason.JOB_NOT_FOUND),
        (stub.CancelJob, pb.CancelJobRequest(job_id="job-999999"), not_found, Reason.JOB_NOT_FOUND),
        (stub.ExplainJob, pb.ExplainJobRequest(job_id="nope"), not_found, Reason.JOB_NOT_FOUND),
        (stub.CordonNode, pb.NodeStatusRequest(node_id="ghost"), not_found, Reason.NODE_NOT_FOUND),
        (stub.GetJob, pb.GetJobRequest(), invalid, Reason.INVALID_FIELD),
        (stub.ListJobs, pb.ListJobsRequest(states=["BOGUS"]), invalid, Reason.INVALID_FIELD),
        (stub.ListJobs, pb.ListJobsRequest(page_token="x"), invalid, Reason.INVALID_FIELD),
        (agent.Heartbeat, pb.HeartbeatRequest(node_id="ghost"), not_found, Reason.NODE_NOT_FOUND),
        (
            agent.RegisterNode,
            pb.RegisterNodeRequest(node_id="n", address="h:99999"),
            invalid,
            Reason.INVALID_FIELD,
        ),
        (
            agent.RegisterNode,
            pb.RegisterNodeRequest(
                node_id="n",
                address="h:1",
                capacity=pb.Resources(gpu=2),
                gpu_islands=[pb.RegisterNodeRequest.GpuIsland(gpus=[0])],
            ),
            invalid,
            Reason.INVALID_FIELD,
        ),
    ]
    for method, request, code, reason in cases:
        error = _call_error(method, request, timeout=5)
        assert error.code() is code, (request, error.details())
        assert failure_of(error).reason is reason, (request, error.details())
    ghost = failure_of(_call_error(stub.CancelJob, pb.CancelJobRequest(job_id="job-999999")))
    assert ghost.metadata == {"job_id": "job-999999"}
    cordon = failure_of(_call_error(stub.CordonNode, pb.NodeStatusRequest(node_id="ghost")))
    assert cordon.metadata == {"node_id": "ghost"}


def test_a_missing_field_is_named_as_required(cluster: LocalCluster) -> None:
    stub = cluster.stub(cluster.serving_leader())
    error = _call_error(stub.CordonNode, pb.NodeStatusRequest(node_id=""), timeout=5)
    failure = failure_of(error)
    assert (failure.reason, failure.field) == (Reason.INVALID_FIELD, "node_id")
    assert failure.violations[0].code == "required"
