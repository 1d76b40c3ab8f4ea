"""The replica set as the client library hands it out: each replica's status and the
cluster's as a replica answered them (:class:`ClusterStatus`, ``synctl cluster``), the
members after a membership change (:class:`ReplicaMember`) and what a backup was read from
(:class:`SavedSnapshot`)."""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc import fields, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """One replica as it reported itself (``role`` as shown: ``leader``, ``follower``,
    ...; ``error`` when it could not be asked)."""

    replica_id: str
    role: str
    term: int
    commit_index: int
    last_applied: int
    leader_id: str
    healthy: bool
    grpc_address: str
    raft_address: str
    error: str
    format_version: int
    metrics_url: str
    dashboard_url: str


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """The cluster as the replica that answered (``answered_by``) sees it: the leader,
    the counts of nodes and jobs, the format every replica reads, and every replica."""

    leader_id: str
    leader_address: str
    answered_by: str
    nodes: int
    jobs: int
    pending_jobs: int
    running_jobs: int
    format_floor: int
    replicas: tuple[ReplicaStatus, ...]


def status_from_proto(msg: pb.GetClusterStatusResponse) -> ClusterStatus:
    replicas = tuple(
        fields.from_message(ReplicaStatus, r, role=states.shown_replica_role(r))
        for r in msg.replicas
    )
    return fields.from_message(ClusterStatus, msg, replicas=replicas)


def cluster_status(client: ClusterClient) -> ClusterStatus:
    """Any replica's view of the cluster (no leader needed)."""
    request = pb.GetClusterStatusRequest()
    answer: pb.GetClusterStatusResponse = client.ask("GetClusterStatus", request)
    return status_from_proto(answer)


@dataclass(frozen=True, slots=True)
class ReplicaMember:
    """A replica of the set; ``live`` as the leader sees it: reachable and caught up."""

    replica_id: str
    raft_address: str
    grpc_address: str
    live: bool


@dataclass(frozen=True, slots=True)
class SavedSnapshot:
    """Where a backup of the state was taken: the Raft index and term, the leader that
    read it, and the size and SHA-256 (hex) of the encoded state."""

    raft_index: int
    raft_term: int
    replica_id: str
    total_bytes: int
    sha256: str


def members_from_proto(msg: pb.MembershipResponse) -> tuple[ReplicaMember, ...]:
    return tuple(fields.from_message(ReplicaMember, m) for m in msg.members)


def add_replica(
    client: ClusterClient, replica_id: str, raft_address: str, grpc_address: str, timeout_s: float
) -> tuple[ReplicaMember, ...]:
    """Add a replica; the members once the change is committed."""
    return members_from_proto(
        client.add_replica(replica_id, raft_address, grpc_address, timeout_s=timeout_s)
    )


def remove_replica(
    client: ClusterClient, replica_id: str, timeout_s: float
) -> tuple[ReplicaMember, ...]:
    """Remove a replica; the members once the change is committed."""
    return members_from_proto(client.remove_replica(replica_id, timeout_s=timeout_s))


def save_snapshot(client: ClusterClient, timeout_s: float) -> tuple[SavedSnapshot, bytes]:
    """The leader's state, checked against the size and checksum it announced
    (``ValueError`` when they differ), and where it was read."""
    head, data = client.save_snapshot(timeout_s=timeout_s)
    return fields.from_message(SavedSnapshot, head), data
