"""Floors and caps on members (core/spec/member_limits.py): what a node reserves per member, the
owners' member counts kept by apply through every way an attempt ends, the caps at plan
and at apply, and the format gate that keeps all of it off until every replica reads it.
Table tests through the harness; the random sequences are tests/core/test_properties.py's."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, Limits, PreemptionKind, Queue
from synapse_ha.core.codec import formats
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState, Resources
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked
from synapse_ha.core.spec.member_limits import (
    MEMBER_LIMITS_FORMAT,
    NO_RULES,
    member_counts,
    reserved_of,
    rules_in_force,
)
from tests.core.harness import Cluster, job, node

TINY = Resources(cpu_milli=1, memory_mib=1, gpu=0)


def tiny(name: str = "tiny", replicas: int = 1, queue: str = "default") -> c.SubmitJob:
    spec = dataclasses.replace(job(name, replicas=replicas, queue=queue), resources=TINY)
    return c.SubmitJob(spec, f"r-{name}", 1_000, owner="mallory")


def with_limits(cl: Cluster, **values: int) -> None:
    limits = dataclasses.replace(cl.state.config.limits, **values)
    assert cl.do(c.Configure(dataclasses.replace(cl.state.config, limits=limits), cl.now)).ok


def counts(cl: Cluster) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    index = member_counts(cl.state)
    return index.total, index.on_node


# ------------------------------------------------------------------------- floors


def test_a_member_reserves_the_floor_and_its_supervisor_but_keeps_its_request() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=8, memory_gib=8))
    job_id = cl.do(tiny()).job_id
    cl.run_pass()
    limits = Limits()
    reserved = Resources(
        limits.member_min_cpu_milli,
        limits.member_min_memory_mib + limits.member_overhead_memory_mib,
        0,
    )
    record = cl.state.jobs[job_id]
    assert record.spec.resources == TINY  # the member's limits are what it asked
    assert record.attempt is not None and record.attempt.reserved == reserved
    assert reserved_of(record) == reserved == cl.state.nodes["n1"].allocated
    # A member that asks for more than the floor reserves its request and the supervisor.
    big = cl.submit(job("big", cpu=2, memory_gib=1))
    cl.run_pass()
    assert reserved_of(cl.state.jobs[big]) == Resources(2_000, 1_024 + 4, 0)


def test_changing_the_floor_never_changes_what_a_bound_attempt_frees() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=8, memory_gib=8))
    first = cl.do(tiny("first")).job_id
    cl.run_pass()
    with_limits(cl, member_min_cpu_milli=1_000, member_overhead_memory_mib=0)
    second = cl.do(tiny("second")).job_id
    cl.run_pass()
    assert reserved_of(cl.state.jobs[second]) == Resources(1_000, 64, 0)
    for job_id in (first, second):
        cl.start_all(job_id)
        assert cl.exit_member(job_id, 0, 0).ok  # the harness checks the node's accounting
    assert cl.state.nodes["n1"].allocated == Resources()


def test_the_floor_counts_where_a_gang_could_ever_fit() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=4, memory_gib=1))
    whole = dataclasses.replace(job("whole"), resources=Resources(1, 1024, 0))
    result = cl.do(c.SubmitJob(whole, "r", cl.now))
    assert result.code is c.ResultCode.INVALID
    assert "a node reserves 0 GPU, 0.1 CPU, 1028 MiB per member" in result.message


# ---------------------------------------------------------------------- the counts


def test_the_counts_follow_bind_finish_requeue_preemption_and_cancel() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    assert cl.do(c.SetQueue(Queue("solo", gpu=16, priority_classes=("low", "high")), cl.now)).ok
    member_counts(cl.state)  # built now, then kept by apply

    def gang(name: str, owner: str, cls: str) -> str:
        spec = job(name, replicas=2, gpu=8, queue="solo", priority_class=cls)
        return cl.do(c.SubmitJob(spec, name, cl.now, owner=owner)).job_id

    low = gang("low", "ann", "low")
    cl.run_pass()
    assert counts(cl) == ({"ann": 2}, {"ann": {"n1": 1, "n2": 1}})
    cl.start_all(low)
    # Its node dies: requeued, nothing counted; bound again, counted again.
    on_n1 = next(m.rank for m in cl.state.jobs[low].attempt.members if m.node_id == "n1")
    assert cl.do(c.MarkNodeDead("n2", "gone", 1, cl.now)).ok
    assert cl.state_of(low) is JobState.PENDING and counts(cl) == ({}, {})
    assert cl.exit_member(low, on_n1, 137).ok  # the survivor confirmed stopped
    cl.add(node("n2", gpus=8))
    cl.run_pass()
    assert counts(cl) == ({"ann": 2}, {"ann": {"n1": 1, "n2": 1}})
    cl.start_all(low)
    # Preempted: counted until its members are confirmed stopped.
    high = gang("high", "bob", "high")
    victim = c.Victim(low, cl.state.jobs[low].fencing_token)
    assert cl.do(c.Preempt(high, 0, (victim,), PreemptionKind.PRIORITY, cl.now)).ok
    assert counts(cl)[0] == {"ann": 2}
    assert cl.exit_member(low, 0, 143).ok and cl.exit_member(low, 1, 143).ok
    assert counts(cl) == ({}, {})
    cl.run_pass()
    assert counts(cl) == ({"bob": 2}, {"bob": {"n1": 1, "n2": 1}})
    # Cancelled: nothing left counted.
    assert cl.do(c.CancelJob(high, now_ms=cl.now)).ok
    assert counts(cl) == ({}, {})


def test_a_snapshot_keeps_the_counts_it_was_taken_with() -> None:
    state = ClusterState(format_floor=formats.FORMAT)
    builder = SnapshotBuilder()
    for command in (
        c.RegisterNode(node("n1", gpus=0), 1),
        tiny("a"),
        tiny("b"),
    ):
        assert apply_tracked(state, command, builder.changes).ok
    plan_state = builder.take(state)
    bind = schedule(plan_state, 2).command(2)
    assert bind is not None
    member_counts(state)
    assert apply_tracked(state, bind, builder.changes).bound
    snap = builder.take(state)
    assert member_counts(snap).running("mallory") == 2
    assert apply_tracked(state, c.CancelJob("job-000001", now_ms=3), builder.changes).ok
    assert member_counts(state).running("mallory") == 1
    assert member_counts(snap).running("mallory") == 2  # the snapshot's own copy
    # A snapshot's copy is not kept by apply: a state made from one counts afresh.
    assert apply(snap, c.CancelJob("job-000002", now_ms=4)).ok
    assert snap._members is None and member_counts(snap).running("mallory") == 1


# ------------------------------------------------------------------------- the caps


def test_a_gang_larger_than_the_per_node_cap_spreads_over_nodes() -> None:
    cl = Cluster()
    cl.add(*(node(f"n{i}", gpus=0, cpu=8) for i in range(3)))
    with_limits(cl, members_per_node_per_user=1)
    three = cl.do(tiny("three", replicas=3)).job_id
    four = cl.do(tiny("four", replicas=4)).job_id
    cl.run_pass()
    assert sorted(cl.nodes_of(three)) == ["n0", "n1", "n2"]
    why = cl.state.jobs[four].reason
    assert why.code is ReasonCode.WAITING_MEMBER_CAP
    said = render(why)
    assert "limits.members_per_node_per_user: at most 1 of user mallory's members" in said
    assert "(3 node(s) have that many)" in said, said


def test_the_running_cap_waits_without_reserving_or_preempting() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=8))
    with_limits(cl, running_members_per_user=2)
    first = cl.do(tiny("first", replicas=2)).job_id
    cl.run_pass()
    waiting = cl.do(tiny("waiting")).job_id
    plan = cl.run_pass()
    assert plan.reservation is None and not plan.preemptions
    said = render(cl.state.jobs[waiting].reason)
    assert said == (
        "user mallory runs 2 member(s) and this gang has 1; limits.running_members_per_user "
        "allows 2; it waits for some of them to end"
    )
    cl.start_all(first)
    assert cl.exit_member(first, 0, 0).ok and cl.exit_member(first, 1, 0).ok
    cl.run_pass()
    assert cl.state_of(waiting) is JobState.SCHEDULED


def test_a_gang_larger_than_its_running_cap_is_refused_at_submit_and_an_array_is_not() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=8), node("n2", gpus=0, cpu=8))
    with_limits(cl, running_members_per_user=3)
    assert cl.do(c.SetQueue(Queue("small", running_members_per_user=1), cl.now)).ok
    jobs_before = dict(cl.state.jobs)
    refused = cl.do(tiny("wide", replicas=4))
    assert refused.code is c.ResultCode.INVALID
    assert refused.message == (
        "replicas: the gang has 4 members and limits.running_members_per_user allows a "
        "user 3 running at once: it could never start"
    )
    in_queue = cl.do(tiny("pair", replicas=2, queue="small"))
    assert "queue small's running_members_per_user allows a user 1" in in_queue.message
    assert cl.state.jobs == jobs_before  # refused: nothing changed
    assert cl.do(tiny("fits", replicas=3)).ok
    # An array counts task by task: 10 one-member tasks are each within the cap.
    array = dataclasses.replace(job("many", replicas=1), resources=TINY, array="0-9")
    assert cl.do(c.SubmitJob(array, "r-many", cl.now, owner="mallory")).ok


# -------------------------------------------------------------------- the format gate


def test_nothing_is_in_force_until_every_replica_reads_the_format() -> None:
    state = ClusterState()
    assert state.format_floor < MEMBER_LIMITS_FORMAT
    assert rules_in_force(state) is NO_RULES
    assert apply(state, c.RegisterNode(node("n1", gpus=0), 1)).ok
    assert apply(state, tiny()).ok
    assert NO_RULES.reserved(TINY) is TINY
    # Settings beyond the defaults are refused, and held back by the leader, until then.
    wanted = ClusterConfig(limits=Limits(running_members_per_user=5))
    refused = apply(state, c.Configure(wanted, now_ms=2))
    assert refused.code is c.ResultCode.CONFLICT and "needs format 10" in refused.message
    assert formats.held_back_config(wanted, state.config, state.format_floor) == state.config
    capped = apply(state, c.SetQueue(Queue("q", members_per_node_per_user=2), 2))
    assert capped.code is c.ResultCode.CONFLICT
    assert apply(state, c.RaiseFormat(MEMBER_LIMITS_FORMAT, (), 3)).ok
    assert rules_in_force(state).running_per_user == Limits().running_members_per_user
    assert apply(state, c.Configure(wanted, now_ms=4)).ok


@pytest.mark.parametrize("compact", [False, True])
def test_reservations_caps_and_limits_survive_the_codec(compact: bool) -> None:
    config = ClusterConfig(
        compact_state=compact, limits=Limits(member_min_cpu_milli=250, running_members_per_user=7)
    )
    cl = Cluster(state=ClusterState(config=config))
    cl.add(node("n1", gpus=0))
    assert cl.do(c.SetQueue(Queue("q", running_members_per_user=3), cl.now)).ok
    cl.do(tiny())
    cl.run_pass()
    decoded = decode_state(encode_state(cl.state))
    assert decoded == cl.state
    attempt = decoded.jobs["job-000001"].attempt
    assert attempt is not None and attempt.reserved == Resources(250, 68, 0)
    # What no replica of an older release could read is left out while at its default.
    assert b"reserved" not in encode_state(ClusterState())
    assert b"running_members_per_user" not in encode_state(ClusterState())
