"""ListNodes says which gang a drain holds a node for (defragmentation), from the
leader's newest scheduling pass; a follower's stale answer, which has no pass, says
none."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.client.nodes import list_nodes, node_from_proto
from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import apply
from synapse_ha.core.scheduler.plan import Drain, Plan
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.core.harness import node
from tests.rpc.authed import NOW, FakeBackend, lone_context, served

DONE_MS = NOW + 600_000


@contextmanager
def replica(serving: bool, plan: Plan) -> Iterator[ClusterClient]:
    backend = FakeBackend()
    for node_id in ("n1", "n2", "n3"):
        assert apply(backend.state, cmd.RegisterNode(node(node_id, gpus=8), NOW)).ok
    with (
        served(lone_context(backend, serving, last_plan=lambda: plan)) as address,
        ClusterClient([address], timeout_s=5) as client,
    ):
        yield client


PLAN = Plan(
    drains=[
        Drain("job-000004", frozenset({"n1", "n3"}), DONE_MS, ("job-000002",)),
        Drain("job-000007", frozenset({"n2"}), None, ("job-000001",)),
    ]
)


def test_each_drained_node_names_the_gang_it_is_held_for_and_until_when() -> None:
    with replica(True, PLAN) as client:
        nodes = {n.node_id: n for n in list_nodes(client)}
    assert (nodes["n1"].draining_for, nodes["n1"].draining_until_ms) == ("job-000004", DONE_MS)
    assert (nodes["n3"].draining_for, nodes["n3"].draining_until_ms) == ("job-000004", DONE_MS)
    assert (nodes["n2"].draining_for, nodes["n2"].draining_until_ms) == ("job-000007", 0)


def test_a_node_no_drain_holds_names_none() -> None:
    with replica(True, Plan()) as client:
        assert {n.draining_for for n in list_nodes(client)} == {""}


def test_a_stale_answer_names_no_drain() -> None:
    with replica(False, PLAN) as client:
        answer = client.ask("ListNodes", pb.ListNodesRequest(allow_stale=True))
    assert answer.stale
    assert {node_from_proto(n).draining_for for n in answer.nodes} == {""}
