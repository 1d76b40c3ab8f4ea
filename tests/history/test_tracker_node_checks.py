"""Node checks in the events stream: a check failing (or saying anew why), then passing,
before the cordon and uncordon they cause."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.health.fitness import NodeCheck
from synapse_ha.history.tracker import EventKind
from tests.core.harness import node
from tests.history.observed import ObservedCluster


def report(cl: ObservedCluster, *checks: NodeCheck) -> None:
    result = cl.do(c.ReportNodeChecks("n1", checks, now_ms=cl.now))
    assert result.ok, result.message


@pytest.mark.parametrize("everything", [False, True])
def test_a_check_failing_and_passing_are_events_of_the_node(everything: bool) -> None:
    cl = ObservedCluster(everything=everything)
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    before = len(cl.events)
    report(cl, NodeCheck("health-check", True, "disk full"))
    report(cl, NodeCheck("health-check", True, "disk full"))  # no change: no event
    report(cl, NodeCheck("health-check", True, "ECC errors"))
    report(cl, NodeCheck("health-check", False))
    events = [(str(e.kind), e.node_id, e.description) for e in cl.events[before:]]
    assert events == [
        ("node_check_failed", "n1", "health-check: disk full"),
        ("node_cordoned", "n1", "health check failed: disk full"),
        ("node_check_failed", "n1", "health-check: ECC errors"),
        ("node_check_passed", "n1", "health-check passes"),
        ("node_ready", "n1", ""),
    ]
    assert {e.kind for e in cl.events[before:]} <= set(EventKind)
