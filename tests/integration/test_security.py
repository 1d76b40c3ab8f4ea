"""Refusals against real processes with real TLS (DESIGN §8): three replicas and their
workers, every one started with its own certificate of the cluster CA, called by
certificates and tokens of every kind.

The refusal matrix below (:data:`MATRIX`) is both the documentation and the expectation of
:func:`test_refusal_matrix`: each cell is what one caller gets from one method of the
leader. The callers:

=========  ==============================================================================
admin      the admin user's certificate (``spiffe://synapse/user/admin/admin``)
operator   a bearer token of role operator (created by the admin over CreateToken)
alice      a bearer token of role user; alice owns the jobs the job methods target
bob        a bearer token of role user; another user
worker     a worker certificate (``spiffe://synapse/worker/w-matrix``); node methods
           name its own node
replica    a replica certificate (``spiffe://synapse/replica/r1``)
client     the transport-only client certificate with no token
revoked    a token the admin created and then revoked
forged     a well-formed token the cluster never issued
=========  ==============================================================================

Codes: ``OK``; ``UNAUTH`` (UNAUTHENTICATED, reason UNAUTHENTICATED); ``DENIED``
(PERMISSION_DENIED, reason PERMISSION_DENIED); ``NOTFOUND`` (NOT_FOUND: the call passed
the access check and names a node, token or queue that does not exist: the node methods
name ``no-such-node``, RevokeToken an unknown token id, DeleteQueue ``no-such-queue``).
``CONFLICT`` (FAILED_PRECONDITION, reason CONFLICT: the call passed the access check and
RequeueJob's job, pending, holds no nodes). The job methods target a job of alice's
(CancelJob and RequeueJob a fresh pending one per call). Token
holders connect with the transport-only client certificate, as ``synctl`` does.

The worker's log service (ReadLog of alice's finished member on worker ``w1``), as
:func:`test_reading_a_log_on_the_worker_needs_a_grant_for_that_job` exercises it:

==========================================  ==================
caller                                      ReadLog
==========================================  ==================
transport-only certificate, no grant        UNAUTHENTICATED
admin certificate, no grant                 PERMISSION_DENIED
bob's grant (for bob's job)                 PERMISSION_DENIED
alice's grant with a tampered signature     UNAUTHENTICATED
alice's grant (GrantLogAccess)              OK, her output
bob's grant, reading bob's job              OK, his output
a replica certificate, no grant             OK, her output
==========================================  ==================

The transport (a GetClusterStatus to the leader's TLS port): a plaintext channel, TLS
without a client certificate, a client certificate of another CA (also with a valid
token), and an expired client certificate of the cluster's CA all end UNAVAILABLE at the
handshake; the same channels with a current certificate of the cluster's CA are
answered.

Besides the matrix, the focused tests check: a worker registers and heartbeats as its own
node only (PERMISSION_DENIED as ``w1`` or an unregistered node, and for SubmitJob,
CordonNode, CreateToken); bob sees alice's jobs redacted (no command, no environment) in
GetJob and ListJobs, and cannot cancel, explain or get a log grant for them while alice
can; a user token cannot cordon, drain, create or revoke tokens, an operator token can
cordon; a revoked token is refused (UNAUTHENTICATED) by the leader as soon as
RevokeToken answers and by each follower, stale reads included, once it has applied the
revocation; and a member of a worker started with ``--run-as owner`` runs with the uid of
a temporary local account its job's owner is named after (as root only).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from synapse_ha.core.identity.access import Role, user
from synapse_ha.core.model import NodeStatus
from synapse_ha.local.process import Replica, Worker
from synapse_ha.rpc import states
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.pki import issue
from synapse_ha.security.tls import TlsFiles, Transport
from tests.integration.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

# method           admin    operator alice    bob      worker   replica  client   revoked  forged
MATRIX = """
SubmitJob        OK       OK       OK       OK       DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
SubmitJobs       OK       OK       OK       OK       DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
GetJob           OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
ListJobs         OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
GetArray         OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
CancelJob        OK       OK       OK       DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
RequeueJob       CONFLICT CONFLICT CONFLICT DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
ExplainJob       OK       OK       OK       DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
GrantLogAccess   OK       OK       OK       DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
ListNodes        OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
CordonNode       NOTFOUND NOTFOUND DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
UncordonNode     NOTFOUND NOTFOUND DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
DrainNode        NOTFOUND NOTFOUND DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
RepairGpus       NOTFOUND NOTFOUND DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
GetClusterStatus OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
GetReplicaState  OK       DENIED   DENIED   DENIED   DENIED   OK       UNAUTH   UNAUTH   UNAUTH
CreateToken      OK       DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
ListTokens       OK       DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
RevokeToken      NOTFOUND DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
RegisterNode     OK       DENIED   DENIED   DENIED   OK       DENIED   UNAUTH   UNAUTH   UNAUTH
Heartbeat        OK       DENIED   DENIED   DENIED   OK       DENIED   UNAUTH   UNAUTH   UNAUTH
RelayHeartbeats  OK       DENIED   DENIED   DENIED   DENIED   OK       UNAUTH   UNAUTH   UNAUTH
AddReplica       EXISTS   DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
RemoveReplica    NOTFOUND DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
SaveSnapshot     OK       DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
ListHistory      OK       OK       OK       OK       DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
GetUsage         OK       OK       OK       OK       DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
WatchEvents      OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
ListQueues       OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
SetQueue         OK       DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
DeleteQueue      NOTFOUND DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
SetCohort        OK       DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
DeleteCohort     NOTFOUND DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
GetLimits        OK       OK       OK       OK       DENIED   OK       UNAUTH   UNAUTH   UNAUTH
SetLimits        OK       DENIED   DENIED   DENIED   DENIED   DENIED   UNAUTH   UNAUTH   UNAUTH
"""

CALLERS = ("admin", "operator", "alice", "bob", "worker", "replica", "client", "revoked", "forged")
CODES: dict[str, tuple[grpc.StatusCode, set[Reason]]] = {
    "OK": (grpc.StatusCode.OK, set()),
    "UNAUTH": (grpc.StatusCode.UNAUTHENTICATED, {Reason.UNAUTHENTICATED}),
    "DENIED": (grpc.StatusCode.PERMISSION_DENIED, {Reason.PERMISSION_DENIED}),
    # Past the access check, refused by the job's state (RequeueJob of a pending job).
    "CONFLICT": (grpc.StatusCode.FAILED_PRECONDITION, {Reason.CONFLICT}),
    "NOTFOUND": (
        grpc.StatusCode.NOT_FOUND,
        {
            Reason.NODE_NOT_FOUND,
            Reason.TOKEN_NOT_FOUND,
            Reason.REPLICA_NOT_FOUND,
            Reason.QUEUE_NOT_FOUND,
            Reason.COHORT_NOT_FOUND,
        },
    ),
    "EXISTS": (grpc.StatusCode.ALREADY_EXISTS, {Reason.REPLICA_EXISTS}),
}
MATRIX_NODE = "w-matrix"  # the node the worker certificate of the matrix names
NO_SUCH_NODE = "no-such-node"
NO_SUCH_QUEUE = "no-such-queue"
TIMEOUT_S = 5.0


def _matrix_cases() -> list[tuple[str, str, str]]:
    cases = []
    for line in MATRIX.strip().splitlines():
        method, *cells = line.split()
        assert len(cells) == len(CALLERS), line
        cases.extend((method, who, cell) for who, cell in zip(CALLERS, cells, strict=True))
    return cases


# ------------------------------------------------------------------------ callers


@dataclass
class Caller:
    """Someone calling over gRPC: a TLS transport (its client certificate) and maybe a
    bearer token. Channels are kept per address and closed by :meth:`close`."""

    name: str
    transport: Transport
    token: str | None = None
    _channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def metadata(self, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        bearer = (("authorization", f"Bearer {self.token}"),) if self.token else ()
        return (*bearer, *extra)

    def channel(self, address: str, worker: str | None = None) -> grpc.Channel:
        """A channel to the replica, or with ``worker`` that node's worker, at ``address``."""
        key = f"{worker or ''}@{address}"
        if key not in self._channels:
            self._channels[key] = self.transport.channel(address, worker=worker)
        return self._channels[key]

    def scheduler(self, address: str) -> pb_grpc.SchedulerServiceStub:
        return pb_grpc.SchedulerServiceStub(self.channel(address))  # type: ignore[no-untyped-call]

    def agent(self, address: str) -> pb_grpc.NodeAgentServiceStub:
        return pb_grpc.NodeAgentServiceStub(self.channel(address))  # type: ignore[no-untyped-call]

    def worker(self, node_id: str, address: str) -> wpb_grpc.WorkerServiceStub:
        channel = self.channel(address, node_id)
        return wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


