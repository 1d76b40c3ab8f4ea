"""Five replicas on real processes survive two simultaneous kill -9."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from synapse_ha.core.codec.versioned import decode_state
from tests.integration.cluster import LocalCluster, Replica, job_spec, register_request, wait_for

pytestmark = pytest.mark.integration


def test_five_replicas_survive_two_simultaneous_kill_9(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, size=5)
    try:
        cluster.start()
        leader = cluster.serving_leader(timeout_s=30.0)
        with cluster.client(timeout_s=30.0) as client:
            client.register_node(register_request("n1", "127.0.0.1", gpu=8))
            before = [client.submit_job(job_spec(f"before-{i}")).job_id for i in range(10)]
            victims = [leader, cluster.followers(leader)[0]]
            # Both at once: one thread each, released together.
            go = threading.Barrier(len(victims))

            def kill(replica: Replica) -> None:
                go.wait(timeout=5.0)
                cluster.kill(replica, signal.SIGKILL)

            threads = [threading.Thread(target=kill, args=(v,)) for v in victims]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30.0)
            assert not any(v.alive for v in victims)

            new_leader = cluster.serving_leader(timeout_s=30.0)
            assert new_leader not in victims
            after = client.submit_job(job_spec("after-two-kills")).job_id
            survivors = [r for r in cluster.replicas if r.alive]
            assert len(survivors) == 3

            def converged() -> set[str] | None:
                states = [
                    decode_state(client.replica_state(r.grpc).encoded_state) for r in survivors
                ]
                jobs = [set(s.jobs) for s in states]
                return jobs[0] if all(j == jobs[0] for j in jobs) and after in jobs[0] else None

            jobs = wait_for("the three survivors agree", converged, timeout_s=30.0)
            # No acknowledged job lost.
            assert set(before) | {after} <= jobs
            status = client.cluster_status()
            assert len(status.replicas) == 5
            assert sum(1 for r in status.replicas if r.healthy) == 3
    finally:
        cluster.close()
