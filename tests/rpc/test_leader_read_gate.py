"""The serving leader's own ration for heavy reads a follower could serve (stale, or with
a read token): past it the leader refuses them at once, naming its followers, and a
client takes them there; other reads, and every read of a follower or of a lone replica,
go through the replica's read gate as before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import apply
from synapse_ha.programs.read_config import read_gates
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.load_gates import ReadGate, ReadLimits
from synapse_ha.rpc.server import ReplicaAddress
from synapse_ha.rpc.server.context import MIN_INDEX_KEY
from tests.core.harness import job
from tests.rpc.authed import NOW, FakeBackend, lone_context, served

FOLLOWER = "127.0.0.1:7"  # the follower the leader names (no replica listens there)


@dataclass
class Served:
    address: str
    stub: pb_grpc.SchedulerServiceStub
    gate: ReadGate
    leader_gate: ReadGate


@contextmanager
def replica(
    serving: bool = True, peers: int = 1, jobs: int = 2, used_up: bool = True
) -> Iterator[Served]:
    """A replica with ``jobs`` jobs, serving as leader or not, among ``peers`` others;
    its leader ration ``used_up`` or whole."""
    backend = FakeBackend()
    for i in range(jobs):
        spec = job(f"j{i}", replicas=1, gpu=1)
        assert apply(backend.state, cmd.SubmitJob(spec, f"req-{i}", NOW, owner="alice")).ok
    replicas = [ReplicaAddress("r1", "127.0.0.1:1", "127.0.0.1:0")]
    replicas += [ReplicaAddress(f"r{i + 2}", "127.0.0.1:2", FOLLOWER) for i in range(peers)]
    gate = ReadGate()
    leader_gate = ReadGate(ReadLimits(1, 0.05, burst_s=0.1, max_wait_s=0.0))
    if used_up:
        leader_gate.charge(60.0)  # for twenty minutes
    ctx = lone_context(
        backend, serving, replicas=replicas, read_gate=gate, leader_read_gate=leader_gate
    )
    with served(ctx) as address, grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
        yield Served(address, stub, gate, leader_gate)


def refused(call: object) -> dict[str, str]:
    """The ErrorInfo metadata of the OVERLOADED that ``call()`` raised."""
    with pytest.raises(grpc.RpcError) as error:
        call()  # type: ignore[operator]
    failure = failure_of(error.value)
    assert failure.reason is ErrorReason.OVERLOADED
    return dict(failure.metadata)


def test_the_leader_hands_stale_listings_to_its_followers_past_its_ration() -> None:
    with replica() as r:
        metadata = refused(lambda: r.stub.ListJobs(pb.ListJobsRequest(allow_stale=True)))
        assert metadata["read_from"] == FOLLOWER
        # A read only the leader can serve is the replica's read gate's to admit.
        assert len(r.stub.ListJobs(pb.ListJobsRequest()).jobs) == 2
        assert len(r.stub.ListNodes(pb.ListNodesRequest()).nodes) == 0


def test_a_read_token_makes_a_listing_one_a_follower_can_serve() -> None:
    with replica() as r:
        token = ((MIN_INDEX_KEY, "1"),)
        metadata = refused(lambda: r.stub.ListJobs(pb.ListJobsRequest(), metadata=token))
        assert metadata["read_from"] == FOLLOWER
        # An explanation with a token still needs the leader's own plan: not handed on.
        job_id = r.stub.ListJobs(pb.ListJobsRequest()).jobs[0].job_id
        r.stub.ExplainJob(pb.ExplainJobRequest(job_id=job_id), metadata=token)
        refused(lambda: r.stub.ExplainJob(pb.ExplainJobRequest(job_id=job_id, allow_stale=True)))


@pytest.mark.parametrize(("serving", "peers"), [(False, 1), (True, 0)])
def test_a_follower_and_a_lone_leader_serve_stale_reads_from_their_read_gate(
    serving: bool, peers: int
) -> None:
    with replica(serving=serving, peers=peers) as r:
        assert len(r.stub.ListJobs(pb.ListJobsRequest(allow_stale=True)).jobs) == 2
        assert r.leader_gate.stats().admitted == 0
        assert r.gate.stats().admitted >= 1


def test_within_its_ration_the_leader_serves_and_the_encoding_is_charged_to_it() -> None:
    with replica(used_up=False) as r:
        listed = r.stub.ListJobs(pb.ListJobsRequest(allow_stale=True))
        assert len(listed.jobs) == 2
        assert (r.leader_gate.stats().admitted, r.gate.stats().admitted) == (1, 0)
        assert r.leader_gate.stats().credit_s < 0.1


def test_a_client_takes_the_read_to_the_follower_the_leader_names() -> None:
    with ExitStack() as stack:
        leader = stack.enter_context(replica(jobs=2))
        follower = stack.enter_context(replica(serving=False, jobs=3))
        client = stack.enter_context(
            ClusterClient([leader.address, follower.address], timeout_s=5, hedge_s=None)
        )
        listed = client.list_jobs(allow_stale=True)
        assert len(listed) == 3  # the follower's answer, without a back-off at the leader
        assert leader.leader_gate.stats().refused >= 1


def test_the_settings_make_both_gates_and_zero_turns_the_leader_s_off() -> None:
    gate, leader_gate = read_gates(2, 0.3, 0.05)
    assert (gate.limits.concurrency, gate.limits.cpu_share) == (2, 0.3)
    assert leader_gate is not None
    assert (leader_gate.limits.cpu_share, leader_gate.limits.max_wait_s) == (0.05, 0.0)
    assert read_gates(2, 0.3, 0.0)[1] is None