def outcome(call: Callable[[], Any]) -> tuple[grpc.StatusCode, Reason | None, Any]:
    """(code, reason, answer) of one call: OK with the answer, or the failure's code and
    reason."""
    try:
        return grpc.StatusCode.OK, None, call()
    except grpc.RpcError as exc:
        failure = failure_of(exc)
        return failure.code, failure.reason, failure.message


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, Reason]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    failure = failure_of(info.value)
    return failure.code, failure.reason


UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


def log_refusal(call: Callable[[], Any]) -> grpc.StatusCode:
    """The status code a refused call to a worker's log service ends with."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    code: grpc.StatusCode = info.value.code()
    return code


def read_log(stub: wpb_grpc.WorkerServiceStub, job_id: str, grant: str | None = None) -> bytes:
    metadata = ((GRANT_METADATA_KEY, grant),) if grant is not None else ()
    chunks = stub.ReadLog(
        wpb.ReadLogRequest(job_id=job_id, rank=0), metadata=metadata, timeout=TIMEOUT_S
    )
    return b"".join(chunk.data for chunk in chunks)


def small_job(
    name: str, command: str, gpu: int = 0, env: dict[str, str] | None = None
) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=gpu),
        shell_command=command,
        env=[pb.EnvVar(name=k, value=v) for k, v in (env or {}).items()],
    )


def pending_job(name: str) -> pb.JobSpec:
    """A job no node of this cluster can hold (no node has 8 GPUs), submitted to wait for
    nodes that will join: it stays pending."""
    spec = small_job(name, "true", gpu=8)
    spec.wait_for_nodes = True
    return spec


def tiny_node(node_id: str) -> pb.RegisterNodeRequest:
    """A node nothing fits on, so registering it never draws a member to it."""
    return pb.RegisterNodeRequest(
        node_id=node_id,
        address="127.0.0.1:9",
        capacity=pb.Resources(cpu_milli=1, memory_mib=1, gpu=0),
    )


# -------------------------------------------------------------------------- world


@dataclass
class World:
    """One secure cluster for the module: its callers, a worker and two finished jobs."""

    cluster: LocalCluster
    credentials: ClusterCredentials
    callers: dict[str, Caller]
    tokens: dict[str, pb.CreateTokenResponse]
    worker: Worker | None = None  # w1, which runs alice's and bob's jobs
    alice_job: str = ""  # finished on w1; its output is ALICE_OUTPUT
    bob_job: str = ""

    @property
    def admin(self) -> Caller:
        return self.callers["admin"]

    def leader(self) -> Replica:
        return self.cluster.serving_leader()

    def caller(self, name: str, transport: Transport, token: str | None = None) -> Caller:
        """A caller of this test's own, closed with the world."""
        made = Caller(name, transport, token)
        self.callers[f"{name}#{len(self.callers)}"] = made
        return made

    def create_token(self, name: str, role: Role = Role.USER) -> pb.CreateTokenResponse:
        stub = self.admin.scheduler(self.leader().grpc)
        return stub.CreateToken(pb.CreateTokenRequest(user=name, role=str(role)), timeout=TIMEOUT_S)

    def submit(self, who: str, spec: pb.JobSpec) -> str:
        caller = self.callers[who]
        answer = caller.scheduler(self.leader().grpc).SubmitJob(
            pb.SubmitJobRequest(spec=spec, request_id=f"t-{secrets.token_hex(8)}"),
            metadata=caller.metadata(),
            timeout=TIMEOUT_S,
        )
        job_id: str = answer.job_id
        return job_id

    def job(self, job_id: str) -> pb.Job:
        answer = self.admin.scheduler(self.leader().grpc).GetJob(
            pb.GetJobRequest(job_id=job_id), timeout=TIMEOUT_S
        )
        job: pb.Job = answer.job
        return job

    def wait_finished(self, job_id: str, timeout_s: float = 30.0) -> pb.Job:
        return wait_for(
            f"job {job_id} to finish",
            lambda: (j := self.job(job_id)).state in ("SUCCEEDED", "FAILED", "CANCELLED") and j,
            timeout_s,
        )

    def cancel_quietly(self, job_id: str) -> None:
        outcome(
            lambda: self.admin.scheduler(self.leader().grpc).CancelJob(
                pb.CancelJobRequest(job_id=job_id), timeout=TIMEOUT_S
            )
        )

    def node(self, node_id: str) -> pb.Node | None:
        nodes = self.admin.scheduler(self.leader().grpc).ListNodes(
            pb.ListNodesRequest(), timeout=TIMEOUT_S
        )
        return next((n for n in nodes.nodes if n.node_id == node_id), None)

    def start_worker(self, node_id: str, data_dir: Path, *extra: str) -> Worker:
        launcher = self.cluster.launcher
        worker = launcher.worker(
            self.cluster.grpc_addresses,
            node_id,
            data_dir,
            extra=["--no-cgroups", "--stop-grace", "1s", "--fence-grace", "200ms", *extra],
        )
        launcher.start(worker)
        wait_for(
            f"worker {node_id} to register",
            lambda: (n := self.node(node_id)) is not None and n.status == "ready",
            20.0,
        )
        return worker


