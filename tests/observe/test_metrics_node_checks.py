"""Failing node checks in a replica's metrics: one series per (node, check) while the
check fails, gone once it passes. Over a harness state: no network, no clock."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.health.fitness import NodeCheck
from synapse_ha.observe.metrics import ReplicaMetrics
from tests.observe.test_metrics import FakeReplica, busy_cluster, samples

FAILING = ("synapse_node_check_failing", (("check", "health-check"), ("node", "a1")))


def test_a_failing_check_is_a_series_of_its_node_until_it_passes() -> None:
    cluster = busy_cluster()
    metrics = ReplicaMetrics("r1", FakeReplica(cluster.state))
    assert not any(name == FAILING[0] for name, _ in samples(metrics.registry))
    failing = NodeCheck("health-check", True, "disk full")
    assert cluster.do(c.ReportNodeChecks("a1", (failing,), cluster.now)).ok
    sick = samples(metrics.registry)
    assert sick[FAILING] == 1
    assert [k for k in sick if k[0] == FAILING[0]] == [FAILING]
    assert sick[("synapse_nodes", (("status", "cordoned"),))] == 1
    passing = NodeCheck("health-check", False)
    assert cluster.do(c.ReportNodeChecks("a1", (passing,), cluster.now)).ok
    assert FAILING not in samples(metrics.registry)


def test_the_dashboards_node_title_names_its_failing_checks_escaped() -> None:
    from synapse_ha.observe.pages import render_node_map
    from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

    node = pb.Node(
        node_id="w1",
        status="cordoned",
        capacity=pb.Resources(gpu=2),
        conditions=[pb.NodeCondition(name="health-check", message="<b>/data</b> missing")],
    )
    page = render_node_map([node])
    assert "failing: health-check: &lt;b&gt;/data&lt;/b&gt; missing" in page
    assert "<b>" not in page
