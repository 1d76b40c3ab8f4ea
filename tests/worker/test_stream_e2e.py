"""Heartbeat streams end to end: real replicas (TLS) and a real synapse-worker.

With a heartbeat interval far longer than the waits here, a member can only start within
them because the leader pushed it on the worker's stream (or, for a worker without a
stream, nudged it); the worker's log says which path delivered it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import LocalCluster, wait_for
from tests.worker.workers import LocalWorkers

pytestmark = pytest.mark.integration

SLOW_HEARTBEATS = [
    "--heartbeat-interval",
    "60s",
    "--lease-ttl",
    "120s",
    "--leader-step-down",
    "60s",
    "--dead-timeout",
    "300s",
]


def _run(tmp_path: Path, extra: list[str]) -> Iterator[tuple[LocalCluster, LocalWorkers]]:
    cluster = LocalCluster(tmp_path / "cluster", extra_args=[*SLOW_HEARTBEATS, *extra])
    workers = LocalWorkers(tmp_path / "workers", [], cluster.credentials)
    try:
        cluster.start()
        cluster.serving_leader()
        workers.schedulers = cluster.grpc_addresses
        workers.root.mkdir()
        workers.start("w1", "--cpu", "1", "--memory", "1Gi", "--mock-gpus", "0")
        yield cluster, workers
    finally:
        workers.close()
        cluster.close()


@pytest.fixture
def streamed(tmp_path: Path) -> Iterator[tuple[LocalCluster, LocalWorkers]]:
    yield from _run(tmp_path, [])


@pytest.fixture
def unstreamed(tmp_path: Path) -> Iterator[tuple[LocalCluster, LocalWorkers]]:
    # Replicas that serve no heartbeat streams (as a release before them).
    yield from _run(tmp_path, ["--agent-address", ""])


def _submit_and_wait(
    cluster: LocalCluster, workers: LocalWorkers, out: Path, first_heartbeat: str
) -> None:
    with cluster.client() as client:
        wait_for("the worker to register", lambda: len(client.list_nodes()) == 1, 60)
        wait_for(
            "the worker's first heartbeat",
            lambda: first_heartbeat in workers.workers[0].log_tail(20_000),
            30,
        )
        spec = pb.JobSpec(
            name="pushed",
            replicas=1,
            resources=pb.Resources(cpu_milli=100, memory_mib=16),
            shell_command=f"touch {out}",
        )
        client.submit_job(spec)
        # Well inside the 60 s until the worker's next heartbeat.
        wait_for("the member to start", out.exists, timeout_s=30)


def test_a_bound_member_is_pushed_on_the_stream_and_starts_before_the_next_heartbeat(
    streamed: tuple[LocalCluster, LocalWorkers], tmp_path: Path
) -> None:
    cluster, workers = streamed
    # Logged once the first heartbeat on the stream is acknowledged.
    _submit_and_wait(cluster, workers, tmp_path / "started", "heartbeats on a stream")
    wait_for(
        "the push to be logged",
        lambda: "pushed: started 1 member(s)" in workers.workers[0].log_tail(50_000),
        10,
    )


def test_against_replicas_without_streams_the_worker_keeps_unary_heartbeats(
    unstreamed: tuple[LocalCluster, LocalWorkers], tmp_path: Path
) -> None:
    cluster, workers = unstreamed
    _submit_and_wait(cluster, workers, tmp_path / "started", "registered")
    log = workers.workers[0].log_tail(50_000)
    assert "heartbeats on a stream" not in log
    assert "pushed:" not in log
