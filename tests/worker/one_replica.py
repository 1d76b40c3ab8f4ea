"""One scheduler replica with quick heartbeats, workers against it and an admin client:
the real-process setup of the worker's node-health tests. Everything it starts is
stopped on the way out, also when the test fails."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import LocalCluster
from tests.worker.workers import LocalWorkers

FAST_TIMEOUTS = ["--heartbeat-interval", "250ms", "--lease-ttl", "2s", "--leader-step-down", "1s"]


@dataclass(frozen=True)
class OneReplica:
    cluster: LocalCluster
    workers: LocalWorkers
    client: ClusterClient


@contextlib.contextmanager
def one_replica(root: Path, *replica_args: str) -> Iterator[OneReplica]:
    """The replica (``FAST_TIMEOUTS`` and ``replica_args``) serving, under ``root``."""
    cluster = LocalCluster(root / "cluster", size=1, extra_args=[*FAST_TIMEOUTS, *replica_args])
    try:
        cluster.start()
        cluster.serving_leader()
        workers = LocalWorkers(root / "workers", cluster.grpc_addresses, cluster.credentials)
        workers.root.mkdir()
        try:
            with cluster.client() as client:
                yield OneReplica(cluster, workers, client)
        finally:
            workers.close()
    finally:
        cluster.close()


def node(client: ClusterClient, node_id: str) -> pb.Node | None:
    return next((n for n in client.list_nodes() if n.node_id == node_id), None)
