"""Scrape a real cluster's /metrics over mutual TLS: three replicas, two workers."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from tests.integration.cluster import wait_for
from tests.observe.world import fetch, gang, scrape, tls_context, wait_running, world

pytestmark = pytest.mark.integration


def test_replicas_and_workers_serve_metrics_over_mutual_tls(tmp_path: Path) -> None:
    with world(tmp_path, {"w1": "ra", "w2": "rb"}) as (cluster, workers):
        credentials = cluster.credentials
        assert credentials is not None
        with cluster.client() as client:
            job_id = client.submit_job(gang("metered", replicas=2, gpu=2)).job_id
            job = wait_running(client, job_id)
        (node,) = {m.node_id for m in job.attempt.members}
        rack = {"w1": "ra", "w2": "rb"}[node]
        leader = cluster.serving_leader()
        statuses = {r.replica_id: cluster.local_status(r) for r in cluster.replicas}
        assert all(s.metrics_url.startswith("https://127.0.0.1:") for s in statuses.values())
        assert all(s.dashboard_url.startswith("https://") for s in statuses.values())

        def leader_counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            got = scrape(statuses[leader.replica_id].metrics_url, credentials)
            return got if got[("synapse_scheduler_binds_total", ())] >= 1 else None

        got = wait_for("the leader to count the bind", leader_counted, timeout_s=30)
        me = (("replica", leader.replica_id),)
        assert got[("synapse_raft_role", (*me, ("role", "leader")))] == 1
        assert got[("synapse_jobs", (("queue", "default"), ("state", "RUNNING")))] == 1
        assert got[("synapse_nodes", (("status", "ready"),))] == 2
        assert got[("synapse_gpus", (("rack", rack), ("state", "used")))] == 4
        assert got[("synapse_scheduler_pass_duration_seconds_count", ())] >= 1
        assert got[("synapse_scheduler_decision_latency_seconds_count", ())] >= 1
        assert got[("synapse_raft_proposal_latency_seconds_count", ())] >= 1
        term = got[("synapse_raft_term", me)]
        for follower in cluster.followers(leader):
            theirs = scrape(statuses[follower.replica_id].metrics_url, credentials)
            labels = (("replica", follower.replica_id), ("role", "follower"))
            assert theirs[("synapse_raft_role", labels)] == 1
            assert theirs[("synapse_raft_term", (("replica", follower.replica_id),))] == term
            assert theirs[("synapse_jobs", (("queue", "default"), ("state", "RUNNING")))] == 1

        worker = next(w for w in workers.workers if w.node_id == node)
        on_node = scrape(f"https://{worker.metrics}/metrics", credentials)
        assert on_node[("synapse_worker_member_starts_total", ())] == 2
        assert on_node[("synapse_worker_members_running", ())] == 2
        assert on_node[("synapse_worker_heartbeat_round_trip_seconds_count", ())] >= 1
        assert not [name for name, _ in on_node if name.startswith("synapse_gpu_")]  # mock

        # Without a client certificate: the replica answers 401, the worker refuses the
        # handshake itself.
        anonymous = tls_context(credentials.ca, None)
        status, body = fetch(statuses[leader.replica_id].metrics_url, anonymous)
        assert status == 401, body
        with pytest.raises((ssl.SSLError, OSError)):
            fetch(f"https://{worker.metrics}/metrics", anonymous)
