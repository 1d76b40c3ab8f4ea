"""A worker's ``member_isolation`` through the real RegisterNode path (in-process replica,
tests/rpc/authed.py): kept once every replica reads it, left out before, refused when it
is not a value a node may say."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import node_to_proto
from tests.rpc.authed import NOW, Replica, serving_replica
from tests.rpc.test_access import credentials

MEMBER_ISOLATION_FORMAT = 10


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def register(replica: Replica, isolation: str) -> pb.RegisterNodeResponse:
    request = pb.RegisterNodeRequest(
        node_id="n2",
        address="10.0.0.9",
        capacity=pb.Resources(cpu_milli=1000),
        members_run_as="owner",
        member_isolation=isolation,
    )
    answer: pb.RegisterNodeResponse = replica.agent.RegisterNode(
        request, metadata=credentials(replica, "cert:spiffe://synapse/worker/n2"), timeout=10
    )
    return answer


def test_a_node_says_whether_its_members_share_its_processes(replica: Replica) -> None:
    register(replica, "shared")
    # Not every replica reads it yet: left out, as a node that did not say.
    assert replica.backend.state.format_floor < MEMBER_ISOLATION_FORMAT
    assert replica.backend.state.nodes["n2"].info.member_isolation == ""
    raise_to = cmd.RaiseFormat(MEMBER_ISOLATION_FORMAT, ("r1",), NOW)
    assert replica.backend.propose(raise_to).result().ok
    register(replica, "shared")
    node = replica.backend.state.nodes["n2"]
    assert node.info.member_isolation == "shared"
    assert node_to_proto(node, 0).member_isolation == "shared"
    register(replica, "pid-namespace")
    assert replica.backend.state.nodes["n2"].info.member_isolation == "pid-namespace"


def test_a_node_cannot_say_anything_else(replica: Replica) -> None:
    raise_to = cmd.RaiseFormat(MEMBER_ISOLATION_FORMAT, ("r1",), NOW)
    assert replica.backend.propose(raise_to).result().ok
    with pytest.raises(grpc.RpcError) as caught:
        register(replica, "isolated, trust me")
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    failure = failure_of(caught.value)
    assert failure.reason is ErrorReason.INVALID_FIELD
    assert failure.field == "member_isolation"
