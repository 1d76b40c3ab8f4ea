"""Node checks as replicated state: a failing health check cordons a ready node with its
message, a passing one lifts only the cordon the check set, and a malformed report is an
error value that changes nothing."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.health.fitness import CHECK_ACTOR, NodeCheck, NodeCondition, conditions_differ
from synapse_ha.core.model import JobState, NodeStatus
from tests.core.harness import Cluster, job, node

FAILING = NodeCheck("health-check", True, "disk /scratch full")
PASSING = NodeCheck("health-check", False)


def one_node() -> Cluster:
    cl = Cluster()
    cl.add(node("n1", gpus=8))
    return cl


def report(cl: Cluster, *checks: NodeCheck, node_id: str = "n1") -> c.Result:
    return cl.do(c.ReportNodeChecks(node_id, checks, now_ms=cl.now))


def test_a_failing_check_cordons_a_ready_node_with_its_message() -> None:
    cl = one_node()
    cl.now = 7_000
    result = report(cl, FAILING)
    n1 = cl.state.nodes["n1"]
    assert result.ok, result.message
    assert n1.conditions == (NodeCondition("health-check", "disk /scratch full", 7_000),)
    assert n1.status is NodeStatus.CORDONED
    assert n1.status_reason == "health check failed: disk /scratch full"
    assert n1.status_by == CHECK_ACTOR
    j = cl.submit(job(gpu=1))
    cl.run_pass()
    assert cl.state_of(j) is JobState.PENDING


def test_running_gangs_keep_running_on_a_node_a_check_cordons() -> None:
    cl = one_node()
    j = cl.submit(job(gpu=1))
    cl.run_pass()
    cl.start_all(j)
    report(cl, FAILING)
    assert cl.state.nodes["n1"].status is NodeStatus.CORDONED
    assert cl.state_of(j) is JobState.RUNNING


def test_a_passing_check_clears_the_condition_and_lifts_its_own_cordon() -> None:
    cl = one_node()
    report(cl, FAILING)
    cl.now += 1_000
    result = report(cl, PASSING)
    n1 = cl.state.nodes["n1"]
    assert result.ok and "uncordoned" in result.message
    assert n1.conditions == ()
    assert n1.status is NodeStatus.READY
    assert n1.status_reason == ""


def test_a_new_message_keeps_since_and_updates_the_reason() -> None:
    cl = one_node()
    cl.now = 1_000
    report(cl, FAILING)
    cl.now = 2_000
    report(cl, NodeCheck("health-check", True, "ECC errors"))
    n1 = cl.state.nodes["n1"]
    assert n1.conditions == (NodeCondition("health-check", "ECC errors", 1_000),)
    assert n1.status_reason == "health check failed: ECC errors"


@pytest.mark.parametrize("status", [NodeStatus.CORDONED, NodeStatus.DRAINING])
def test_an_operators_cordon_or_drain_is_never_changed(status: NodeStatus) -> None:
    cl = one_node()
    j = cl.submit(job(gpu=1))  # keeps a draining node draining
    cl.run_pass()
    cl.start_all(j)
    assert cl.do(c.SetNodeStatus("n1", status, "kernel upgrade", cl.now, "user:ops")).ok
    report(cl, FAILING)
    n1 = cl.state.nodes["n1"]
    assert n1.conditions and n1.status is status
    assert (n1.status_reason, n1.status_by) == ("kernel upgrade", "user:ops")
    report(cl, PASSING)
    assert n1.conditions == ()
    assert n1.status is status
    assert (n1.status_reason, n1.status_by) == ("kernel upgrade", "user:ops")


def test_an_operator_uncordon_is_not_undone_by_the_same_failing_report() -> None:
    cl = one_node()
    report(cl, FAILING)
    assert cl.do(c.SetNodeStatus("n1", NodeStatus.READY, "", cl.now, "user:ops")).ok
    # The leader proposes only a report that differs from the conditions.
    assert not conditions_differ(cl.state.nodes["n1"].conditions, (FAILING,))
    report(cl, PASSING)
    assert cl.state.nodes["n1"].status is NodeStatus.READY
    assert cl.state.nodes["n1"].status_by == "user:ops"


def test_what_differs_from_the_conditions() -> None:
    recorded = (NodeCondition("health-check", "disk /scratch full", 5),)
    assert conditions_differ((), (FAILING,))
    assert not conditions_differ((), (PASSING,))
    assert not conditions_differ((), ())
    assert not conditions_differ(recorded, (FAILING,))
    assert conditions_differ(recorded, (NodeCheck("health-check", True, "other"),))
    assert conditions_differ(recorded, (PASSING,))
    assert not conditions_differ(recorded, ())  # a check not reported is left as it is


@pytest.mark.parametrize(
    ("checks", "field"),
    [
        ((NodeCheck("Health Check", True, "x"),), "checks[0].name"),
        ((NodeCheck("", True, "x"),), "checks[0].name"),
        ((NodeCheck("a" * 33, True, "x"),), "checks[0].name"),
        ((FAILING, PASSING), "checks[1].name"),
        ((NodeCheck("health-check", True, "x" * 257),), "checks[0].message"),
        ((NodeCheck("health-check", True, "two\nlines"),), "checks[0].message"),
    ],
)
def test_a_malformed_report_is_an_error_value_that_changes_nothing(
    checks: tuple[NodeCheck, ...], field: str
) -> None:
    cl = one_node()
    before = encode_state(cl.state)
    result = report(cl, *checks)
    assert result.code is c.ResultCode.INVALID
    assert field in result.message
    assert cl.state.nodes["n1"].conditions == ()
    assert cl.state.nodes["n1"].status is NodeStatus.READY
    assert before.count(b"conditions") == encode_state(cl.state).count(b"conditions") == 0


def test_an_unknown_node_is_not_found() -> None:
    cl = one_node()
    assert report(cl, FAILING, node_id="n9").code is c.ResultCode.NOT_FOUND


def test_conditions_survive_the_state_codec() -> None:
    cl = one_node()
    cl.now = 3_000
    report(cl, FAILING)
    state = decode_state(encode_state(cl.state))
    assert state.nodes["n1"].conditions == cl.state.nodes["n1"].conditions
    assert state.nodes["n1"].status_by == CHECK_ACTOR


def test_a_dead_node_that_comes_back_reports_its_checks_afresh() -> None:
    cl = one_node()
    report(cl, FAILING)
    cl.do(c.MarkNodeDead("n1", "silent", 1, cl.now))
    cl.add(node("n1", gpus=8))
    n1 = cl.state.nodes["n1"]
    assert n1.status is NodeStatus.READY and n1.conditions == ()
    assert conditions_differ(n1.conditions, (FAILING,))
    report(cl, FAILING)
    assert cl.state.nodes["n1"].status is NodeStatus.CORDONED


def test_checks_and_prestart_need_the_format_every_replica_reads() -> None:
    from synapse_ha.core.codec import formats
    from synapse_ha.core.health.prestart import Prestart
    from synapse_ha.core.machine import apply
    from synapse_ha.core.model import ClusterState

    state = ClusterState()  # a floor from before node checks
    assert apply(state, c.RegisterNode(node("n1", gpus=8), 1)).ok
    refused = apply(state, c.ReportNodeChecks("n1", (FAILING,), 2))
    assert refused.code is c.ResultCode.CONFLICT and "format 3" in refused.message
    assert state.nodes["n1"].conditions == () and state.nodes["n1"].status is NodeStatus.READY
    plain = job()
    checked = dataclasses.replace(plain, prestart=Prestart(("true",)))
    assert formats.format_needed(c.SubmitJob(plain, "r", 3)) == formats.BASE_FORMAT
    assert formats.format_needed(c.SubmitJob(checked, "r", 3)) == 3