ALICE_OUTPUT = "alice-was-here"
ALICE_SECRET = "alice-secret-value"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("secure")
    cluster = LocalCluster(root)
    callers: dict[str, Caller] = {}
    try:
        cluster.start()
        leader = cluster.serving_leader()
        credentials = cluster.credentials
        assert credentials is not None, "the test cluster must run with TLS"
        client_tls = Transport(credentials.client_tls())
        callers["admin"] = Caller("admin", Transport(credentials.admin_tls()))
        stub = callers["admin"].scheduler(leader.grpc)
        tokens = {
            name: stub.CreateToken(pb.CreateTokenRequest(user=name, role=role), timeout=TIMEOUT_S)
            for name, role in (
                ("alice", "user"),
                ("bob", "user"),
                ("olga", "operator"),
                ("rex", "user"),
            )
        }
        stub.RevokeToken(pb.RevokeTokenRequest(token_id=tokens["rex"].token_id), timeout=TIMEOUT_S)
        callers["operator"] = Caller("operator", client_tls, tokens["olga"].token)
        callers["alice"] = Caller("alice", client_tls, tokens["alice"].token)
        callers["bob"] = Caller("bob", client_tls, tokens["bob"].token)
        callers["worker"] = Caller("worker", Transport(credentials.worker_tls(MATRIX_NODE)))
        callers["replica"] = Caller("replica", Transport(credentials.replica_tls("r1")))
        callers["client"] = Caller("client", client_tls)
        callers["revoked"] = Caller("revoked", client_tls, tokens["rex"].token)
        forged = f"syn_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
        callers["forged"] = Caller("forged", client_tls, forged)

        world = World(cluster, credentials, callers, tokens)
        world.worker = world.start_worker("w1", root / "w1", "--mock-gpus", "0")
        world.alice_job = world.submit(
            "alice",
            small_job("alice-logs", f"echo {ALICE_OUTPUT}", env={"ALICE_SECRET": ALICE_SECRET}),
        )
        world.bob_job = world.submit("bob", small_job("bob-logs", "echo bob-was-here"))
        for job_id in (world.alice_job, world.bob_job):
            assert world.wait_finished(job_id).state == "SUCCEEDED", cluster.logs()
        yield world
    finally:
        for caller in callers.values():
            caller.close()
        cluster.close()


