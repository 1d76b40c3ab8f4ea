"""The replica set as the client library hands it out to admins: the members after a
membership change (:class:`ReplicaMember`) and what a backup was read from
(:class:`SavedSnapshot`)."""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


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
    return tuple(
        ReplicaMember(m.replica_id, m.raft_address, m.grpc_address, m.live) for m in msg.members
    )


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
    saved = SavedSnapshot(
        head.raft_index, head.raft_term, head.replica_id, head.total_bytes, head.sha256
    )
    return saved, data
