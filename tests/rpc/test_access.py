"""Authentication and authorization of every RPC, over a real in-process gRPC server on
127.0.0.1: the replica's servicers and the auth interceptor in front of a fake backend
that applies commands to a real state. Certificates are stood in for by a test peer
identity read from the metadata (the TLS layer supplies the real one)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core import commands as cmd
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import Role
from synapse_ha.core.machine import apply
from synapse_ha.leader.liveness import Liveness
from synapse_ha.rpc.auth import new_token
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.server import ReplicaAddress, ReplicaContext, build_server
from tests.rpc.authed import NOW, PEER_KEY, FakeBackend, Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


# ------------------------------------------------------------------ the refusal matrix


def credentials(replica: Replica, who: str) -> list[tuple[str, str]]:
    """Metadata for one caller: a token, a certificate's identity, or nothing."""
    if who == "nobody":
        return []
    if who == "garbage-token":
        return [("authorization", "Bearer not-a-token")]
    if who == "wrong-secret":
        token_id = access.split_token(replica.tokens["alice"])
        assert token_id is not None
        return [("authorization", f"Bearer syn_{token_id[0]}_guessed")]
    if who.startswith("cert:"):
        return [(PEER_KEY, who[len("cert:") :])]
    return [("authorization", f"Bearer {replica.tokens[who]}")]


Call = Callable[[Replica, list[tuple[str, str]]], Any]


def _heartbeat(node_id: str) -> Call:
    return lambda r, md: r.agent.Heartbeat(pb.HeartbeatRequest(node_id=node_id), metadata=md)


def _register(node_id: str) -> Call:
    def call(r: Replica, md: list[tuple[str, str]]) -> Any:
        request = pb.RegisterNodeRequest(
            node_id=node_id, address="10.0.0.9", capacity=pb.Resources(cpu_milli=1000)
        )
        return r.agent.RegisterNode(request, metadata=md)

    return call


def _on_job(method: str, owner: str) -> Call:
    def call(r: Replica, md: list[tuple[str, str]]) -> Any:
        job_id = r.jobs[owner]
        request: Any = {
            "CancelJob": pb.CancelJobRequest(job_id=job_id),
            "ExplainJob": pb.ExplainJobRequest(job_id=job_id),
            "GrantLogAccess": pb.GrantLogAccessRequest(job_id=job_id),
        }[method]
        return getattr(r.scheduler, method)(request, metadata=md)

    return call


def _simple(method: str, request: Any) -> Call:
    return lambda r, md: getattr(r.scheduler, method)(request, metadata=md)


SUBMIT = pb.SubmitJobRequest(
    spec=pb.JobSpec(
        name="x", replicas=1, resources=pb.Resources(cpu_milli=100), shell_command="true"
    )
)
CORDON = pb.NodeStatusRequest(node_id="n1")
OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
W1, W2 = "cert:spiffe://synapse/worker/n1", "cert:spiffe://synapse/worker/n2"
R1 = "cert:spiffe://synapse/replica/r2"

# caller, method (label), call, expected status
REFUSAL_MATRIX: list[tuple[str, str, Call, grpc.StatusCode]] = [
    ("nobody", "ListJobs", _simple("ListJobs", pb.ListJobsRequest()), UNAUTH),
    ("nobody", "Heartbeat(n1)", _heartbeat("n1"), UNAUTH),
    ("garbage-token", "ListJobs", _simple("ListJobs", pb.ListJobsRequest()), UNAUTH),
    ("wrong-secret", "ListJobs", _simple("ListJobs", pb.ListJobsRequest()), UNAUTH),
    ("expired", "ListJobs", _simple("ListJobs", pb.ListJobsRequest()), UNAUTH),
    ("revoked", "ListJobs", _simple("ListJobs", pb.ListJobsRequest()), UNAUTH),
    ("alice", "SubmitJob", _simple("SubmitJob", SUBMIT), OK),
    ("alice", "ListJobs", _simple("ListJobs", pb.ListJobsRequest()), OK),
    ("alice", "CancelJob(own)", _on_job("CancelJob", "alice"), OK),
    ("alice", "CancelJob(bob's)", _on_job("CancelJob", "bob"), DENIED),
    ("alice", "ExplainJob(bob's)", _on_job("ExplainJob", "bob"), DENIED),
    ("alice", "GrantLogAccess(bob's)", _on_job("GrantLogAccess", "bob"), DENIED),
    ("alice", "CordonNode", _simple("CordonNode", CORDON), DENIED),
    ("alice", "CreateToken", _simple("CreateToken", pb.CreateTokenRequest(user="x")), DENIED),
    ("alice", "ListTokens", _simple("ListTokens", pb.ListTokensRequest()), DENIED),
    ("alice", "GetReplicaState", _simple("GetReplicaState", pb.GetReplicaStateRequest()), DENIED),
    ("alice", "Heartbeat(n1)", _heartbeat("n1"), DENIED),
    ("operator", "CordonNode", _simple("CordonNode", CORDON), OK),
    ("operator", "CancelJob(bob's)", _on_job("CancelJob", "bob"), OK),
    ("operator", "CreateToken", _simple("CreateToken", pb.CreateTokenRequest(user="x")), DENIED),
    ("admin", "ListTokens", _simple("ListTokens", pb.ListTokensRequest()), OK),
    ("admin", "CreateToken", _simple("CreateToken", pb.CreateTokenRequest(user="x")), OK),
    (W1, "Heartbeat(n1)", _heartbeat("n1"), OK),
    (W1, "Heartbeat(n2)", _heartbeat("n2"), DENIED),
    (W1, "RegisterNode(n2)", _register("n2"), DENIED),
    (W1, "SubmitJob", _simple("SubmitJob", SUBMIT), DENIED),
    (W1, "ListJobs", _simple("ListJobs", pb.ListJobsRequest()), DENIED),
    (W2, "RegisterNode(n2)", _register("n2"), OK),
    (R1, "GetReplicaState", _simple("GetReplicaState", pb.GetReplicaStateRequest()), OK),
    (R1, "SubmitJob", _simple("SubmitJob", SUBMIT), DENIED),
    ("cert:spiffe://synapse/user/user/bob", "CancelJob(own)", _on_job("CancelJob", "bob"), OK),
]


