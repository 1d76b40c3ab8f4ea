"""A worker's report of its node checks (its health-check program): a failing check
becomes a condition of the node and cordons it while it was ready; once every check
passes again, a cordon the checks set is lifted. An operator's cordon or drain is never
changed, and running gangs are never stopped (a cordon only stops new placements)."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.health.fitness import CHECK_ACTOR, NodeCondition
from synapse_ha.core.health.node_checks import check_node_checks
from synapse_ha.core.lifecycle import NODE, transition
from synapse_ha.core.machine.changes import Changes, Handling
from synapse_ha.core.model import ClusterState, Node, NodeStatus
from synapse_ha.core.spec.validation import describe


def _report_node_checks(state: ClusterState, c: cmd.ReportNodeChecks, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    violations = check_node_checks(c.checks)
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    recorded = {k.name: k for k in node.conditions}
    for check in c.checks:
        if not check.failing:
            recorded.pop(check.name, None)
            continue
        before = recorded.get(check.name)
        since = before.since_ms if before is not None else now
        recorded[check.name] = NodeCondition(check.name, check.message, since)
    conditions = tuple(recorded[name] for name in sorted(recorded))
    if conditions == node.conditions:
        return ok(f"node {c.node_id}: checks unchanged")
    node.conditions = conditions
    return ok(f"node {c.node_id}: {follow_conditions(node)}")


def follow_conditions(node: Node) -> str:
    """Cordon a ready node with a condition; uncordon a node without any whose cordon
    the checks set; keep the cordon's reason current. Says what the node now is."""
    ours = node.status is NodeStatus.CORDONED and node.status_by == CHECK_ACTOR
    if node.conditions and (node.status is NodeStatus.READY or ours):
        after = transition(NODE, node.status, lc.NodeEvent.CORDON)
        if not isinstance(after, lc.Refusal):
            node.status = after
            node.status_reason = cordon_reason(node.conditions)
            node.status_by = CHECK_ACTOR
            return f"cordoned: {node.status_reason}"
    if not node.conditions and ours:
        after = transition(NODE, node.status, lc.NodeEvent.UNCORDON)
        if not isinstance(after, lc.Refusal):
            node.status = after
            node.status_reason = ""
            node.status_by = CHECK_ACTOR
            return "checks pass; uncordoned"
    if node.conditions:
        return f"{len(node.conditions)} check(s) failing; node stays {node.status.value}"
    return f"checks pass; node stays {node.status.value}"


def cordon_reason(conditions: tuple[NodeCondition, ...]) -> str:
    """``health check failed: <message>`` (each failing check's message, joined)."""
    messages = "; ".join(
        k.message if k.name == CHECK_ACTOR else f"{k.name}: {k.message}" for k in conditions
    )
    return f"health check failed: {messages}"


def _touches_checks(state: ClusterState, c: cmd.ReportNodeChecks, changes: Changes) -> None:
    changes.nodes.add(c.node_id)


HANDLERS: dict[type, Handling] = {
    cmd.ReportNodeChecks: Handling(_report_node_checks, _touches_checks),
}
