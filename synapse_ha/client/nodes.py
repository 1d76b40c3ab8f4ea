"""The cluster's nodes as the client library hands them out: :class:`NodeView` (what
``ListNodes`` says of a node) and :class:`Repaired` (the answer to a GPU repair), built
of core values (:class:`~synapse_ha.core.model.Resources`, the health records of
:mod:`synapse_ha.core.health.fitness`) so that callers never read a protobuf message.

A node's status stays the text the server showed: a newer server may name a status this
library does not know, and it is shown as the server said it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.health.fitness import GpuFault, NodeCondition, Unfit
from synapse_ha.core.model import Resources
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the cluster shows it. ``topology`` holds (level, value) pairs as the
    node reported them; ``last_heartbeat_age_ms`` is None when the answering replica has
    not heard from the node (a follower, or a leader elected since); ``unfit`` includes
    expired entries (compare ``until_ms`` with the time)."""

    node_id: str
    address: str
    status: str
    status_reason: str
    capacity: Resources
    allocated: Resources
    allocated_gpus: tuple[int, ...]
    topology: tuple[tuple[str, str], ...]
    gpu_model: str
    registered_at_ms: int
    last_heartbeat_age_ms: int | None
    members_run_as: str
    member_isolation: str
    gpu_faults: tuple[GpuFault, ...]
    unfit: tuple[Unfit, ...]
    conditions: tuple[NodeCondition, ...]
    features: tuple[str, ...] = ()  # what a job's nodes.features selects
    spare: bool = False  # kept idle as a hot spare, for member replacements
    draining_for: str = ""  # the job whose gang a drain holds the node for ("": none)
    draining_until_ms: int = 0  # when that drain is estimated to complete (0: unknown)


@dataclass(frozen=True, slots=True)
class Repaired:
    """The cluster's answer to a GPU repair and the faults the node still has."""

    message: str
    gpu_faults: tuple[GpuFault, ...]


def resources_from_proto(msg: pb.Resources) -> Resources:
    return Resources(msg.cpu_milli, msg.memory_mib, msg.gpu)


def faults_from_proto(msgs: Iterable[pb.GpuFault]) -> tuple[GpuFault, ...]:
    """Faults as the cluster recorded them, with the time each began."""
    return tuple(GpuFault(m.gpu, m.code, m.detail, m.since_ms) for m in msgs)


def node_from_proto(msg: pb.Node) -> NodeView:
    return NodeView(
        node_id=msg.node_id,
        address=msg.address,
        status=states.shown_node_status(msg),
        status_reason=msg.status_reason,
        capacity=resources_from_proto(msg.capacity),
        allocated=resources_from_proto(msg.allocated),
        allocated_gpus=tuple(msg.allocated_gpus),
        topology=tuple((label.level, label.value) for label in msg.topology),
        gpu_model=msg.gpu_model,
        registered_at_ms=msg.registered_at_ms,
        last_heartbeat_age_ms=(
            msg.last_heartbeat_age_ms if msg.last_heartbeat_age_ms >= 0 else None
        ),
        members_run_as=msg.members_run_as,
        member_isolation=msg.member_isolation,
        features=tuple(msg.features),
        gpu_faults=faults_from_proto(msg.gpu_faults),
        unfit=tuple(Unfit(u.owner, u.detail, u.until_ms) for u in msg.unfit),
        conditions=tuple(NodeCondition(k.name, k.message, k.since_ms) for k in msg.conditions),
        spare=msg.spare,
        draining_for=msg.draining_for,
        draining_until_ms=msg.draining_until_ms,
    )


def repaired_from_proto(msg: pb.RepairGpusResponse) -> Repaired:
    return Repaired(msg.message, faults_from_proto(msg.gpu_faults))


def list_nodes(client: ClusterClient) -> list[NodeView]:
    """Every node the cluster knows, in the order it listed them."""
    return [node_from_proto(n) for n in client.list_nodes()]


def repair_gpus(client: ClusterClient, node_id: str, gpus: Sequence[int] = ()) -> Repaired:
    """Clear the faults of ``node_id``'s GPUs (``gpus`` empty: all of them)."""
    return repaired_from_proto(client.repair_gpus(node_id, gpus))
