"""A node the leader finds slow (:class:`~synapse_ha.core.commands.MarkNodeDegraded`).

The leader weighs the pace its workers report for each member
(:mod:`synapse_ha.core.health.slowness`) and proposes the mark with its evidence. Apply
records it as the node's ``degraded`` condition, the same record a failing node check
makes (:mod:`~synapse_ha.core.machine.apply_node_checks`): a ready node is cordoned with
the checks' identity, so new gangs avoid it, an operator's cordon or drain is kept, and
running gangs are not stopped. Only gangs with ``on_node_failure: replace`` leave it:
their members there are lost as a drain loses them (their worker, no longer asked to run
them, stops them and reports it; they are then placed again elsewhere), unless they are
all of the gang's running members.

Newly only: a node already degraded keeps its condition and its ``since``, and nothing
moves again. The mark is lifted as a condition is: the leader reports the ``degraded``
check passing once an operator has made the node ready again (``synctl uncordon``), and
a dead node that registers again comes back without conditions.
"""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.health.fitness import MAX_CHECK_MESSAGE, NodeCondition
from synapse_ha.core.health.slowness import DEGRADED, is_degraded
from synapse_ha.core.machine.apply_node_checks import follow_conditions
from synapse_ha.core.machine.attempts import settle_drained
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.machine.replacement import move_off
from synapse_ha.core.model import ClusterState, NodeStatus
from synapse_ha.core.reasons import ReasonCode, reason


def _mark_node_degraded(state: ClusterState, c: cmd.MarkNodeDegraded, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    if not c.evidence or len(c.evidence) > MAX_CHECK_MESSAGE or not c.evidence.isprintable():
        return error(ResultCode.INVALID, f"evidence: 1 to {MAX_CHECK_MESSAGE} printable characters")
    if node.status is NodeStatus.DEAD:
        return error(ResultCode.CONFLICT, f"node {c.node_id} is dead; it must register again")
    if is_degraded(node.conditions):
        return ok(f"node {c.node_id} was already degraded")
    mark = NodeCondition(DEGRADED, c.evidence, now)
    node.conditions = tuple(sorted((*node.conditions, mark), key=lambda k: k.name))
    said = f"node {c.node_id} degraded; {follow_conditions(node)}"
    moving = _moved_off(state, c, now)
    settle_drained(state, (c.node_id,))
    if moving:
        said += f"; {len(moving)} gang(s) will have their members here placed elsewhere"
    return ok(said, replacing=moving)


def _moved_off(state: ClusterState, c: cmd.MarkNodeDegraded, now: int) -> tuple[str, ...]:
    """The gangs with ``replace:`` that lose their members on the node, in job id order."""
    cause = reason(ReasonCode.NODE_DEGRADED, node=c.node_id, detail=c.evidence)
    return move_off(state, c.node_id, cause, now)


def _touches(state: ClusterState, c: cmd.MarkNodeDegraded, changes: Changes) -> None:
    changes.nodes.add(c.node_id)
    for job_id in state.jobs_on_node(c.node_id):  # gangs with replace: lose members there
        job_and_its_nodes(state, job_id, changes)


HANDLERS: dict[type, Handling] = {
    cmd.MarkNodeDegraded: Handling(_mark_node_degraded, _touches),
}
