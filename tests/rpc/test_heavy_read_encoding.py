"""A heavy read's answer is encoded with its CPU time charged to the read gate: gRPC
encodes an answer after the handler returns, outside the gate's own accounting, and a
listing's encoding costs about half as much again as building it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import apply
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.load_gates import ReadGate
from synapse_ha.rpc.server import HEAVY_READS
from synapse_ha.rpc.server.context import DEFAULT_PAGE_SIZE
from tests.core.harness import job
from tests.rpc.authed import NOW, FakeBackend, lone_context, served


class RecordingGate(ReadGate):
    """A read gate that records what it was charged after a read left it."""

    def __init__(self) -> None:
        super().__init__()
        self.charges: list[float] = []

    def charge(self, cpu_s: float) -> None:
        self.charges.append(cpu_s)
        super().charge(cpu_s)


@contextmanager
def replica(jobs: int) -> Iterator[tuple[ClusterClient, RecordingGate, str]]:
    backend = FakeBackend()
    for i in range(jobs):
        spec = job(f"j{i}", replicas=1, gpu=1)
        assert apply(backend.state, cmd.SubmitJob(spec, f"req-{i}", NOW, owner="alice")).ok
    gate = RecordingGate()
    with (
        served(lone_context(backend, read_gate=gate)) as address,
        ClusterClient([address], timeout_s=5) as client,
    ):
        yield client, gate, address


def test_each_page_of_a_listing_is_encoded_through_the_gate() -> None:
    with replica(DEFAULT_PAGE_SIZE + 1) as (client, gate, _):
        listed = client.list_jobs()
        assert len(listed) == DEFAULT_PAGE_SIZE + 1
        assert len(gate.charges) >= 2  # one per page, at least two pages
        assert all(c >= 0 for c in gate.charges)
        # The answer is whole: what was encoded through the gate decodes as the jobs.
        assert {j.spec.name for j in listed} == {f"j{i}" for i in range(DEFAULT_PAGE_SIZE + 1)}


def test_an_explanation_is_charged_and_a_single_job_read_is_not() -> None:
    with replica(1) as (client, gate, _):
        job_id = client.list_jobs()[0].job_id
        before = len(gate.charges)
        client.get_job(job_id)
        assert len(gate.charges) == before  # a cheap read bypasses the gate
        client.ask("ExplainJob", pb.ExplainJobRequest(job_id=job_id))
        assert len(gate.charges) == before + 1


def test_the_charge_is_taken_from_the_share() -> None:
    gate = ReadGate()
    start = gate.stats().credit_s
    gate.charge(0.25)
    assert gate.stats().credit_s == pytest.approx(start - 0.25, abs=0.01)
    gate.charge(-1.0)  # a clock that went backwards charges nothing
    assert gate.stats().credit_s == pytest.approx(start - 0.25, abs=0.01)


def test_every_heavy_read_is_a_unary_method_of_the_service() -> None:
    service = pb.DESCRIPTOR.services_by_name["SchedulerService"]
    for name in HEAVY_READS:
        method = service.methods_by_name[name]
        assert not method.client_streaming and not method.server_streaming, name


def test_a_refused_heavy_read_is_not_charged() -> None:
    with replica(1) as (_, gate, address), grpc.insecure_channel(address) as channel:
        gate.charge(10.0)  # the share used up for a long while
        stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListNodes(pb.ListNodesRequest(), timeout=10)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert gate.charges == [10.0]
