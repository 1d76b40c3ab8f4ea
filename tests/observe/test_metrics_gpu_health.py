"""Unhealthy GPUs in a replica's metrics: a gauge per node, and never counted free. Over
a harness state: no network, no clock."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.observe.metrics import ReplicaMetrics
from synapse_ha.observe.state_metrics import StateFigures
from tests.core.harness import Cluster
from tests.observe.test_metrics import FakeReplica, busy_cluster, samples


def report(cluster: Cluster, node_id: str, *faults: GpuFault) -> None:
    result = cluster.do(c.ReportGpuHealth(node_id, faults, jitter_seed=1, now_ms=cluster.now))
    assert result.ok, result.message


def test_unhealthy_gpus_are_counted_per_node_and_never_free() -> None:
    cluster = busy_cluster()  # b1 (rack r2) is full; a1 and a2 (rack r1) are idle
    report(cluster, "a1", GpuFault(2, "xid-79"), GpuFault(5, "ecc-dbe"))
    figures = StateFigures.of(cluster.state)
    assert figures.unhealthy == {"a1": 2, "a2": 0, "b1": 0}
    assert figures.gpus[("r1", "free")] == 14
    assert figures.gpus[("r1", "used")] == 0


def test_an_unhealthy_gpu_still_held_counts_as_used_and_free_never_goes_negative() -> None:
    cluster = busy_cluster()
    report(cluster, "a1", GpuFault(0, "lost"), GpuFault(1, "ecc-dbe"))
    # Members still holding GPU 0 until they are confirmed stopped, and GPU 7 in use.
    cluster.state.nodes["a1"].allocated_gpus = {0, 7}
    figures = StateFigures.of(cluster.state)
    assert figures.unhealthy["a1"] == 2
    # a1: 8 - |{0, 7} | {0, 1}| = 5 free; a2: 8 free.
    assert (figures.gpus[("r1", "used")], figures.gpus[("r1", "free")]) == (2, 13)
    cluster.state.nodes["a1"].gpu_faults = tuple(GpuFault(g, "lost") for g in range(8))
    assert StateFigures.of(cluster.state).gpus[("r1", "free")] == 8


def test_the_gauge_is_scraped_for_every_node_and_falls_back_after_a_repair() -> None:
    cluster = busy_cluster()
    metrics = ReplicaMetrics("r1", FakeReplica(cluster.state))
    healthy = samples(metrics.registry)
    assert healthy[("synapse_gpus_unhealthy", (("node", "a1"),))] == 0
    assert healthy[("synapse_gpus", (("rack", "r1"), ("state", "free")))] == 16

    report(cluster, "a1", GpuFault(3, "xid-79"), GpuFault(4, "nvlink"))
    sick = samples(metrics.registry)
    assert sick[("synapse_gpus_unhealthy", (("node", "a1"),))] == 2
    assert sick[("synapse_gpus_unhealthy", (("node", "a2"),))] == 0
    assert sick[("synapse_gpus", (("rack", "r1"), ("state", "free")))] == 14

    assert cluster.do(c.RepairGpus("a1", (3,), cluster.now, "user:ops")).ok
    repaired = samples(metrics.registry)
    assert repaired[("synapse_gpus_unhealthy", (("node", "a1"),))] == 1
    assert repaired[("synapse_gpus", (("rack", "r1"), ("state", "free")))] == 15