@pytest.mark.parametrize(
    ("who", "method", "call", "expected"),
    REFUSAL_MATRIX,
    ids=[f"{who}-{method}" for who, method, _, _ in REFUSAL_MATRIX],
)
def test_refusal_matrix(
    replica: Replica, who: str, method: str, call: Call, expected: grpc.StatusCode
) -> None:
    try:
        call(replica, credentials(replica, who))
        got = OK
    except grpc.RpcError as exc:
        failure = failure_of(exc)
        got = failure.code
        if expected is not OK and got is expected:
            assert failure.reason is ErrorReason(expected.name), failure
            assert failure.metadata.get("method"), failure
    assert got is expected


# ------------------------------------------------------------------- what users see


def _as(replica: Replica, who: str) -> list[tuple[str, str]]:
    return credentials(replica, who)


def test_users_see_every_job_but_only_their_own_commands(replica: Replica) -> None:
    md = _as(replica, "alice")
    jobs = {j.owner: j for j in replica.scheduler.ListJobs(pb.ListJobsRequest(), metadata=md).jobs}
    assert set(jobs) == {"alice", "bob"}
    own, other = jobs["alice"], jobs["bob"]
    assert not own.redacted and own.spec.WhichOneof("command") is not None
    assert other.redacted and other.spec.WhichOneof("command") is None
    assert not other.spec.env and other.spec.name == "bob-job"
    one = replica.scheduler.GetJob(pb.GetJobRequest(job_id=replica.jobs["bob"]), metadata=md)
    assert one.job.redacted and one.job.spec.WhichOneof("command") is None
    seen_by_operator = replica.scheduler.GetJob(
        pb.GetJobRequest(job_id=replica.jobs["bob"]), metadata=_as(replica, "operator")
    )
    assert not seen_by_operator.job.redacted
    assert seen_by_operator.job.spec.WhichOneof("command") is not None


def test_submit_records_the_owner_and_cancel_records_who(
    replica: Replica, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="synapse_ha.audit")
    answer = replica.scheduler.SubmitJob(SUBMIT, metadata=_as(replica, "alice"))
    job_id = answer.job_id
    assert replica.backend.state.jobs[job_id].owner == "alice"
    replica.scheduler.CancelJob(
        pb.CancelJobRequest(job_id=job_id), metadata=_as(replica, "operator")
    )
    assert replica.backend.state.jobs[job_id].cancelled_by == "user:ops"
    shown = replica.scheduler.GetJob(
        pb.GetJobRequest(job_id=job_id), metadata=_as(replica, "alice")
    )
    assert (shown.job.owner, shown.job.cancelled_by) == ("alice", "user:ops")
    replica.scheduler.CordonNode(CORDON, metadata=_as(replica, "operator"))
    assert replica.backend.state.nodes["n1"].status_by == "user:ops"
    lines = [r.getMessage() for r in caplog.records if r.name == "synapse_ha.audit"]
    assert f"user:alice SubmitJob {job_id}" in lines
    assert f"user:ops CancelJob {job_id}" in lines
    assert "user:ops SetNodeStatus(cordoned) n1" in lines