# ------------------------------------------------------------------ the matrix


def _matrix_call(world: World, method: str, who: str, cleanup: list[str]) -> Callable[[], Any]:
    """The call ``who`` makes to ``method`` on the leader; jobs it creates go to
    ``cleanup``."""
    caller = world.callers[who]
    leader = world.leader().grpc
    stub = caller.scheduler(leader)
    agent = caller.agent(leader)
    md = caller.metadata()
    kw: dict[str, Any] = {"metadata": md, "timeout": TIMEOUT_S}
    alice = world.alice_job
    if method == "SubmitJob":

        def submit() -> Any:
            answer = stub.SubmitJob(
                pb.SubmitJobRequest(spec=pending_job("matrix"), request_id=secrets.token_hex(8)),
                **kw,
            )
            cleanup.append(answer.job_id)
            return answer

        return submit
    if method == "SubmitJobs":

        def submit_many() -> Any:
            item = pb.SubmitJobRequest(
                spec=pending_job("matrix-many"), request_id=secrets.token_hex(8)
            )
            answer = stub.SubmitJobs(pb.SubmitJobsRequest(jobs=[item]), **kw)
            cleanup.extend(a.job_id for a in answer.jobs)
            return answer

        return submit_many
    if method == "CancelJob":
        target = world.submit("alice", pending_job("matrix-target"))
        cleanup.append(target)
        return lambda: stub.CancelJob(pb.CancelJobRequest(job_id=target), **kw)
    if method == "RequeueJob":  # a pending job holds no nodes: refused past the access check
        target = world.submit("alice", pending_job("matrix-requeue"))
        cleanup.append(target)
        return lambda: stub.RequeueJob(pb.RequeueJobRequest(job_id=target), **kw)
    if method == "GetArray":
        spec = pending_job("matrix-array")
        spec.array = "0-1"
        array = world.submit("alice", spec)
        cleanup.append(array)
        return lambda: stub.GetArray(pb.GetArrayRequest(array_id=array), **kw)
    if method == "Heartbeat":
        world.admin.agent(leader).RegisterNode(tiny_node(MATRIX_NODE), timeout=TIMEOUT_S)
        return lambda: agent.Heartbeat(pb.HeartbeatRequest(node_id=MATRIX_NODE), **kw)
    calls: dict[str, Callable[[], Any]] = {
        "GetJob": lambda: stub.GetJob(pb.GetJobRequest(job_id=alice), **kw),
        # As replica r1 (the replica caller's certificate): relaying is off here, so the
        # leader answers that, changing nothing.
        "RelayHeartbeats": lambda: agent.RelayHeartbeats(
            pb.RelayHeartbeatsRequest(replica_id="r1"), **kw
        ),
        "ListJobs": lambda: stub.ListJobs(pb.ListJobsRequest(), **kw),
        "ExplainJob": lambda: stub.ExplainJob(pb.ExplainJobRequest(job_id=alice), **kw),
        "GrantLogAccess": lambda: stub.GrantLogAccess(
            pb.GrantLogAccessRequest(job_id=alice, rank=0), **kw
        ),
        "ListNodes": lambda: stub.ListNodes(pb.ListNodesRequest(), **kw),
        "CordonNode": lambda: stub.CordonNode(pb.NodeStatusRequest(node_id=NO_SUCH_NODE), **kw),
        "UncordonNode": lambda: stub.UncordonNode(pb.NodeStatusRequest(node_id=NO_SUCH_NODE), **kw),
        "DrainNode": lambda: stub.DrainNode(pb.NodeStatusRequest(node_id=NO_SUCH_NODE), **kw),
        "RepairGpus": lambda: stub.RepairGpus(pb.RepairGpusRequest(node_id=NO_SUCH_NODE), **kw),
        "GetClusterStatus": lambda: stub.GetClusterStatus(
            pb.GetClusterStatusRequest(local_only=True), **kw
        ),
        "GetReplicaState": lambda: stub.GetReplicaState(pb.GetReplicaStateRequest(), **kw),
        "CreateToken": lambda: stub.CreateToken(
            pb.CreateTokenRequest(user="matrix-user", role="user"), **kw
        ),
        "ListTokens": lambda: stub.ListTokens(pb.ListTokensRequest(), **kw),
        "RevokeToken": lambda: stub.RevokeToken(
            pb.RevokeTokenRequest(token_id="000000000000"), **kw
        ),
        "RegisterNode": lambda: agent.RegisterNode(tiny_node(MATRIX_NODE), **kw),
        # Membership and backup: harmless forms (an existing replica, an unknown one).
        "AddReplica": lambda: stub.AddReplica(
            pb.AddReplicaRequest(replica_id="r1", raft_address="h:1", grpc_address="h:2"), **kw
        ),
        "RemoveReplica": lambda: stub.RemoveReplica(
            pb.RemoveReplicaRequest(replica_id="no-such-replica"), **kw
        ),
        "SaveSnapshot": lambda: list(stub.SaveSnapshot(pb.SaveSnapshotRequest(), **kw)),
        # History and events; a stream is read to its end (no follow).
        "ListHistory": lambda: stub.ListHistory(pb.ListHistoryRequest(), **kw),
        "GetUsage": lambda: stub.GetUsage(pb.GetUsageRequest(by="user", since_ms=1), **kw),
        "WatchEvents": lambda: list(stub.WatchEvents(pb.WatchEventsRequest(), **kw)),
        "ListQueues": lambda: stub.ListQueues(pb.ListQueuesRequest(), **kw),
        "SetQueue": lambda: stub.SetQueue(
            pb.SetQueueRequest(queue=pb.Queue(name="matrix-queue", gpu=1)), **kw
        ),
        "DeleteQueue": lambda: stub.DeleteQueue(pb.DeleteQueueRequest(name=NO_SUCH_QUEUE), **kw),
        "SetCohort": lambda: stub.SetCohort(
            pb.SetCohortRequest(cohort=pb.Cohort(name="matrix-cohort")), **kw
        ),
        "DeleteCohort": lambda: stub.DeleteCohort(pb.DeleteCohortRequest(name=NO_SUCH_QUEUE), **kw),
        # Per-identity limits: SetLimits with nothing named changes nothing.
        "GetLimits": lambda: stub.GetLimits(pb.GetLimitsRequest(), **kw),
        "SetLimits": lambda: stub.SetLimits(pb.SetLimitsRequest(), **kw),
    }
    return calls[method]


