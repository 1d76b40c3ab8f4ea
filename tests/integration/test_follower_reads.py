"""Follower reads on three real replicas (docs/consistency.md): a client whose reads go
first to a follower always reads its own writes, also right after them and after the
follower was paused while they were committed, and the follower does serve reads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import LocalCluster, job_spec

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster")
    try:
        c.start()
        c.serving_leader(timeout_s=60)
        yield c
    finally:
        for r in c.replicas:
            if r.paused:
                r.resume()
        c.close()


def test_a_client_reads_its_writes_from_a_follower(cluster: LocalCluster) -> None:
    leader = cluster.serving_leader(timeout_s=30)
    follower = next(r for r in cluster.replicas if r is not leader)
    # The follower is the only address given: it is the client's home for reads, and
    # writes find the leader through its redirect.
    with ClusterClient(
        [follower.grpc],
        timeout_s=20.0,
        per_try_timeout_s=2.0,
        channel_factory=cluster.transport.channel,
        follower_reads=True,
    ) as client:
        served_by_follower = 0
        for i in range(30):
            if i == 20:
                follower.pause()  # misses the next write's entries altogether
            job_id = client.submit_job(job_spec(f"ryw-{i}")).job_id
            token = client.read_token.index
            if i == 20:
                time.sleep(0.1)
                follower.resume()
            answer = client.ask("GetJob", pb.GetJobRequest(job_id=job_id))
            assert answer.job.job_id == job_id  # never NOT_FOUND: its own write
            assert client.read_token.index >= token
            served_by_follower += answer.stale
            listed = client.list_jobs(states=[])
            assert job_id in {j.job_id for j in listed}
        assert served_by_follower >= 10, served_by_follower
