"""The agent names every unhealthy GPU in every heartbeat, unary and on the stream, and
sends one early when the list changed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.stream import StreamServer
from synapse_ha.worker.agent import Agent, AgentTimings
from synapse_ha.worker.gpu_health import HealthRecord
from synapse_ha.worker.stream import StreamControlPlane
from synapse_ha.worker.xid import XidTable
from tests.rpc.authed import Replica
from tests.rpc.test_stream import stream_server
from tests.worker.helpers import FakeClock
from tests.worker.test_agent import FakeControl, FakeExecutor
from tests.worker.test_stream_client import FakeUnary, channel_as


def faults_of(request: pb.HeartbeatRequest) -> list[tuple[int, str, str]]:
    return [(f.gpu, f.code, f.detail) for f in request.gpu_faults]


def test_every_heartbeat_carries_the_monitors_faults_and_a_new_one_goes_out_early() -> None:
    clock = FakeClock()
    control = FakeControl(clock)
    health = HealthRecord(8, XidTable())
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        FakeExecutor(),
        clock,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=4.0),
        gpu_faults=health.faults,
    )
    agent.step()
    assert len(control.heartbeats) == 1 and faults_of(control.heartbeats[0]) == []
    clock.advance(0.1)
    agent.step()
    assert len(control.heartbeats) == 1  # nothing new: the next one is due in a second
    health.saw_xid(5, 79, "NVML event")
    assert agent.next_wakeup_in() < 0.1
    agent.step()  # a new fault: at once, not at the next period
    assert len(control.heartbeats) == 2
    assert faults_of(control.heartbeats[1]) == [
        (5, "xid-79", "Xid 79: GPU has fallen off the bus (NVML event)")
    ]
    health.saw(2, "ecc-dbe", "double-bit ECC error")
    clock.advance(1.0)
    agent.step()
    clock.advance(1.0)
    agent.step()
    # Sticky: every later heartbeat names every unhealthy GPU again.
    assert [[f[:2] for f in faults_of(h)] for h in control.heartbeats[2:]] == [
        [(2, "ecc-dbe"), (5, "xid-79")],
        [(2, "ecc-dbe"), (5, "xid-79")],
    ]


@pytest.fixture
def served() -> Iterator[tuple[Replica, StreamServer, list[bool]]]:
    with stream_server() as served:
        yield served


def test_a_heartbeat_on_the_stream_carries_the_faults_to_the_leader(
    served: tuple[Replica, StreamServer, list[bool]],
) -> None:
    replica, server, _ = served
    plane = StreamControlPlane(FakeUnary(f"127.0.0.1:{server.port}"), channel_as("n1"))
    fault = pb.GpuFault(gpu=1, code="xid-48", detail="Xid 48: double-bit ECC error")
    try:
        plane.register(pb.RegisterNodeRequest(node_id="n1"))
        plane.heartbeat(pb.HeartbeatRequest(node_id="n1", gpu_faults=[fault]), 10.0)
    finally:
        plane.close()
    assert plane.streamed == 1
    recorded = replica.backend.snapshot().nodes["n1"].gpu_faults
    assert [(f.gpu, f.code, f.detail) for f in recorded] == [
        (1, "xid-48", "Xid 48: double-bit ECC error")
    ]
    assert isinstance(recorded[0], GpuFault)
