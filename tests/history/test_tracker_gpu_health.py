"""GPU health in the events stream: a node's GPUs turning unhealthy and being repaired,
derived from the applied commands like every other event."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import full_copy
from synapse_ha.history.tracker import INDEX_SHIFT, EventKind, Tracker
from tests.core.harness import job, node
from tests.history.observed import ObservedCluster

XID = GpuFault(3, "xid-79", "GPU has fallen off the bus")
ECC = GpuFault(5, "ecc-dbe")


def report(cl: ObservedCluster, *faults: GpuFault, node_id: str = "n1") -> c.Result:
    result = cl.do(c.ReportGpuHealth(node_id, faults, jitter_seed=3, now_ms=cl.now))
    assert result.ok, result.message
    return result


def health_events(cl: ObservedCluster) -> list[tuple[str, str, str]]:
    kinds = (EventKind.GPU_UNHEALTHY, EventKind.GPU_REPAIRED)
    return [(str(e.kind), e.node_id, e.description) for e in cl.events if e.kind in kinds]


@pytest.mark.parametrize("everything", [False, True])
def test_unhealthy_gpus_and_their_repair_are_events_of_the_node(everything: bool) -> None:
    cl = ObservedCluster(everything=everything)
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    cl.now = 7_000
    report(cl, XID, ECC)
    (sick,) = [e for e in cl.events if e.kind is EventKind.GPU_UNHEALTHY]
    assert sick.node_id == "n1" and sick.time_ms == 7_000
    assert sick.index >> INDEX_SHIFT == cl.state.applied_commands
    # The worker names every unhealthy GPU in every heartbeat: only new ones are events.
    cl.do(c.ReportGpuHealth("n1", (XID, ECC), jitter_seed=3, now_ms=cl.now))
    assert cl.do(c.RepairGpus("n1", (3,), cl.now, "operator:ops")).ok
    assert cl.do(c.RepairGpus("n1", (3,), cl.now, "operator:ops")).ok  # nothing left to do
    assert cl.do(c.RepairGpus("n1", (), cl.now)).ok
    assert health_events(cl) == [
        ("gpu_unhealthy", "n1", "GPU 3 xid-79 (GPU has fallen off the bus), GPU 5 ecc-dbe"),
        ("gpu_repaired", "n1", "GPU 3 xid-79 repaired"),
        ("gpu_repaired", "n1", "GPU 5 ecc-dbe repaired"),
    ]


def test_the_fault_comes_before_the_drain_and_the_requeue_it_causes() -> None:
    cl = ObservedCluster(state=ClusterState(config=ClusterConfig(gpu_drain_threshold=1)))
    cl.add(node("n1", gpus=8))
    j = cl.submit(job("train", gpu=8))
    cl.run_pass()
    cl.start_all(j)
    before = len(cl.events)
    report(cl, XID)
    kinds = [str(e.kind) for e in cl.events[before:]]
    assert kinds[:2] == ["gpu_unhealthy", "node_draining"]
    assert "requeued" in kinds
    requeued = next(e for e in cl.events[before:] if e.kind is EventKind.REQUEUED)
    assert requeued.reason_code == "requeued_gpu_unhealthy"


def test_a_re_registration_keeps_the_faults_and_makes_no_health_event() -> None:
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8))
    report(cl, ECC)
    assert cl.do(c.RegisterNode(node("n1", gpus=8))).ok
    assert [k for k, _, _ in health_events(cl)] == ["gpu_unhealthy"]


def test_a_tracker_rebuilt_from_a_snapshot_knows_the_faults_it_holds() -> None:
    whole = ObservedCluster()
    whole.add(node("n1", gpus=8))
    report(whole, XID)
    snapshot = full_copy(whole.state)
    at = snapshot.applied_commands
    split = len(whole.log)
    report(whole, ECC)
    assert whole.do(c.RepairGpus("n1", (3,), whole.now)).ok

    restored = ObservedCluster(state=snapshot)
    restored.tracker = Tracker()
    restored.tracker.reset(restored.state)
    for command in whole.log[split:]:
        restored.do(command)
    assert restored.events == [e for e in whole.events if e.index > at << INDEX_SHIFT]
    assert health_events(restored) == [
        ("gpu_unhealthy", "n1", "GPU 5 ecc-dbe"),
        ("gpu_repaired", "n1", "GPU 3 xid-79 repaired"),
    ]
