"""The worker's StreamControlPlane against an in-process stream server (the fake
backend of :mod:`tests.rpc.authed`; the peer identity travels in metadata there)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.identity import access
from synapse_ha.core.machine import apply
from synapse_ha.core.model import NodeStatus
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.views import desired_by_node
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.stream import StreamServer
from synapse_ha.worker.agent import GrpcControlPlane, NotRegistered, StreamEnded
from synapse_ha.worker.stream import StreamControlPlane
from tests.rpc.authed import NOW, PEER_KEY, Replica, serving_replica
from tests.rpc.test_stream import stream_server


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


class _AsPeer(grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, peer: str) -> None:
        self.peer = peer

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_Details(details, [(PEER_KEY, self.peer)]), requests)


def channel_as(node_id: str) -> Callable[[str], grpc.Channel]:
    def make(address: str) -> grpc.Channel:
        peer = access.worker(node_id).spiffe_id
        return grpc.intercept_channel(grpc.insecure_channel(address), _AsPeer(peer))

    return make


class FakeUnary:
    def __init__(self, stream_address: str) -> None:
        self.stream_address = stream_address
        self.heartbeats = 0

    def register(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeResponse:
        return pb.RegisterNodeResponse(status="ready", stream_address=self.stream_address)

    def heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        self.heartbeats += 1
        return pb.HeartbeatResponse(
            **states.lease_status_fields(NodeStatus.READY), heartbeat_interval_ms=1000
        )


@pytest.fixture
def served() -> Iterator[tuple[Replica, StreamServer, list[bool]]]:
    with stream_server() as served:
        yield served


def bound_node(replica: Replica) -> str:
    command = schedule(replica.backend.snapshot(), NOW).command(NOW)
    assert command is not None
    assert apply(replica.backend.state, command).ok
    return min(n for n, m in desired_by_node(replica.backend.state).items() if m)


def test_heartbeats_go_on_the_stream_and_every_reply_carries_the_whole_list(
    served: tuple[Replica, StreamServer, list[bool]],
) -> None:
    replica, server, _ = served
    node_id = bound_node(replica)
    unary = FakeUnary(f"127.0.0.1:{server.port}")
    plane = StreamControlPlane(unary, channel_as(node_id))
    try:
        plane.register(pb.RegisterNodeRequest(node_id=node_id))
        replies = [plane.heartbeat(pb.HeartbeatRequest(node_id=node_id), 10.0) for _ in range(2)]
    finally:
        plane.close()
    assert unary.heartbeats == 0
    assert plane.streamed == 2 and server.heartbeats == 2
    expected = [d.job_id for d in desired_by_node(replica.backend.state)[node_id]]
    # The second acknowledgement carried no list (unchanged): the one kept is returned.
    assert [[d.job_id for d in r.desired] for r in replies] == [expected, expected]


def test_without_a_stream_address_heartbeats_stay_unary() -> None:
    unary = FakeUnary("")
    plane = StreamControlPlane(unary, channel_as("n1"))
    plane.register(pb.RegisterNodeRequest(node_id="n1"))
    plane.heartbeat(pb.HeartbeatRequest(node_id="n1"), 1.0)
    assert (unary.heartbeats, plane.streamed, plane.unary_heartbeats) == (1, 0, 1)


def test_a_stream_ended_by_a_step_down_asks_the_agent_to_register_again(
    served: tuple[Replica, StreamServer, list[bool]],
) -> None:
    _, server, serving = served
    silent: list[bool] = []
    plane = StreamControlPlane(
        FakeUnary(f"127.0.0.1:{server.port}"),
        channel_as("n1"),
        on_silent=lambda: silent.append(True),
    )
    try:
        plane.register(pb.RegisterNodeRequest(node_id="n1"))
        plane.heartbeat(pb.HeartbeatRequest(node_id="n1"), 10.0)
        serving[0] = False
        with pytest.raises(StreamEnded):
            plane.heartbeat(pb.HeartbeatRequest(node_id="n1"), 10.0)
    finally:
        plane.close()
    assert silent == []  # the leader answered: it stepped down, it is not silent


def test_a_leader_that_answers_nothing_is_reported_silent() -> None:
    """A frozen leader: its socket accepts connections and never answers."""
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen()
    silent: list[bool] = []
    plane = StreamControlPlane(
        FakeUnary(f"127.0.0.1:{frozen.getsockname()[1]}"),
        channel_as("n1"),
        on_silent=lambda: silent.append(True),
    )
    try:
        plane.register(pb.RegisterNodeRequest(node_id="n1"))
        with pytest.raises(StreamEnded, match="no acknowledgement"):
            plane.heartbeat(pb.HeartbeatRequest(node_id="n1"), 0.3)
    finally:
        plane.close()
        frozen.close()
    assert silent == [True]


def test_an_unknown_node_is_not_registered(
    served: tuple[Replica, StreamServer, list[bool]],
) -> None:
    _, server, _ = served
    plane = StreamControlPlane(FakeUnary(f"127.0.0.1:{server.port}"), channel_as("n7"))
    try:
        plane.register(pb.RegisterNodeRequest(node_id="n7"))
        with pytest.raises(NotRegistered):
            plane.heartbeat(pb.HeartbeatRequest(node_id="n7"), 10.0)
    finally:
        plane.close()


class _AsPeerUnary(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, peer: str) -> None:
        self.peer = peer

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_Details(details, [(PEER_KEY, self.peer)]), request)


def test_the_unary_heartbeat_of_an_unknown_node_is_not_registered() -> None:
    # The replica's typed reason (NODE_NOT_FOUND), not the bare status code, decides.
    def as_worker(node_id: str) -> Callable[[str], grpc.Channel]:
        peer = access.worker(node_id).spiffe_id
        return lambda address: grpc.intercept_channel(
            grpc.insecure_channel(address), _AsPeerUnary(peer)
        )

    with serving_replica() as replica:
        for node_id, registered in (("n1", True), ("n7", False)):
            client = ClusterClient([replica.address], channel_factory=as_worker(node_id))
            plane = GrpcControlPlane(client)
            try:
                request = pb.HeartbeatRequest(node_id=node_id)
                if registered:
                    assert states.lease_status(plane.heartbeat(request, 5.0))
                else:
                    with pytest.raises(NotRegistered, match="not registered"):
                        plane.heartbeat(request, 5.0)
            finally:
                client.close()
