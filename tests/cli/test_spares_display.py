"""Hot spares as people see them: ListNodes marks each spare (in-process replica,
tests/rpc/authed.py), ``synctl nodes`` has a SPARE column and a ``spare`` field, sinfo
says ``resv`` and counts it idle, the dashboard marks it on the nodes page and the map."""

from __future__ import annotations

from synapse_ha.cli import render_nodes as synctl_nodes
from synapse_ha.cli.sinfo import node_state, row
from synapse_ha.client.nodes import node_from_proto
from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.model import Node, NodeStatus, Resources
from synapse_ha.observe.list_pages import render_nodes
from synapse_ha.observe.pages import render_node_map
from synapse_ha.rpc import to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.cli.test_gpu_health_render import row as table_row
from tests.core.harness import node
from tests.rpc.authed import NOW, serving_replica
from tests.rpc.test_access import credentials


def _node(node_id: str, spare: bool, used_gpus: int = 0) -> pb.Node:
    record = Node(node(node_id, gpus=8), NodeStatus.READY, 1)
    record.allocated = Resources(0, 0, used_gpus)
    return to_proto.node_to_proto(record, 1_500, spare=spare)


def test_list_nodes_marks_the_spares_of_the_state() -> None:
    with serving_replica() as replica:
        # n1 and n2 share rack r1; the two pending jobs hold nothing yet.
        assert replica.backend.propose(cmd.RaiseFormat(14, ("r1",), NOW)).result().ok
        configure = cmd.Configure(ClusterConfig(spares=1), NOW)
        assert replica.backend.propose(configure).result().ok
        answer = replica.scheduler.ListNodes(
            pb.ListNodesRequest(), metadata=credentials(replica, "alice"), timeout=10
        )
    assert {n.node_id: n.spare for n in answer.nodes} == {"n1": True, "n2": False}


def test_synctl_nodes_shows_a_spare_in_its_column_and_its_document() -> None:
    docs = [
        synctl_nodes.node_document(node_from_proto(_node("w1", spare=True))),
        synctl_nodes.node_document(node_from_proto(_node("w2", spare=False, used_gpus=8))),
    ]
    assert [d["spare"] for d in docs] == [True, False]
    text = synctl_nodes.nodes_table(docs)
    assert table_row(text, "w1")["SPARE"] == "spare"
    assert table_row(text, "w2")["SPARE"] == "-"
    assert table_row(text, "w1")["STATUS"] == "ready"


def test_sinfo_says_resv_for_a_spare_and_counts_it_idle() -> None:
    spare, idle, busy = _node("w1", True), _node("w2", False), _node("w3", False, 8)
    assert [node_state(n) for n in (spare, idle, busy)] == ["resv", "idle", "alloc"]
    assert row("default", [spare, idle, busy], "nodes_aiot") == "1/2/0/3"
    assert row("default", [spare], "state") == "reserved"


def test_the_dashboard_marks_a_spare_on_the_nodes_page_and_the_map() -> None:
    nodes = [_node("w1", True), _node("w2", False)]
    page = render_nodes(nodes, {}, NOW)
    assert 'data-node="w1" data-status="ready" data-spare="1"' in page
    assert 'data-node="w2" data-status="ready" data-spare="0"' in page
    assert page.count(">spare</span>") == 1
    drawn = render_node_map(nodes)
    assert drawn.count('class="node ready spare"') == 1
    assert "kept idle as a spare" in drawn