def test_refusals_are_logged_and_counted(
    replica: Replica, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="synapse_ha.audit")
    for _ in range(2):
        with pytest.raises(grpc.RpcError):
            replica.scheduler.CordonNode(CORDON, metadata=_as(replica, "alice"))
    with pytest.raises(grpc.RpcError):
        _on_job("CancelJob", "bob")(replica, _as(replica, "alice"))
    counts = replica.auth.refusals()
    assert counts[("PERMISSION_DENIED", "CordonNode")] == 2
    assert counts[("PERMISSION_DENIED", "CancelJob")] == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("user:alice" in w and "CordonNode" in w for w in warnings)


# ------------------------------------------------------------------------- tokens


def test_admin_creates_lists_and_revokes_tokens(replica: Replica) -> None:
    admin = _as(replica, "admin")
    made = replica.scheduler.CreateToken(
        pb.CreateTokenRequest(user="erin", role="operator", queues=["train"], ttl_ms=60_000),
        metadata=admin,
    )
    assert made.token.startswith(f"syn_{made.token_id}_")
    assert made.expires_at_ms == replica.clock[0] + 60_000
    erin = [("authorization", f"Bearer {made.token}")]
    replica.scheduler.CordonNode(CORDON, metadata=erin)  # an operator's token works at once
    listed = replica.scheduler.ListTokens(pb.ListTokensRequest(), metadata=admin)
    by_id = {t.token_id: t for t in listed.tokens}
    assert (by_id[made.token_id].user, by_id[made.token_id].role) == ("erin", "operator")
    assert by_id[made.token_id].created_by == "user:root"
    secret = made.token.split("_", 2)[2]
    stored = replica.backend.state.tokens[made.token_id].secret_sha256
    raw = listed.SerializeToString()
    assert secret.encode() not in raw and stored.encode() not in raw
    assert secret not in replica.backend.state.tokens[made.token_id].__repr__()

    replica.scheduler.RevokeToken(pb.RevokeTokenRequest(token_id=made.token_id), metadata=admin)
    with pytest.raises(grpc.RpcError) as refused:
        replica.scheduler.CordonNode(CORDON, metadata=erin)
    assert failure_of(refused.value).reason is ErrorReason.UNAUTHENTICATED
    assert "revoked" in failure_of(refused.value).message
    with pytest.raises(grpc.RpcError) as unknown:
        replica.scheduler.RevokeToken(
            pb.RevokeTokenRequest(token_id="ffffffffffff"), metadata=admin
        )
    assert failure_of(unknown.value).reason is ErrorReason.TOKEN_NOT_FOUND


def test_a_token_is_refused_once_its_revocation_commits(replica: Replica) -> None:
    alice = _as(replica, "alice")
    replica.scheduler.ListJobs(pb.ListJobsRequest(), metadata=alice)
    parts = access.split_token(replica.tokens["alice"])
    assert parts is not None
    replica.backend.hold = True
    revoked = replica.backend.propose(cmd.RevokeToken(parts[0], NOW, "user:root"))
    replica.scheduler.ListJobs(pb.ListJobsRequest(), metadata=alice)  # proposed, not committed
    replica.backend.commit_pending()
    assert revoked.result(timeout=0).ok
    with pytest.raises(grpc.RpcError) as refused:
        replica.scheduler.ListJobs(pb.ListJobsRequest(), metadata=alice)
    assert failure_of(refused.value).code is grpc.StatusCode.UNAUTHENTICATED


def test_a_follower_sends_a_token_it_cannot_verify_to_the_leader(replica: Replica) -> None:
    """A replica behind the leader may not have applied a token the leader just made:
    it cannot tell such a token from a wrong one, so it answers with where the leader is
    (as for a write) instead of refusing. Final refusals stay refusals."""
    fresh, _ = new_token("erin", Role.USER, (), 0, NOW, "user:root")  # never applied here
    erin = [("authorization", f"Bearer {fresh}")]
    stale = pb.ListJobsRequest(allow_stale=True)
    with pytest.raises(grpc.RpcError) as leader_refuses:
        replica.scheduler.ListJobs(stale, metadata=erin)
    assert failure_of(leader_refuses.value).reason is ErrorReason.UNAUTHENTICATED

    # The same replica as a follower of r2.
    replica.ctx.serving = lambda: False
    replica.ctx.replicas = [
        ReplicaAddress("r1", "127.0.0.1:1", replica.address),
        ReplicaAddress("r2", "127.0.0.1:2", "10.9.9.9:7000"),
    ]
    leader = ["127.0.0.1:2"]
    replica.backend.is_leader = lambda: False  # type: ignore[method-assign]
    replica.backend.leader_address = lambda: leader[0]  # type: ignore[method-assign]
    assert replica.scheduler.ListJobs(stale, metadata=_as(replica, "alice")).jobs
    for who in (erin, _as(replica, "wrong-secret")):
        with pytest.raises(grpc.RpcError) as routed:
            replica.scheduler.ListJobs(stale, metadata=who)
        failure = failure_of(routed.value)
        assert failure.reason is ErrorReason.NOT_LEADER, failure
        assert failure.metadata["leader_address"] == "10.9.9.9:7000"
    for final in ("garbage-token", "revoked", "expired"):
        with pytest.raises(grpc.RpcError) as refused:
            replica.scheduler.ListJobs(stale, metadata=_as(replica, final))
        assert failure_of(refused.value).reason is ErrorReason.UNAUTHENTICATED, final
    leader[0] = ""
    with pytest.raises(grpc.RpcError) as leaderless:
        replica.scheduler.ListJobs(stale, metadata=erin)
    assert failure_of(leaderless.value).reason is ErrorReason.NO_LEADER


