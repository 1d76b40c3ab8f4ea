"""The agent carries its checks' latest results in every heartbeat, unary and on the
stream, and sends one early when a result changed; the leader records a failing one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.commands import RaiseFormat
from synapse_ha.core.health.fitness import CHECK_ACTOR, NodeCheck
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.stream import StreamServer
from synapse_ha.worker.agent import Agent, AgentTimings
from synapse_ha.worker.stream import StreamControlPlane
from tests.rpc.authed import Replica
from tests.rpc.test_stream import stream_server
from tests.worker.helpers import FakeClock
from tests.worker.test_agent import FakeControl, FakeExecutor
from tests.worker.test_stream_client import FakeUnary, channel_as


def checks_of(request: pb.HeartbeatRequest) -> list[tuple[str, bool, str]]:
    return [(k.name, k.failing, k.message) for k in request.checks]


def test_every_heartbeat_carries_the_checks_and_a_changed_one_goes_out_early() -> None:
    clock = FakeClock()
    control = FakeControl(clock)
    latest: list[NodeCheck] = []
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        FakeExecutor(),
        clock,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=4.0),
        node_checks=lambda: tuple(latest),
    )
    agent.step()
    assert len(control.heartbeats) == 1 and checks_of(control.heartbeats[0]) == []
    clock.advance(0.1)
    agent.step()
    assert len(control.heartbeats) == 1
    latest.append(NodeCheck("health-check", True, "disk full"))
    assert agent.next_wakeup_in() < 0.1
    agent.step()  # the first result: at once
    assert len(control.heartbeats) == 2
    assert checks_of(control.heartbeats[1]) == [("health-check", True, "disk full")]
    clock.advance(1.0)
    agent.step()
    assert checks_of(control.heartbeats[2]) == [("health-check", True, "disk full")]
    latest[0] = NodeCheck("health-check")
    clock.advance(0.05)  # past the least gap between early heartbeats
    agent.step()
    assert checks_of(control.heartbeats[3]) == [("health-check", False, "")]


@pytest.fixture
def served() -> Iterator[tuple[Replica, StreamServer, list[bool]]]:
    with stream_server() as served:
        yield served


def test_a_failing_check_on_the_stream_cordons_the_node(
    served: tuple[Replica, StreamServer, list[bool]],
) -> None:
    replica, server, _ = served
    assert replica.backend.propose(RaiseFormat(FORMAT)).result(10).ok  # every replica reads it
    plane = StreamControlPlane(FakeUnary(f"127.0.0.1:{server.port}"), channel_as("n1"))
    check = pb.NodeCheck(name="health-check", failing=True, message="no /data mount")
    try:
        plane.register(pb.RegisterNodeRequest(node_id="n1"))
        plane.heartbeat(pb.HeartbeatRequest(node_id="n1", checks=[check]), 10.0)
    finally:
        plane.close()
    assert plane.streamed == 1
    n1 = replica.backend.snapshot().nodes["n1"]
    assert [(k.name, k.message) for k in n1.conditions] == [("health-check", "no /data mount")]
    assert (n1.status, n1.status_by) == (NodeStatus.CORDONED, CHECK_ACTOR)
