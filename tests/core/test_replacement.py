"""Member replacement (core/replacement.py, DESIGN §4): a gang with ``replace:`` loses only
the members on a dead node or a faulty GPU; each lost rank is placed again with the next
generation once its old member is known stopped, while the others run on."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.machine import apply
from synapse_ha.core.model import (
    ClusterState,
    JobSpec,
    JobState,
    MemberPlacement,
    MemberState,
    NodeStatus,
)
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.replacement import ReplacePolicy
from synapse_ha.core.scheduler.replacement import plan_replacements
from synapse_ha.core.spares import spare_nodes
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.views import desired_members, due_replacement_timeouts, due_start_timeouts
from tests.core.harness import Cluster, job, node


def replacing(spec: JobSpec, timeout_ms: int = 300_000, signal: str = "SIGUSR1") -> JobSpec:
    return dataclasses.replace(spec, replace=ReplacePolicy(timeout_ms, signal))


def running_gang(
    cluster: Cluster, replicas: int = 4, gpu: int = 8, required: str = "rack", **kw: object
) -> str:
    job_id = cluster.submit(replacing(job(replicas=replicas, gpu=gpu, required=required), **kw))
    cluster.run_pass()
    assert cluster.state_of(job_id) is JobState.SCHEDULED
    cluster.start_all(job_id)
    assert cluster.state_of(job_id) is JobState.RUNNING
    return job_id


def five_nodes() -> Cluster:
    cluster = Cluster()
    cluster.add(*(node(f"n{i}", rack="r1") for i in range(5)), node("far", rack="r2"))
    return cluster


def report(
    cluster: Cluster, job_id: str, rank: int, kind: c.MemberEventKind, **kw: int
) -> c.Result:
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    member = attempt.members[rank]
    event = c.MemberEvent(
        job_id,
        attempt.fencing_token,
        rank,
        kind,
        exit_code=kw.pop("code", 0),
        generation=kw.pop("generation", member.generation),
        cause=c.ExitCause.FENCED if kw.pop("fenced", 0) else c.ExitCause.PROGRAM,
    )
    return cluster.do(
        c.ReportMembers(kw.pop("node", None) or member.node_id, (event,), 7, cluster.now)
    )


def replace_now(cluster: Cluster) -> c.Result:
    command = plan_replacements(cluster.state, cluster.now)
    assert command is not None
    result = cluster.do(command)
    assert result.ok and not result.rejected, result
    return result


def test_a_dead_node_costs_the_gang_only_its_member_placed_again_with_the_next_generation() -> None:
    cluster = five_nodes()
    job_id = running_gang(cluster)
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    before = list(attempt.members)
    lost = before[2].node_id
    cluster.now += 20_000
    result = cluster.do(c.MarkNodeDead(lost, "silent", 1, cluster.now))
    assert result.replacing == (job_id,) and result.stopped == ()
    job = cluster.state.jobs[job_id]
    assert job.state is JobState.RUNNING and job.requeues == 0
    assert job.reason.code is ReasonCode.REPLACING and "rank(s) 2 lost" in render(job.reason)
    assert [(v.rank, v.stopped) for v in attempt.vacancies] == [(2, True)]
    # The other three run on, untouched.
    for rank in (0, 1, 3):
        assert attempt.member_status[rank].state is MemberState.RUNNING
        assert attempt.members[rank] == before[rank]
    replace_now(cluster)
    new = attempt.members[2]
    assert new.node_id not in {m.node_id for m in before} and new.node_id != "far"  # same rack
    assert new.generation == 1 and attempt.membership == 1 and not attempt.vacancies
    assert attempt.member_status[2].state is MemberState.BOUND
    assert attempt.member_status[2].bound_at_ms == cluster.now
    assert attempt.fencing_token == job.fencing_token and job.attempts_made == 1
    # The new member is wanted on its node with its generation; the others hear of it.
    (wanted,) = desired_members(cluster.state, new.node_id)
    assert (wanted.rank, wanted.generation, wanted.membership) == (2, 1, 1)
    survivor = desired_members(cluster.state, before[0].node_id)[0]
    assert survivor.membership == 1 and survivor.generation == 0
    assert survivor.member_hosts[2] == cluster.state.nodes[new.node_id].info.address
    assert survivor.membership_signal == "SIGUSR1"
    report(cluster, job_id, 2, c.MemberEventKind.STARTED)
    assert render(job.reason) == "attempt 1 running (1 member(s) placed again)"
    for rank in range(4):
        report(cluster, job_id, rank, c.MemberEventKind.EXITED)
    assert cluster.state_of(job_id) is JobState.SUCCEEDED


def test_without_replace_a_dead_node_requeues_the_whole_gang() -> None:
    cluster = five_nodes()
    job_id = cluster.submit(job(replicas=4, gpu=8, required="rack"))
    cluster.run_pass()
    cluster.start_all(job_id)
    lost = cluster.nodes_of(job_id)[1]
    result = cluster.do(c.MarkNodeDead(lost, "silent", 1, cluster.now))
    assert result.stopped == (job_id,) and result.replacing == ()
    assert cluster.state_of(job_id) is JobState.PENDING
    assert plan_replacements(cluster.state, cluster.now) is None


def test_a_gpu_fault_waits_for_the_old_member_to_stop_before_its_rank_is_placed_again() -> None:
    cluster = Cluster()
    cluster.add(node("a"), node("b"))
    job_id = running_gang(cluster, replicas=2, gpu=4, required="")
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    sick_node, sick_gpu = attempt.members[1].node_id, attempt.members[1].gpus[0]
    fault = GpuFault(sick_gpu, "xid-79", "fell off the bus")
    cluster.do(c.ReportGpuHealth(sick_node, (fault,), 1, cluster.now))
    assert cluster.state_of(job_id) is JobState.RUNNING
    assert [(v.rank, v.stopped) for v in attempt.vacancies] == [(1, False)]
    # Its worker is no longer asked to run it (so it stops it); nothing is placed yet.
    assert all(d.rank != 1 for d in desired_members(cluster.state, sick_node))
    assert plan_replacements(cluster.state, cluster.now) is None
    held = cluster.state.nodes[sick_node].allocated_gpus
    assert set(attempt.members[1].gpus) <= held  # still reserved until confirmed stopped
    report(cluster, job_id, 1, c.MemberEventKind.EXITED, code=143, fenced=1)
    assert cluster.state_of(job_id) is JobState.RUNNING and attempt.vacancies[0].stopped
    replace_now(cluster)
    new = attempt.members[1]
    assert new.generation == 1 and sick_gpu not in new.gpus
    assert attempt.member_status[1].exit_code is None


def test_a_report_of_an_old_generation_never_counts_for_the_new_one() -> None:
    cluster = Cluster()
    cluster.add(node("a", gpus=16))  # the rank is placed again on the same node
    job_id = running_gang(cluster, replicas=2, gpu=4, required="")
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    where = attempt.members[1].node_id
    fault = GpuFault(attempt.members[1].gpus[0], "xid-79", "")
    cluster.do(c.ReportGpuHealth(where, (fault,), 1, cluster.now))
    report(cluster, job_id, 1, c.MemberEventKind.EXITED, code=137, fenced=1)
    replace_now(cluster)
    assert attempt.members[1].generation == 1 and attempt.members[1].node_id == where
    # The old member's exit, reported again (at least once), is stale for generation 1,
    # even from the same node.
    result = report(cluster, job_id, 1, c.MemberEventKind.EXITED, code=1, generation=0, node=where)
    assert result.stale_events == 1 and cluster.state_of(job_id) is JobState.RUNNING
    assert attempt.member_status[1].state is MemberState.BOUND
    # The new generation's own failure is the job's.
    report(cluster, job_id, 1, c.MemberEventKind.EXITED, code=1)
    assert cluster.state_of(job_id) is JobState.FAILED


def refused(cluster: Cluster, command: c.ReplaceMembers) -> c.Rejection:
    before = encode_state(cluster.state)
    result = apply(cluster.state, command)
    assert result.ok and len(result.rejected) == 1, result
    cluster.state.applied_commands -= 1  # the only trace of a command applied
    assert encode_state(cluster.state) == before, "a refused replacement changed the state"
    return result.rejected[0]


def test_apply_refuses_a_replacement_that_breaks_a_rule_and_changes_nothing() -> None:
    cluster = Cluster()
    cluster.add(node("a"), node("b"), node("c"), node("d", rack="r2"))
    job_id = running_gang(cluster, replicas=2, gpu=8)
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    token = attempt.fencing_token
    lost = attempt.members[1].node_id
    free = ({"a", "b", "c"} - set(cluster.nodes_of(job_id))).pop()
    at = (c.MemberReplacement, job_id, token)

    def one(
        node_id: str, gen: int = 1, gpus: tuple[int, ...] = tuple(range(8))
    ) -> c.ReplaceMembers:
        return c.ReplaceMembers((at[0](job_id, token, MemberPlacement(1, node_id, gpus, gen)),), 1)

    assert refused(cluster, one(free)).code is c.RejectCode.STALE_PLAN  # nothing lost yet
    fault = GpuFault(0, "xid-48", "")
    cluster.do(c.ReportGpuHealth(lost, (fault,), 1, cluster.now))
    assert refused(cluster, one(free)).code is c.RejectCode.UNCONFIRMED_MEMBERS
    report(cluster, job_id, 1, c.MemberEventKind.EXITED, code=137, fenced=1)
    assert refused(cluster, one(free, gen=2)).code is c.RejectCode.STALE_PLAN
    assert refused(cluster, one("d")).code is c.RejectCode.TOPOLOGY_SPAN
    assert refused(cluster, one(attempt.members[0].node_id)).code is c.RejectCode.GPU_IN_USE
    assert refused(cluster, one(lost)).code is c.RejectCode.GPU_UNHEALTHY
    assert refused(cluster, one(free, gpus=(0,))).code is c.RejectCode.WRONG_GPU_COUNT
    other = c.MemberReplacement(job_id, token + 99, MemberPlacement(1, free, tuple(range(8)), 1))
    assert refused(cluster, c.ReplaceMembers((other,), 1)).code is c.RejectCode.STALE_PLAN
    result = cluster.do(one(free))
    assert not result.rejected and attempt.members[1].node_id == free


def test_a_rank_not_placed_within_its_timeout_requeues_the_gang_whole() -> None:
    cluster = Cluster()
    cluster.add(node("a"), node("b"))  # no third node: the lost rank has nowhere to go
    job_id = running_gang(cluster, replicas=2, gpu=8, required="", timeout_ms=60_000)
    lost = cluster.nodes_of(job_id)[0]
    cluster.do(c.MarkNodeDead(lost, "silent", 1, cluster.now))
    assert plan_replacements(cluster.state, cluster.now) is None
    token = cluster.state.jobs[job_id].fencing_token
    early = due_replacement_timeouts(cluster.state, cluster.now + 59_999)
    assert early == []
    from synapse_ha.core.views import replace_timeout_reason

    why = replace_timeout_reason(cluster.state.jobs[job_id], cluster.now + 60_000)
    assert why is not None
    refusal = apply(cluster.state, c.FailAttempt(job_id, token, why, 1, cluster.now + 59_000))
    assert not refusal.ok and "replace.timeout" in refusal.message
    (due,) = due_replacement_timeouts(cluster.state, cluster.now + 60_000)
    cluster.do(due)
    job = cluster.state.jobs[job_id]
    assert job.state is JobState.PENDING and job.requeues == 1 and job.retries_used == 0
    assert job.reason.code is ReasonCode.REQUEUED_REPLACE_TIMEOUT
    assert "not placed again within 60s" in render(job.reason)


def test_a_gang_that_loses_every_member_is_requeued_whole() -> None:
    cluster = Cluster()
    cluster.add(node("a"), node("b"))
    job_id = running_gang(cluster, replicas=2, gpu=4, required="host")
    (only,) = set(cluster.nodes_of(job_id))
    result = cluster.do(c.MarkNodeDead(only, "silent", 1, cluster.now))
    assert result.stopped == (job_id,) and cluster.state_of(job_id) is JobState.PENDING


def test_a_replaced_member_has_its_own_start_timeout() -> None:
    cluster = five_nodes()
    job_id = running_gang(cluster)
    timeout = cluster.state.config.start_timeout_ms
    cluster.now += timeout * 3
    cluster.do(c.MarkNodeDead(cluster.nodes_of(job_id)[3], "silent", 1, cluster.now))
    replace_now(cluster)
    assert due_start_timeouts(cluster.state, cluster.now + timeout - 1) == []
    (late,) = due_start_timeouts(cluster.state, cluster.now + timeout)
    assert "rank(s) 3" in render(late.reason)


def test_rank_zero_moved_takes_its_rendezvous_to_the_new_node() -> None:
    cluster = five_nodes()
    job_id = running_gang(cluster)
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    old = attempt.members[0].node_id
    port = attempt.master_port
    cluster.do(c.MarkNodeDead(old, "silent", 1, cluster.now))
    replace_now(cluster)
    new = attempt.members[0].node_id
    assert attempt.master_port in cluster.state.nodes[new].master_ports
    assert port not in cluster.state.nodes[old].master_ports
    wanted = desired_members(cluster.state, attempt.members[1].node_id)[0]
    assert wanted.master_addr == cluster.state.nodes[new].info.address


def test_replacement_needs_format_14() -> None:
    state = ClusterState(format_floor=13)  # a replica of the previous release is still a member
    refusal = apply(state, c.ReplaceMembers((), 1))
    assert not refusal.ok and "format 14" in refusal.message
    spec = replacing(job(replicas=2))
    submitted = apply(state, c.SubmitJob(spec, "r", 1))
    assert not submitted.ok and "format 14" in submitted.message


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("on_node_failure: restart", "on_node_failure: must be requeue (the default) or replace"),
        ("replace_timeout: 2m", "replace_timeout: needs on_node_failure: replace"),
        ("on_node_failure: replace\nmembership_signal: KILL", "membership_signal: must be one of"),
        ("on_node_failure: replace\nreplace_timeout: 0s", "replace_timeout: must be between"),
        ("on_node_failure: replace\nreplicas: 1", "needs a gang of 2 or more members"),
    ],
)
def test_a_job_document_with_a_bad_replacement_names_the_field_and_the_rule(
    text: str, rule: str
) -> None:
    doc = yaml.safe_load(f"name: a\ncommand: x\n{text}")
    doc.setdefault("replicas", 4)
    with pytest.raises(SpecError) as raised:
        parse_job_spec(doc)
    assert rule in str(raised.value)


def test_a_job_document_asks_for_replacement() -> None:
    doc = "name: a\nreplicas: 4\ncommand: x\non_node_failure: replace\nmembership_signal: none"
    spec = parse_job_spec(yaml.safe_load(doc)).spec
    assert spec.replace == ReplacePolicy(300_000, "")
    assert parse_job_spec({"name": "a", "replicas": 2, "command": "x"}).spec.replace is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("dfer"), st.integers(0, 7)), max_size=25))
def test_random_losses_never_run_two_generations_of_a_rank(steps: list[tuple[str, int]]) -> None:
    """Deaths, GPU faults, exit reports of lost members and replacements in any order:
    the invariants hold after every command (the harness checks them), a rank is never
    wanted on two nodes at once, and a lost rank is placed again only once stopped."""
    cluster = Cluster()
    cluster.add(*(node(f"n{i}", gpus=4, rack=f"r{i % 2}") for i in range(8)))
    jobs = [running_gang(cluster, replicas=2, gpu=4, required="rack") for _ in range(2)]
    for kind, pick in steps:
        cluster.now += 1_000
        name = f"n{pick}"
        if kind == "d" and cluster.state.nodes[name].status.value != "dead":
            cluster.do(c.MarkNodeDead(name, "silent", pick, cluster.now))
        elif kind == "f":
            cluster.do(c.ReportGpuHealth(name, (GpuFault(pick % 4, "xid-79", ""),), 1, cluster.now))
        elif kind == "e":
            for job_id in jobs:
                attempt = cluster.state.jobs[job_id].live_attempt()
                for v in attempt.vacancies if attempt else ():
                    if not v.stopped:
                        report(
                            cluster, job_id, v.rank, c.MemberEventKind.EXITED, code=143, fenced=1
                        )
        elif (command := plan_replacements(cluster.state, cluster.now)) is not None:
            assert not cluster.do(command).rejected
        wanted: dict[tuple[str, int], str] = {}
        for node_id in cluster.state.nodes:
            for d in desired_members(cluster.state, node_id):
                assert (d.job_id, d.rank) not in wanted, "a rank wanted on two nodes"
                wanted[d.job_id, d.rank] = node_id


def test_a_lost_rank_takes_a_hot_spare_of_its_rack_first() -> None:
    cluster = Cluster(state=ClusterState(config=ClusterConfig(spares=1)))
    # n0..n4 in r1 (one of them idle becomes r1's spare), and a tighter node that is not
    # a spare: without spares first, the tighter fit would win.
    cluster.add(*(node(f"n{i}", rack="r1") for i in range(5)))
    job_id = running_gang(cluster)
    (spare,) = spare_nodes(cluster.state)
    cluster.add(node("tight", rack="r1", gpus=8, cpu=9))
    cluster.do(c.MarkNodeDead(cluster.nodes_of(job_id)[1], "silent", 1, cluster.now))
    replace_now(cluster)
    assert cluster.nodes_of(job_id)[1] == spare


def test_a_member_placed_again_resumes_from_its_gangs_newest_checkpoint() -> None:
    cluster = five_nodes()
    job_id = running_gang(cluster)
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    for m in attempt.members:
        mark = c.MemberEvent(
            job_id,
            attempt.fencing_token,
            m.rank,
            c.MemberEventKind.CHECKPOINT,
            step=1200,
            mark_seq=1,
        )
        cluster.do(c.ReportMembers(m.node_id, (mark,), 1, cluster.now))
    cluster.do(c.MarkNodeDead(attempt.members[1].node_id, "silent", 1, cluster.now))
    replace_now(cluster)
    (new,) = desired_members(cluster.state, attempt.members[1].node_id)
    assert new.resume_step == 1200
    survivor = desired_members(cluster.state, attempt.members[0].node_id)[0]
    assert survivor.resume_step is None  # it started before any mark, and keeps running


def test_a_drain_moves_a_replacing_gangs_member_off_the_node() -> None:
    cluster = five_nodes()
    job_id = running_gang(cluster)
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    drained = attempt.members[3].node_id
    result = cluster.do(c.SetNodeStatus(drained, NodeStatus.DRAINING, "bios update", cluster.now))
    assert result.replacing == (job_id,)
    assert [(v.rank, v.stopped) for v in attempt.vacancies] == [(3, False)]
    assert "node " + drained + " was drained (bios update)" in render(
        cluster.state.jobs[job_id].reason
    )
    assert desired_members(cluster.state, drained) == []  # its worker stops it
    report(cluster, job_id, 3, c.MemberEventKind.EXITED, code=143, fenced=1)
    assert cluster.state.nodes[drained].status is NodeStatus.CORDONED  # the drain is done
    replace_now(cluster)
    assert attempt.members[3].node_id != drained and cluster.state_of(job_id) is JobState.RUNNING
