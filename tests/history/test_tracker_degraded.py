"""A node found slow in the events stream: its ``degraded`` condition is a failing check
with the evidence, before the cordon it causes; an operator's uncordon and the clearing
of the mark follow."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.health.fitness import NodeCheck
from synapse_ha.core.health.slowness import DEGRADED
from synapse_ha.core.model import NodeStatus
from tests.core.harness import node
from tests.history.observed import ObservedCluster

EVIDENCE = "node n1: 24% slower than the median of its gang in 3 of its last 3 windows"


@pytest.mark.parametrize("everything", [False, True])
def test_a_degraded_mark_and_its_clearing_are_events_of_the_node(everything: bool) -> None:
    cl = ObservedCluster(everything=everything)
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    before = len(cl.events)
    assert cl.do(c.MarkNodeDegraded("n1", EVIDENCE, cl.now)).ok
    assert cl.do(c.MarkNodeDegraded("n1", EVIDENCE, cl.now)).ok  # already: no event
    assert cl.do(c.SetNodeStatus("n1", NodeStatus.READY, "", cl.now, "user:ops")).ok
    assert cl.do(c.ReportNodeChecks("n1", (NodeCheck(DEGRADED, False),), cl.now)).ok
    events = [(str(e.kind), e.node_id, e.description) for e in cl.events[before:]]
    assert events == [
        ("node_check_failed", "n1", f"degraded: {EVIDENCE}"),
        ("node_cordoned", "n1", f"health check failed: degraded: {EVIDENCE}"),
        ("node_ready", "n1", ""),
        ("node_check_passed", "n1", "degraded passes"),
    ]
