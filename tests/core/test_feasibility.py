"""Jobs that can never fit: refused at submission with what is missing, unless they ask
to wait for nodes to join (core/feasibility.py); the check agrees with the scheduler."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.feasibility import NodeSummary, check, shortfall, summary_of
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, JobState, NodeStatus, Resources
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler.capacity import Table, View
from synapse_ha.core.scheduler.placement import Gang, fits, search_depths
from synapse_ha.core.snapshot import SnapshotBuilder
from synapse_ha.core.spec.member_limits import rules_in_force
from tests.core.harness import Cluster, job, node


def four_nodes() -> Cluster:
    cl = Cluster()
    cl.add(*(node(f"n{i}", gpus=8, cpu=64, memory_gib=512, rack=f"r{i % 2}") for i in range(4)))
    return cl


def refusal(cl: Cluster, spec: JobSpec) -> str:
    jobs_before = dict(cl.state.jobs)
    result = cl.do(c.SubmitJob(spec, f"r-{spec.name}-{len(cl.log)}", cl.now))
    assert result.code is c.ResultCode.INVALID, result.message
    assert cl.state.jobs == jobs_before  # nothing was made
    return result.message


def test_a_gpu_count_no_node_has_is_refused_with_the_largest() -> None:
    message = refusal(four_nodes(), job("big", gpu=9))
    assert message.startswith("resources.gpu: the job can never fit this cluster: ")
    assert "no node has 9 GPUs; the largest has 8" in message
    assert "wait_for_nodes: true" in message


def test_more_nodes_than_the_cluster_has_is_refused_with_the_count() -> None:
    message = refusal(four_nodes(), job("gang", replicas=5, gpu=8))
    assert "needs 5 nodes with 8 GPUs; the cluster has 4" in message
    assert message.startswith("replicas: ")


def test_a_required_rack_larger_than_any_rack_is_refused() -> None:
    message = refusal(four_nodes(), job("rack", replicas=3, gpu=8, required="rack"))
    assert "needs 3 nodes with 8 GPUs in one rack; the largest rack has 2" in message
    # Two fit in one rack: accepted.
    assert four_nodes().submit(job("rack2", replicas=2, gpu=8, required="rack"))


def test_a_gang_of_several_members_a_node_is_refused_with_the_room_for_members() -> None:
    cl = four_nodes()
    message = refusal(cl, job("many", replicas=40, gpu=1))
    assert "needs room for 40 members of 1 GPU; the cluster's nodes hold 32" in message
    message = refusal(cl, job("rack", replicas=20, gpu=1, required="rack"))
    assert "needs room for 20 members of 1 GPU in one rack; the roomiest rack holds 16" in message


def test_cpu_and_memory_no_node_has_are_refused() -> None:
    cl = four_nodes()
    assert "no node has 100 CPUs; the largest has 64" in refusal(cl, job("cpu", cpu=100))
    assert "no node has 1000 GiB of memory; the largest has 512 GiB" in refusal(
        cl, job("mem", memory_gib=1000)
    )


def test_a_shape_no_single_node_has_together_is_refused() -> None:
    cl = Cluster()
    cl.add(node("gpu", gpus=8, cpu=8), node("fat", gpus=0, cpu=128))
    message = refusal(cl, job("both", gpu=8, cpu=64))
    assert "no node has 8 GPUs, 64 CPUs and 1 GiB of memory together" in message


def test_an_image_needs_a_node_that_runs_images() -> None:
    message = refusal(four_nodes(), job("img", image="pytorch:2"))
    assert "no node runs container images" in message


def test_wait_for_nodes_accepts_and_the_reason_says_so_until_a_node_joins() -> None:
    cl = four_nodes()
    big = cl.submit(job("big", gpu=9, wait_for_nodes=True))
    plan = cl.run_pass()
    why = cl.state.jobs[big].reason
    assert why.code is ReasonCode.WAITING_FOR_NODES
    assert render(why) == "waits for nodes to join: no node has 9 GPUs yet; the largest has 8"
    assert plan.reasons[big] == why
    cl.add(node("n9", gpus=16))
    cl.run_pass()
    assert cl.state_of(big) is JobState.SCHEDULED


def test_a_job_that_fits_but_not_now_keeps_its_capacity_reason() -> None:
    cl = four_nodes()
    for i in range(4):
        cl.submit(job(f"hold-{i}", gpu=8))
    waits = cl.submit(job("waits", gpu=8))
    cl.run_pass()
    why = cl.state.jobs[waits].reason
    assert why.code is ReasonCode.FIRST_IN_LINE_RESERVED, why
    assert "waits for nodes" not in render(why)


def test_a_dead_node_still_counts_it_may_come_back() -> None:
    cl = four_nodes()
    assert cl.do(c.MarkNodeDead("n3", "silent", 1, cl.now)).ok
    assert cl.do(c.SetNodeStatus("n2", NodeStatus.CORDONED, "maintenance", cl.now)).ok
    assert cl.submit(job("gang", replicas=4, gpu=8))  # accepted: waits for them
    assert "the cluster has 4" in refusal(cl, job("gang5", replicas=5, gpu=8))


def test_a_node_reregistered_smaller_no_longer_counts_its_old_capacity() -> None:
    cl = four_nodes()
    assert cl.submit(job("fits", gpu=8, cpu=1))
    for i in range(4):  # every node comes back with 4 GPUs
        cl.add(
            dataclasses.replace(
                node(f"n{i}", rack=f"r{i % 2}"), capacity=Resources(64_000, 512 * 1024, 4)
            )
        )
    assert "no node has 8 GPUs; the largest has 4" in refusal(cl, job("fits2", gpu=8))


def test_an_array_whose_tasks_cannot_fit_is_refused_once_whole() -> None:
    cl = four_nodes()
    spec = dataclasses.replace(job("arr", gpu=9), array="0-99")
    message = refusal(cl, spec)
    assert "no node has 9 GPUs" in message
    assert cl.state.arrays == {}
    ok = cl.submit(dataclasses.replace(spec, wait_for_nodes=True))
    assert len(cl.state.arrays[ok].indices) == 100


def test_a_cluster_without_nodes_refuses_nothing() -> None:
    cl = Cluster()
    assert cl.submit(job("early", gpu=8, replicas=64))


def test_below_the_format_every_replica_refuses_alike_nothing_is_refused() -> None:
    state = ClusterState()  # format 2: a replica of an older release may still run
    assert apply(state, c.RegisterNode(node("n1", gpus=8), 1)).ok
    assert apply(state, c.SubmitJob(job("big", gpu=9), "r1", 2)).ok


def test_the_summary_is_kept_by_registrations_and_equals_a_fresh_one() -> None:
    cl = four_nodes()
    kept = summary_of(cl.state)
    assert summary_of(cl.state) is kept  # asked again: no work
    cl.add(node("n4", gpus=2, rack="r7"))
    newer = summary_of(cl.state)
    fresh = NodeSummary.build(cl.state.nodes.values(), cl.state.config.topology_levels)
    assert newer is not kept and (newer.shapes, newer.domains) == (fresh.shapes, fresh.domains)
    assert kept.shapes != newer.shapes  # the older summary was not changed under its readers


def test_a_snapshot_shares_the_summary_and_keeps_it_when_a_node_registers_later() -> None:
    cl = four_nodes()
    kept = summary_of(cl.state)
    builder = SnapshotBuilder()
    snap = builder.take(cl.state)
    assert summary_of(snap) is kept  # a scheduling pass asks the snapshot: nothing rebuilt
    cl.add(node("n1", gpus=16, rack="r1"))  # n1 registers again, larger
    assert summary_of(snap) is kept
    assert check(summary_of(cl.state), job("wide", gpu=16)) is None
    assert check(summary_of(snap), job("wide", gpu=16)) is not None
    assert summary_of(builder.take(cl.state)) is summary_of(cl.state)


# --------------------------------------------------- agreement with the scheduler

_levels = ("zone", "block", "rack")


@st.composite
def clusters_and_jobs(draw: st.DrawFn) -> tuple[ClusterState, JobSpec]:
    state = ClusterState(format_floor=FORMAT)
    count = draw(st.integers(1, 8))
    for i in range(count):
        info = node(
            f"h{i}",
            gpus=draw(st.sampled_from([0, 1, 2, 4, 8])),
            cpu=draw(st.sampled_from([1, 4, 16])),
            memory_gib=draw(st.sampled_from([1, 8, 64])),
            block=draw(st.sampled_from(["b1", "b2"])),
            rack=draw(st.sampled_from(["r1", "r2", "r3"])),
            features=draw(st.sampled_from([(), ("images",)])),
        )
        assert apply(state, c.RegisterNode(info, 1)).ok
    spec = job(
        "probe",
        replicas=draw(st.integers(1, 10)),
        gpu=draw(st.sampled_from([0, 1, 2, 3, 4, 8, 9])),
        cpu=draw(st.sampled_from([0.5, 1, 4, 16, 32])),
        memory_gib=draw(st.sampled_from([1, 8, 64, 128])),
        required=draw(st.sampled_from(["", "host", "rack", "block", "zone"])),
        image=draw(st.sampled_from(["", "img"])),
    )
    return state, spec


@settings(max_examples=300, deadline=None)
@given(clusters_and_jobs())
def test_the_check_accepts_exactly_what_the_scheduler_places_on_an_empty_cluster(
    case: tuple[ClusterState, JobSpec],
) -> None:
    state, spec = case
    assert apply(state, c.SubmitJob(dataclasses.replace(spec, wait_for_nodes=True), "r", 2)).ok
    gang_job = state.jobs["job-000001"]
    view = View(Table.build(state, empty=True))
    depths = search_depths(state, spec, len(state.config.topology_levels))
    # A member takes what its node reserves (the floor and its supervisor's share).
    reserved = rules_in_force(state).reserved(spec.resources)
    placeable = fits(Gang(gang_job, spec, reserved, spec.replicas), view, depths)
    short = shortfall(state, spec)
    assert (short is None) is placeable, short
    summary = NodeSummary.build(state.nodes.values(), _levels)
    assert (check(summary, spec, reserved) is None) is (short is None)
    asked = check(summary, spec)
    assert asked is None or asked == short  # a request that never fits is told as it is
