"""What a use case needs from the replica it runs on: a small port, implemented over the
Raft replica by :class:`synapse_ha.rpc.server.context.ReplicaPort`, and by a stand-in
in tests."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
from contextlib import AbstractContextManager
from typing import Protocol

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.core.model import ClusterState
from synapse_ha.service.refusal import Refusal


class Replica(Protocol):
    def snapshot(self) -> ClusterState:
        """The newest applied state (an immutable snapshot)."""
        ...

    def reading(self) -> AbstractContextManager[ClusterState]:
        """The newest applied state, held still (applies wait) for the block: for O(1)
        reads on a hot path, where a snapshot's copy of the record dictionaries costs
        more than the read."""
        ...

    def cluster_config(self) -> ClusterConfig: ...

    def propose(self, command: cmd.Command) -> futures.Future[cmd.Result]:
        """Propose ``command`` (this replica must be the serving leader)."""
        ...

    def leader_refusal(self) -> Refusal | None:
        """None while this replica is the serving leader; else where to go (NOT_LEADER
        with the leader's id and address, LEADER_NOT_READY, NO_LEADER)."""
        ...

    def heard(self, node_id: str, now_ms: int) -> None:
        """Record that ``node_id``'s worker was heard at ``now_ms`` (liveness)."""
        ...

    def note_paces(self, node_id: str, paces: Sequence[PaceReport], now_ms: int) -> None:
        """Give the paces ``node_id``'s worker reported to the leader's slow-node
        collector (:mod:`synapse_ha.leader.slow_nodes`)."""
        ...

    def clock_ms(self) -> int: ...
