"""A synapse_ha cluster on 127.0.0.1 for the start-latency benchmarks.

Three scheduler replicas and mock-GPU ``synapse-worker`` agents, started and torn down
together; members of the measured gangs write the wall-clock time they started to a file
(``date +%s.%N``), read back with :func:`read_stamps`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from synapse_ha.rpc.client import ClusterClient
from tests.integration.cluster import LocalCluster, wait_for
from tests.worker.workers import LocalWorkers


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (0 <= q <= 1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def read_stamps(paths: list[Path], deadline: float) -> list[float]:
    """Every member's start time, once all have written theirs; bounded by ``deadline``."""
    while True:
        try:
            return [float(p.read_text()) for p in paths]
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"members did not start in time: {paths[0].name}...") from None
            time.sleep(0.002)


@contextlib.contextmanager
def loopback_cluster(
    root: Path, heartbeat: str, workers: Sequence[tuple[str, Sequence[str]]]
) -> Iterator[ClusterClient]:
    """Start 3 replicas and one agent per ``(node_id, extra_args)``; yield a client.

    Returns once every agent has registered; stops every process on the way out.
    """
    cluster = LocalCluster(
        root / "cluster",
        extra_args=["--heartbeat-interval", heartbeat, "--log-level", "WARNING"],
    )
    agents = LocalWorkers(root / "workers", [])
    try:
        cluster.start()
        cluster.serving_leader()
        agents.schedulers = cluster.grpc_addresses
        agents.root.mkdir(parents=True)
        for node_id, args in workers:
            agents.start(node_id, *args, "--log-level", "WARNING")
        with cluster.client() as client:
            wait_for(
                "workers to register",
                lambda: len(client.list_nodes()) == len(workers),
                timeout_s=60,
            )
            yield client
    finally:
        agents.close()
        cluster.close()