@pytest.mark.parametrize(("method", "who", "expected"), _matrix_cases())
def test_refusal_matrix(world: World, method: str, who: str, expected: str) -> None:
    cleanup: list[str] = []
    try:
        code, reason, detail = outcome(_matrix_call(world, method, who, cleanup))
    finally:
        for job_id in cleanup:
            world.cancel_quietly(job_id)
    want_code, want_reasons = CODES[expected]
    assert code is want_code, f"{who} calling {method}: {code.name} {reason}: {detail}"
    if want_reasons:
        assert reason in want_reasons, f"{who} calling {method}: {reason}: {detail}"


def test_the_matrix_names_every_method_of_both_services() -> None:
    rows = {case[0] for case in _matrix_cases()}
    services = (
        pb.DESCRIPTOR.services_by_name["SchedulerService"],
        pb.DESCRIPTOR.services_by_name["NodeAgentService"],
    )
    assert rows == {m.name for s in services for m in s.methods}


# ------------------------------------------------------------------ transport


def _raw_channel(address: str, ca: bytes | None, cert: TlsFiles | None = None) -> grpc.Channel:
    """A channel trusting ``ca`` (plaintext when None) and presenting ``cert`` (none when
    None): what a careless or hostile client can build."""
    if ca is None:
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=cert.key.read_bytes() if cert else None,
        certificate_chain=cert.cert.read_bytes() if cert else None,
    )
    return grpc.secure_channel(address, credentials)


