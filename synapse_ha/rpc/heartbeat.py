"""A heartbeat at the wire, for the three shapes it arrives in (a unary
``HeartbeatRequest``, a ``WorkerMessage`` on a stream, a ``RelayedHeartbeat`` in a
follower's batch): the embedded ``Heartbeat`` read (or the flat fields of an earlier
release's sender) and converted to the use case's :class:`HeartbeatIn`
(:mod:`synapse_ha.service.heartbeat`), and what every answer carries besides the
acknowledgement (the node's status, its timeouts, its desired members)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.model import ClusterState, NodeStatus
from synapse_ha.core.spec.document import SpecError
from synapse_ha.rpc import from_proto, states, to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.service.heartbeat import HeartbeatIn
from synapse_ha.service.refusal import Refusal, invalid, required

# Any of the three shapes, or the embedded message itself: each has node_id, reports,
# gpu_faults and checks.
Shape = pb.HeartbeatRequest | pb.WorkerMessage | pb.RelayedHeartbeat


def heartbeat_message(shape: Shape) -> Any:
    """The heartbeat ``shape`` carries: its embedded ``heartbeat``, or, from a sender of
    an earlier release (which sends the flat fields only), the shape itself, read
    through the same field names. Never a copy."""
    return shape.heartbeat if shape.HasField("heartbeat") else shape


def heartbeat_in(message: pb.Heartbeat | Shape, node_id: str = "") -> HeartbeatIn | Refusal:
    """``message`` (a :func:`heartbeat_message`) as the use case's input, or why it is
    malformed (no node, a report that breaks a rule). ``node_id``: the node a stream
    speaks for (its later messages need not name it). Empty lists convert to nothing."""
    node_id = node_id or message.node_id
    if not node_id:
        return required("node_id")
    events = heartbeat_events(message.reports)
    if isinstance(events, Refusal):
        return events
    # Only the embedded form has paces (a flat shape is an earlier release's sender).
    paces = message.paces if isinstance(message, pb.Heartbeat) else ()
    return HeartbeatIn(
        node_id,
        events,
        from_proto.gpu_faults_from_proto(message.gpu_faults) if message.gpu_faults else (),
        from_proto.checks_from_proto(message.checks) if message.checks else (),
        from_proto.paces_from_proto(paces) if paces else (),
    )


def heartbeat_events(
    reports: Sequence[pb.MemberReport],
) -> tuple[cmd.MemberEvent, ...] | Refusal:
    """A heartbeat's (or a registration's) member reports as events, or the rule one
    breaks."""
    if not reports:
        return ()
    try:
        return from_proto.member_events_from_proto(list(reports))
    except SpecError as exc:
        return invalid(exc.violations)


def answer_fields(state: ClusterState, node_id: str) -> dict[str, Any]:
    """What every heartbeat answer says besides the desired members: the node's status
    (``dead`` once it is gone from the state) and the timeouts the worker keeps."""
    node = state.nodes.get(node_id)
    timeouts = state.config.timeouts
    return {
        **states.lease_status_fields(node.status if node else NodeStatus.DEAD),
        "lease_ttl_ms": timeouts.lease_ttl_ms,
        "heartbeat_interval_ms": timeouts.heartbeat_interval_ms,
    }


def desired_message(state: ClusterState, d: DesiredMember, now_ms: int) -> pb.DesiredMember:
    """A desired member, with the grace left before SIGKILL when its gang is being
    preempted (the attempt's deadline is the leader's clock; the worker gets a duration)."""
    msg = to_proto.desired_to_proto(d)
    job = state.jobs.get(d.job_id)
    attempt = job.attempt if job is not None else None
    if attempt is not None and attempt.fencing_token == d.fencing_token:
        to_proto.preemption_to_desired(msg, attempt, now_ms)
    return msg