def test_a_token_expires_by_the_replica_clock(replica: Replica) -> None:
    made = replica.scheduler.CreateToken(
        pb.CreateTokenRequest(user="erin", ttl_ms=5_000), metadata=_as(replica, "admin")
    )
    erin = [("authorization", f"Bearer {made.token}")]
    replica.scheduler.ListJobs(pb.ListJobsRequest(), metadata=erin)
    replica.clock[0] += 5_000
    with pytest.raises(grpc.RpcError) as refused:
        replica.scheduler.ListJobs(pb.ListJobsRequest(), metadata=erin)
    assert "expired" in failure_of(refused.value).message


def test_create_token_refuses_bad_fields(replica: Replica) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        replica.scheduler.CreateToken(
            pb.CreateTokenRequest(user="erin", role="root"), metadata=_as(replica, "admin")
        )
    failure = failure_of(refused.value)
    assert failure.reason is ErrorReason.INVALID_FIELD and failure.field == "role"


# ----------------------------------------------------------------------- log grants


def test_log_grants_need_a_signer_and_name_the_members_node(replica: Replica) -> None:
    bound = apply(
        replica.backend.state,
        cmd.BindPlan(
            (cmd.GangPlacement(replica.jobs["alice"], 0, (cmd.MemberPlacement(0, "n2", (0,)),)),),
            now_ms=NOW,
        ),
    )
    assert bound.ok and bound.bound, bound
    request = pb.GrantLogAccessRequest(job_id=replica.jobs["alice"], rank=0)
    with pytest.raises(grpc.RpcError) as refused:
        replica.scheduler.GrantLogAccess(request, metadata=_as(replica, "alice"))
    assert failure_of(refused.value).reason is ErrorReason.NEEDS_TLS
    signed: list[tuple[str, str, str]] = []

    def signer(job_id: str, subject: str, node_id: str) -> tuple[str, int]:
        signed.append((job_id, subject, node_id))
        return "grant-text", 42

    replica.ctx.grant_signer = signer
    answer = replica.scheduler.GrantLogAccess(request, metadata=_as(replica, "alice"))
    assert (answer.grant, answer.node_id, answer.expires_at_ms) == ("grant-text", "n2", 42)
    assert answer.node_address == replica.backend.state.nodes["n2"].info.address
    assert signed == [(replica.jobs["alice"], "user:alice", "n2")]


# ------------------------------------------------------------------- client, insecure


def test_the_client_sends_its_token_on_every_call(replica: Replica) -> None:
    with ClusterClient([replica.address], token=replica.tokens["alice"], timeout_s=3) as client:
        assert {j.owner for j in client.list_jobs()} == {"alice", "bob"}
        with pytest.raises(grpc.RpcError) as refused:
            client.set_node_status("n1", "cordon")
        assert failure_of(refused.value).reason is ErrorReason.PERMISSION_DENIED
    with ClusterClient([replica.address], timeout_s=3) as anonymous:
        with pytest.raises(grpc.RpcError) as unauth:
            anonymous.list_jobs()
        assert failure_of(unauth.value).reason is ErrorReason.UNAUTHENTICATED


def test_insecure_mode_makes_every_caller_the_anonymous_admin() -> None:
    backend = FakeBackend()
    ctx = ReplicaContext(
        self_id="r1",
        replicas=[ReplicaAddress("r1", "127.0.0.1:1", "127.0.0.1:0")],
        backend=backend,
        liveness=Liveness(),
        serving=lambda: True,
        clock_ms=lambda: NOW,
    )
    server = build_server(ctx, "127.0.0.1:0", max_workers=2)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with ClusterClient([f"127.0.0.1:{port}"], timeout_s=3) as client:
            created = client.submit_job(SUBMIT.spec)
            assert backend.state.jobs[created.job_id].owner == "anonymous"
    finally:
        server.stop(grace=None)