def _status_code(
    channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.StatusCode:
    """What a GetClusterStatus over ``channel`` ends with (OK when it answers)."""
    stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
    with channel:
        code, _, _ = outcome(
            lambda: stub.GetClusterStatus(
                pb.GetClusterStatusRequest(local_only=True), metadata=metadata, timeout=3
            )
        )
    return code


def test_a_plaintext_client_is_refused_by_the_tls_port(world: World) -> None:
    address = world.leader().grpc
    assert _status_code(grpc.insecure_channel(address)) is grpc.StatusCode.UNAVAILABLE


def test_a_client_without_a_certificate_fails_the_handshake(world: World) -> None:
    address = world.leader().grpc
    ca = world.credentials.ca.read_bytes()
    assert _status_code(_raw_channel(address, ca)) is grpc.StatusCode.UNAVAILABLE
    # The same channel with the admin's certificate is answered: the refusal above is
    # the missing certificate, not the channel.
    admin = world.credentials.admin_tls()
    assert _status_code(_raw_channel(address, ca, admin)) is grpc.StatusCode.OK


def test_a_certificate_of_another_ca_is_refused(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> None:
    address = world.leader().grpc
    other = ClusterCredentials.ensure(tmp_path_factory.mktemp("other-ca"))
    ca = world.credentials.ca.read_bytes()
    # It trusts the cluster's CA (so the server is accepted) but presents an admin
    # certificate of another CA, with the very same identity as the cluster's admin.
    assert _status_code(_raw_channel(address, ca, other.admin_tls())) is (
        grpc.StatusCode.UNAVAILABLE
    )
    # With a token as well: the handshake fails before any token is read.
    bearer = (("authorization", f"Bearer {world.credentials.admin_token}"),)
    channel = _raw_channel(address, ca, other.client_tls())
    assert _status_code(channel, bearer) is grpc.StatusCode.UNAVAILABLE
    # The cluster's own transport-only certificate with the same token is answered.
    channel = _raw_channel(address, ca, world.credentials.client_tls())
    assert _status_code(channel, bearer) is grpc.StatusCode.OK


def test_an_expired_certificate_is_refused(world: World, tmp_path: Path) -> None:
    address = world.leader().grpc
    now = datetime.now(UTC)
    expired = issue(
        world.credentials.ca_dir,
        user("admin", Role.ADMIN),
        tmp_path / "expired",
        not_before=now - timedelta(days=2),
        not_after=now - timedelta(days=1),
    )
    fresh = issue(world.credentials.ca_dir, user("admin", Role.ADMIN), tmp_path / "fresh")
    ca = world.credentials.ca.read_bytes()
    assert _status_code(_raw_channel(address, ca, TlsFiles.from_cert_files(expired))) is (
        grpc.StatusCode.UNAVAILABLE
    )
    assert _status_code(_raw_channel(address, ca, TlsFiles.from_cert_files(fresh))) is (
        grpc.StatusCode.OK
    )


# ------------------------------------------------------------------- workers


def test_a_worker_certificate_speaks_only_for_its_own_node(world: World) -> None:
    leader = world.leader().grpc
    rogue = world.caller("rogue", Transport(world.credentials.worker_tls("w-rogue")))
    agent, stub = rogue.agent(leader), rogue.scheduler(leader)
    # Not as another node: neither the running worker w1 nor a node not yet registered.
    for node_id in ("w1", "w-other"):
        assert refused(lambda n=node_id: agent.RegisterNode(tiny_node(n), timeout=TIMEOUT_S)) == (
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.PERMISSION_DENIED,
        )
    assert refused(
        lambda: agent.Heartbeat(pb.HeartbeatRequest(node_id="w1"), timeout=TIMEOUT_S)
    ) == (grpc.StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED)
    assert world.node("w-other") is None
    # Nor anything an operator or admin does.
    for call in (
        lambda: stub.SubmitJob(
            pb.SubmitJobRequest(spec=pending_job("rogue"), request_id="rogue-1"),
            timeout=TIMEOUT_S,
        ),
        lambda: stub.CordonNode(pb.NodeStatusRequest(node_id="w1"), timeout=TIMEOUT_S),
        lambda: stub.CreateToken(
            pb.CreateTokenRequest(user="rogue", role="admin"), timeout=TIMEOUT_S
        ),
    ):
        assert refused(call) == (grpc.StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED)
    assert world.node("w1").status == "ready"  # type: ignore[union-attr]
    # As itself it may.
    agent.RegisterNode(tiny_node("w-rogue"), timeout=TIMEOUT_S)
    answer = agent.Heartbeat(pb.HeartbeatRequest(node_id="w-rogue"), timeout=TIMEOUT_S)
    assert states.lease_status(answer) is NodeStatus.READY
    assert world.node("w-rogue") is not None


# -------------------------------------------------------------------- tokens


def test_another_users_job_is_redacted_and_cannot_be_managed(world: World) -> None:
    leader = world.leader().grpc
    alice, bob = world.callers["alice"], world.callers["bob"]
    job_id = world.alice_job

    mine = alice.scheduler(leader).GetJob(
        pb.GetJobRequest(job_id=job_id), metadata=alice.metadata(), timeout=TIMEOUT_S
    )
    assert mine.job.owner == "alice"
    assert not mine.job.redacted
    assert mine.job.spec.shell_command == f"echo {ALICE_OUTPUT}"
    assert [(e.name, e.value) for e in mine.job.spec.env] == [("ALICE_SECRET", ALICE_SECRET)]

    bobs = bob.scheduler(leader)
    seen = bobs.GetJob(pb.GetJobRequest(job_id=job_id), metadata=bob.metadata(), timeout=TIMEOUT_S)
    assert seen.job.owner == "alice"
    assert seen.job.redacted
    assert seen.job.spec.WhichOneof("command") is None
    assert list(seen.job.spec.env) == []
    assert seen.job.spec.name == "alice-logs"  # the rest stays visible

    listed = bobs.ListJobs(pb.ListJobsRequest(), metadata=bob.metadata(), timeout=TIMEOUT_S)
    by_id = {j.job_id: j for j in listed.jobs}
    assert by_id[job_id].redacted
    assert by_id[job_id].spec.WhichOneof("command") is None
    assert not by_id[world.bob_job].redacted
    assert by_id[world.bob_job].spec.shell_command == "echo bob-was-here"

    target = world.submit("alice", pending_job("not-bobs"))
    try:
        for call in (
            lambda: bobs.CancelJob(
                pb.CancelJobRequest(job_id=target), metadata=bob.metadata(), timeout=TIMEOUT_S
            ),
            lambda: bobs.ExplainJob(
                pb.ExplainJobRequest(job_id=target), metadata=bob.metadata(), timeout=TIMEOUT_S
            ),
            lambda: bobs.GrantLogAccess(
                pb.GrantLogAccessRequest(job_id=job_id, rank=0),
                metadata=bob.metadata(),
                timeout=TIMEOUT_S,
            ),
        ):
            assert refused(call) == (grpc.StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED)
        assert world.job(target).state == "PENDING"
        # Alice may.
        alices = alice.scheduler(leader)
        alices.ExplainJob(
            pb.ExplainJobRequest(job_id=target), metadata=alice.metadata(), timeout=TIMEOUT_S
        )
        alices.CancelJob(
            pb.CancelJobRequest(job_id=target), metadata=alice.metadata(), timeout=TIMEOUT_S
        )
        cancelled = world.job(target)
        assert cancelled.state == "CANCELLED"
        assert cancelled.cancelled_by == "user:alice"
    finally:
        world.cancel_quietly(target)


def test_a_user_token_cannot_manage_nodes_or_tokens(world: World) -> None:
    leader = world.leader().grpc
    alice = world.callers["alice"]
    stub = alice.scheduler(leader)
    md = alice.metadata()
    for call in (
        lambda: stub.CordonNode(pb.NodeStatusRequest(node_id="w1"), metadata=md, timeout=5),
        lambda: stub.DrainNode(pb.NodeStatusRequest(node_id="w1"), metadata=md, timeout=5),
        lambda: stub.CreateToken(
            pb.CreateTokenRequest(user="alice", role="admin"), metadata=md, timeout=5
        ),
        lambda: stub.RevokeToken(
            pb.RevokeTokenRequest(token_id=world.tokens["bob"].token_id), metadata=md, timeout=5
        ),
    ):
        assert refused(call) == (grpc.StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED)
    assert world.node("w1").status == "ready"  # type: ignore[union-attr]
    # The operator may cordon (and uncordon) the node.
    operator = world.callers["operator"]
    ops = operator.scheduler(leader)
    ops.CordonNode(pb.NodeStatusRequest(node_id="w1"), metadata=operator.metadata(), timeout=5)
    try:
        assert world.node("w1").status == "cordoned"  # type: ignore[union-attr]
    finally:
        ops.UncordonNode(
            pb.NodeStatusRequest(node_id="w1"), metadata=operator.metadata(), timeout=5
        )
    assert world.node("w1").status == "ready"  # type: ignore[union-attr]


def test_a_revoked_token_is_refused_by_every_replica_once_applied(world: World) -> None:
    created = world.create_token("dave")
    dave = world.caller("dave", Transport(world.credentials.client_tls()), created.token)
    leader = world.leader()
    followers = world.cluster.followers(leader)
    assert len(followers) == 2

    def stale_read(replica: Replica) -> Any:
        return dave.scheduler(replica.grpc).ListJobs(
            pb.ListJobsRequest(allow_stale=True, limit=1), metadata=dave.metadata(), timeout=3
        )

    # Before: every replica accepts the token (a follower once it has applied it).
    dave.scheduler(leader.grpc).ListJobs(
        pb.ListJobsRequest(limit=1), metadata=dave.metadata(), timeout=TIMEOUT_S
    )
    for follower in followers:
        wait_for(f"{follower.replica_id} to accept dave's token", lambda f=follower: stale_read(f))

    world.admin.scheduler(leader.grpc).RevokeToken(
        pb.RevokeTokenRequest(token_id=created.token_id), timeout=TIMEOUT_S
    )
    # The leader has applied the revocation when RevokeToken answers.
    assert refused(
        lambda: dave.scheduler(leader.grpc).ListJobs(
            pb.ListJobsRequest(limit=1), metadata=dave.metadata(), timeout=TIMEOUT_S
        )
    ) == (grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED)

    # Each follower refuses it once it has applied the revocation, also for stale reads.
    def refuses(replica: Replica) -> bool:
        code, reason, _ = outcome(lambda: stale_read(replica))
        return code is grpc.StatusCode.UNAUTHENTICATED and reason is Reason.UNAUTHENTICATED

    for follower in followers:
        wait_for(
            f"{follower.replica_id} to refuse the revoked token", lambda f=follower: refuses(f)
        )
        for _ in range(3):  # and keeps refusing it
            assert refuses(follower)
        assert refused(
            lambda f=follower: dave.scheduler(f.grpc).GetJob(
                pb.GetJobRequest(job_id=world.alice_job, allow_stale=True),
                metadata=dave.metadata(),
                timeout=TIMEOUT_S,
            )
        ) == (grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED)


# ---------------------------------------------------------------------- logs


def _grant(world: World, who: str, job_id: str) -> pb.GrantLogAccessResponse:
    caller = world.callers[who]
    answer: pb.GrantLogAccessResponse = caller.scheduler(world.leader().grpc).GrantLogAccess(
        pb.GrantLogAccessRequest(job_id=job_id, rank=0),
        metadata=caller.metadata(),
        timeout=TIMEOUT_S,
    )
    return answer


def test_reading_a_log_on_the_worker_needs_a_grant_for_that_job(world: World) -> None:
    alice_grant = _grant(world, "alice", world.alice_job)
    bob_grant = _grant(world, "bob", world.bob_job)
    assert alice_grant.node_id == "w1"
    address = alice_grant.node_address
    assert address

    holder = world.callers["alice"]  # the transport-only certificate, as synctl uses
    logs = holder.worker("w1", address)
    # Without a grant: refused, whatever certificate the caller has short of a replica's.
    # (The worker's log service answers with a status code and no ErrorInfo.)
    assert log_refusal(lambda: read_log(logs, world.alice_job)) is UNAUTHENTICATED
    admin_logs = world.admin.worker("w1", address)
    assert log_refusal(lambda: read_log(admin_logs, world.alice_job)) is PERMISSION_DENIED
    # With bob's grant (real, current, for bob's job): not for alice's job.
    assert log_refusal(lambda: read_log(logs, world.alice_job, bob_grant.grant)) is (
        PERMISSION_DENIED
    )
    # A grant whose signature was tampered with proves nothing.
    payload, signature, cert = alice_grant.grant.split(".")
    tampered = signature[:-4] + ("AAAA" if signature[-4:] != "AAAA" else "BBBB")
    forged = ".".join((payload, tampered, cert))
    assert log_refusal(lambda: read_log(logs, world.alice_job, forged)) is UNAUTHENTICATED
    # With alice's grant: her output. Bob's grant reads bob's.
    assert read_log(logs, world.alice_job, alice_grant.grant).decode().strip() == ALICE_OUTPUT
    assert read_log(logs, world.bob_job, bob_grant.grant).decode().strip() == "bob-was-here"
    # A replica's certificate needs no grant.
    replica = world.callers["replica"]
    as_replica = replica.worker("w1", address)
    assert read_log(as_replica, world.alice_job).decode().strip() == ALICE_OUTPUT


# ----------------------------------------------------------------- run as owner


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="runs a member as a temporary local account: needs root and useradd",
)
def test_a_member_runs_with_its_owners_uid(world: World) -> None:
    name = f"synapse-t-{secrets.token_hex(4)}"
    data_dir = Path(tempfile.mkdtemp(prefix="synapse-owner-"))
    data_dir.chmod(0o755)  # the member's account must reach its directory
    worker: Worker | None = None
    _run("useradd", "--system", "--no-create-home", name)
    try:
        uid = pwd.getpwnam(name).pw_uid
        created = world.create_token(name)
        world.callers[name] = Caller(name, Transport(world.credentials.client_tls()), created.token)
        # The only node with a GPU: the job below lands here.
        worker = world.start_worker(
            "w-owner", data_dir / "w-owner", "--run-as", "owner", "--mock-gpus", "1"
        )
        assert world.node("w-owner").members_run_as == "owner"  # type: ignore[union-attr]
        job_id = world.submit(name, small_job("whoami", "id -u", gpu=1))
        job = world.wait_finished(job_id)
        assert job.state == "SUCCEEDED", world.cluster.logs()
        assert job.owner == name
        assert job.attempt.members[0].node_id == "w-owner"
        grant = _grant(world, name, job_id)
        caller = world.callers[name]
        output = read_log(caller.worker(grant.node_id, grant.node_address), job_id, grant.grant)
        assert output.decode().strip() == str(uid)
        assert uid != os.geteuid()
    finally:
        if worker is not None:
            worker.stop()
        subprocess.run(["userdel", name], capture_output=True, timeout=30, check=False)
        shutil.rmtree(data_dir, ignore_errors=True)
