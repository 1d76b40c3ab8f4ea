"""GPU health as replicated state (DESIGN §4): an unhealthy GPU is never placed on, the
gang holding it is requeued as a disruption, and only a repair clears it."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.model import AttemptState, ClusterState, JobState, MemberPlacement, NodeStatus
from synapse_ha.core.reasons import ReasonCode, render
from tests.core.harness import Cluster, job, node

XID = GpuFault(3, "xid-79", "GPU has fallen off the bus")


def one_node(gpus: int = 8, **config: int) -> Cluster:
    cl = Cluster(state=ClusterState(config=ClusterConfig(**config)))  # type: ignore[arg-type]
    cl.add(node("n1", gpus=gpus))
    return cl


def report(cl: Cluster, *faults: GpuFault, node_id: str = "n1") -> c.Result:
    return cl.do(c.ReportGpuHealth(node_id, faults, jitter_seed=5, now_ms=cl.now))


def test_a_reported_gpu_is_recorded_since_then_and_never_offered() -> None:
    cl = one_node()
    cl.now = 5_000
    result = report(cl, XID)
    assert result.ok and "GPU 3 xid-79" in result.message
    assert cl.state.nodes["n1"].gpu_faults == (GpuFault(3, "xid-79", XID.detail, 5_000),)
    assert cl.state.nodes["n1"].free.gpu == 7
    whole = cl.submit(job("whole", gpu=8))
    seven = cl.submit(job("seven", gpu=7))
    cl.run_pass()
    assert cl.state_of(whole) is JobState.PENDING
    assert cl.state_of(seven) is JobState.SCHEDULED
    attempt = cl.state.jobs[seven].attempt
    assert attempt is not None and 3 not in attempt.members[0].gpus


def test_a_gang_waiting_for_gpus_is_told_how_many_are_unhealthy() -> None:
    cl = one_node()
    assert report(cl, XID).ok
    whole = cl.submit(job("whole", gpu=8))
    plan = cl.run_pass()
    why = plan.reasons[whole]
    assert why.code is ReasonCode.WAITING_CAPACITY and why.num("unhealthy") == 1
    assert "1 unhealthy GPU(s) are left out until repaired" in render(why)
    assert cl.do(c.RepairGpus("n1", (), cl.now, "user:ops")).ok
    cpu_only = cl.submit(job("cpu", cpu=100, wait_for_nodes=True))  # more than the node has
    assert "unhealthy" not in render(cl.run_pass().reasons[cpu_only])


def test_a_plan_naming_an_unhealthy_gpu_is_refused_at_apply() -> None:
    cl = one_node()
    report(cl, XID)
    j = cl.submit(job(gpu=1))
    placement = c.GangPlacement(j, 0, (MemberPlacement(0, "n1", (3,)),))
    stale = c.BindPlan((placement,), now_ms=cl.now)
    result = cl.do(stale)
    assert [r.code for r in result.rejected] == [c.RejectCode.GPU_UNHEALTHY]
    assert "GPU 3 on n1 is unhealthy (xid-79)" in result.rejected[0].message
    assert cl.state_of(j) is JobState.PENDING


def test_the_gang_holding_it_is_requeued_without_using_a_retry() -> None:
    cl = one_node()
    cl.add(node("n2", gpus=8))
    j = cl.submit(job(replicas=2, gpu=8, retries=0))
    cl.run_pass()
    cl.start_all(j)
    on = cl.nodes_of(j)[0]
    result = report(cl, GpuFault(3, "ecc-dbe"), node_id=on)
    assert result.ok and result.stopped == (j,)
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert (record.retries_used, record.requeues) == (0, 1)
    assert record.reason.code is ReasonCode.REQUEUED_GPU_UNHEALTHY
    assert record.attempt is not None and record.attempt.state is AttemptState.REQUEUED
    assert f"GPU(s) 3 of node {on} turned unhealthy (ecc-dbe)" in render(record.reason)


def test_health_never_clears_by_itself_and_a_repair_clears_it() -> None:
    cl = one_node()
    report(cl, XID)
    first = cl.state.nodes["n1"].gpu_faults
    cl.now += 10_000
    again = report(cl, GpuFault(3, "xid-48"), GpuFault(5, "lost"))
    assert again.ok and "GPU 5 lost" in again.message and "GPU 3" not in again.message
    faults = cl.state.nodes["n1"].gpu_faults
    assert faults[0] == first[0]  # the first fault and its time stay
    assert [f.gpu for f in faults] == [3, 5]
    assert report(cl).message == "node n1: no new unhealthy GPU"
    assert cl.do(c.RepairGpus("n1", (3,), cl.now, "user:ops")).ok
    assert [f.gpu for f in cl.state.nodes["n1"].gpu_faults] == [5]
    assert cl.do(c.RepairGpus("n1", (), cl.now)).ok
    assert cl.state.nodes["n1"].gpu_faults == ()
    assert cl.state.nodes["n1"].free.gpu == 8


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        (GpuFault(8, "xid-79"), "gpu_faults[0].gpu: must be a GPU index from 0 to 7"),
        (GpuFault(-1, "xid-79"), "gpu_faults[0].gpu"),
        (GpuFault(1, "Xid 79"), "gpu_faults[0].code"),
        (GpuFault(1, ""), "gpu_faults[0].code"),
        (GpuFault(1, "lost", "\x1b[2J"), "gpu_faults[0].detail"),
        (GpuFault(1, "lost", "x" * 257), "gpu_faults[0].detail"),
    ],
)
def test_a_malformed_report_names_the_rule_and_changes_nothing(fault: GpuFault, words: str) -> None:
    cl = one_node()
    before = encode_state(cl.state)
    result = report(cl, fault)
    assert result.code is c.ResultCode.INVALID and words in result.message
    cl.state.applied_commands -= 1
    cl.state.last_time_ms = decode_state(before).last_time_ms
    assert encode_state(cl.state) == before


def test_a_gpu_named_twice_is_refused() -> None:
    cl = one_node()
    result = report(cl, GpuFault(2, "lost"), GpuFault(2, "xid-79"))
    assert result.code is c.ResultCode.INVALID and "GPU 2 is named twice" in result.message


def test_reports_and_repairs_for_unknown_nodes_or_gpus_are_refused() -> None:
    cl = one_node()
    assert report(cl, XID, node_id="n9").code is c.ResultCode.NOT_FOUND
    assert cl.do(c.RepairGpus("n9")).code is c.ResultCode.NOT_FOUND
    assert cl.do(c.RepairGpus("n1", (8,))).code is c.ResultCode.INVALID


def test_a_node_with_enough_unhealthy_gpus_is_drained() -> None:
    cl = one_node(gpu_drain_threshold=2)
    report(cl, XID)
    assert cl.state.nodes["n1"].status is NodeStatus.READY
    result = report(cl, GpuFault(5, "ecc-dbe"))
    assert "node draining" in result.message
    node = cl.state.nodes["n1"]
    # Nothing runs there, so the drain completes at once.
    assert node.status is NodeStatus.CORDONED
    assert node.status_reason.startswith("2 unhealthy GPUs (drain threshold 2)")


def test_faults_survive_the_codec_and_a_restart_of_the_worker() -> None:
    cl = one_node()
    report(cl, XID)
    assert decode_state(encode_state(cl.state)).nodes["n1"].gpu_faults == (
        cl.state.nodes["n1"].gpu_faults
    )
    # The worker registers again (a restart): the GPU stays unhealthy.
    assert cl.do(c.RegisterNode(node("n1", gpus=8), cl.now)).ok
    assert [f.gpu for f in cl.state.nodes["n1"].gpu_faults] == [3]
    # It comes back with fewer GPUs: the faults of GPUs it no longer has are dropped.
    assert cl.do(c.RegisterNode(node("n1", gpus=2), cl.now)).ok
    assert cl.state.nodes["n1"].gpu_faults == ()


def _reboot(cl: Cluster, boot_id: str) -> c.Result:
    info = dataclasses.replace(cl.state.nodes["n1"].info, boot_id=boot_id)
    return cl.do(c.RegisterNode(info, cl.now))


@pytest.mark.parametrize(
    ("switch", "before", "after", "cleared"),
    [
        (True, "boot-a", "boot-b", True),  # rebooted: its worker reports afresh
        (True, "boot-a", "boot-a", False),  # the worker restarted, the machine did not
        (True, "", "boot-b", False),  # no earlier boot known: not a reboot
        (True, "boot-a", "", False),  # a worker that does not say
        (False, "boot-a", "boot-b", False),  # the cluster keeps faults until a repair
    ],
)
def test_a_reboot_clears_gpu_faults_when_the_cluster_says_so(
    switch: bool, before: str, after: str, cleared: bool
) -> None:
    cl = one_node(clear_gpu_faults_on_reboot=switch)
    assert _reboot(cl, before).ok
    assert report(cl, XID).ok
    result = _reboot(cl, after)
    assert result.ok
    assert bool(cl.state.nodes["n1"].gpu_faults) is not cleared
    assert ("GPU 3 xid-79 cleared" in result.message) is cleared


def test_a_boot_id_that_breaks_the_rule_is_refused() -> None:
    cl = one_node()
    result = _reboot(cl, "boot id with spaces")
    assert result.code is c.ResultCode.INVALID and "boot_id" in result.message
