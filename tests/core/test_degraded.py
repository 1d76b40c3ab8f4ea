"""A node found slow (MarkNodeDegraded): its ``degraded`` condition cordons it as a failing
check does, gangs with ``replace:`` move their members off it as a drain does, only at
format 15, and the condition clears as a check's does."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.health.fitness import CHECK_ACTOR, NodeCheck
from synapse_ha.core.health.slowness import DEGRADED
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState, NodeStatus
from synapse_ha.core.reasons import render
from synapse_ha.core.views import desired_members
from tests.core.harness import Cluster, job, node
from tests.core.test_replacement import five_nodes, replace_now, report, running_gang

EVIDENCE = "node n1: 23% slower than the median of its gang in 3 of its last 3 windows"


def mark(cluster: Cluster, node_id: str, evidence: str = EVIDENCE) -> c.Result:
    return cluster.do(c.MarkNodeDegraded(node_id, evidence, cluster.now))


def test_a_degraded_node_is_cordoned_with_its_evidence_and_running_gangs_stay() -> None:
    cluster = Cluster()
    cluster.add(node("n1", gpus=8))
    j = cluster.submit(job(gpu=1))
    cluster.run_pass()
    cluster.start_all(j)
    cluster.now = 9_000
    result = mark(cluster, "n1")
    n1 = cluster.state.nodes["n1"]
    assert result.ok, result.message
    assert [(k.name, k.message, k.since_ms) for k in n1.conditions] == [(DEGRADED, EVIDENCE, 9_000)]
    assert n1.status is NodeStatus.CORDONED and n1.status_by == CHECK_ACTOR
    assert cluster.state_of(j) is JobState.RUNNING  # without replace:, nothing moves
    other = cluster.submit(job(gpu=1))
    cluster.run_pass()
    assert cluster.state_of(other) is JobState.PENDING  # new gangs avoid it


def test_a_replacing_gang_moves_its_member_off_a_node_newly_degraded() -> None:
    cluster = five_nodes()
    job_id = running_gang(cluster)
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    slow = attempt.members[2].node_id
    result = mark(cluster, slow)
    assert result.replacing == (job_id,)
    assert [(v.rank, v.stopped) for v in attempt.vacancies] == [(2, False)]
    assert f"node {slow} was found slow" in render(cluster.state.jobs[job_id].reason)
    assert desired_members(cluster.state, slow) == []  # its worker stops it
    report(cluster, job_id, 2, c.MemberEventKind.EXITED, code=143, fenced=1)
    replace_now(cluster)
    assert attempt.members[2].node_id != slow
    assert cluster.state_of(job_id) is JobState.RUNNING
    # Marked again (a new leader's finding): the condition keeps its since, nothing moves.
    since = cluster.state.nodes[slow].conditions[0].since_ms
    cluster.now += 5_000
    again = mark(cluster, slow, "another sentence")
    assert again.ok and again.replacing == () and "already" in again.message
    assert cluster.state.nodes[slow].conditions[0].since_ms == since


def test_a_gang_all_on_the_degraded_node_stays_there() -> None:
    cluster = Cluster()
    cluster.add(node("n1", gpus=8), node("n2", gpus=8))
    job_id = running_gang(cluster, replicas=2, gpu=4, required="host")
    node_id = cluster.state.jobs[job_id].attempt.members[0].node_id  # type: ignore[union-attr]
    result = mark(cluster, node_id)
    assert result.ok and result.replacing == ()
    assert cluster.state_of(job_id) is JobState.RUNNING


def test_the_mark_needs_format_15_and_a_format_14_cluster_refuses_it_unchanged() -> None:
    command = c.MarkNodeDegraded("n1", EVIDENCE, 5)
    assert format_needed(command) == 15
    state = ClusterState()
    assert apply(state, c.RaiseFormat(14)).ok
    assert apply(state, c.RegisterNode(node("n1"), 1)).ok
    before = dataclasses.replace(state.nodes["n1"])
    result = apply(state, command)
    assert not result.ok and "format" in result.message
    assert state.nodes["n1"] == before


def test_bad_marks_are_error_values_that_change_nothing() -> None:
    cluster = Cluster()
    cluster.add(node("n1"))
    assert mark(cluster, "n9").code is c.ResultCode.NOT_FOUND
    refused = mark(cluster, "n1", "x" * 300)
    assert refused.code is c.ResultCode.INVALID and "evidence" in refused.message
    assert mark(cluster, "n1", "").code is c.ResultCode.INVALID
    assert mark(cluster, "n1", "two\nlines").code is c.ResultCode.INVALID
    assert cluster.state.nodes["n1"].conditions == ()
    assert cluster.state.nodes["n1"].status is NodeStatus.READY


def test_an_operators_cordon_is_kept_and_the_condition_clears_as_a_checks_does() -> None:
    cluster = Cluster()
    cluster.add(node("n1"))
    cluster.do(c.SetNodeStatus("n1", NodeStatus.CORDONED, "rma", cluster.now, "user:ops"))
    mark(cluster, "n1")
    n1 = cluster.state.nodes["n1"]
    assert n1.status is NodeStatus.CORDONED and n1.status_by == "user:ops"
    cluster.do(c.SetNodeStatus("n1", NodeStatus.READY, "", cluster.now, "user:ops"))
    cleared = cluster.do(c.ReportNodeChecks("n1", (NodeCheck(DEGRADED, False),), cluster.now))
    assert cleared.ok and n1.conditions == () and n1.status is NodeStatus.READY
    # Cordoned by the mark itself: clearing the condition lifts that cordon.
    mark(cluster, "n1")
    assert n1.status is NodeStatus.CORDONED
    cluster.do(c.ReportNodeChecks("n1", (NodeCheck(DEGRADED, False),), cluster.now))
    assert n1.status is NodeStatus.READY and n1.conditions == ()


def test_a_dead_node_cannot_be_marked() -> None:
    cluster = Cluster()
    cluster.add(node("n1"))
    cluster.do(c.MarkNodeDead("n1", "silent", 1, cluster.now))
    assert mark(cluster, "n1").code is c.ResultCode.CONFLICT
