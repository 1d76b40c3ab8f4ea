"""Losing replicas: kill -9 of the leader under load, and a cold restart of all three."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import LocalCluster, job_spec, register_request, wait_for

pytestmark = pytest.mark.integration


class Submitter(threading.Thread):
    """Submits jobs one after another, remembering every acknowledged one."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(daemon=True)
        self.client = cluster.client(timeout_s=10.0, per_try_timeout_s=1.0)
        self.acked: dict[str, str] = {}  # request_id -> job_id
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set() and i < 100_000:
            request_id = f"stream-{i}"
            try:
                answer = self.client.submit_job(job_spec(f"stream-{i}"), request_id=request_id)
            except (ClusterUnavailable, grpc.RpcError) as exc:
                self.errors.append(str(exc))
                continue  # the same request id is retried on the next loop
            with self.lock:
                self.acked[request_id] = answer.job_id
            i += 1

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def answers(cluster: LocalCluster) -> dict[str, pb.ReplicaStatus]:
    """Each replica's own status, for every replica that answers (whatever the test
    believes about its process)."""
    seen = {}
    for r in cluster.replicas:
        try:
            seen[r.replica_id] = cluster.local_status(r)
        except grpc.RpcError:
            continue
    return seen


def agreed_leader(cluster: LocalCluster, killed: str) -> dict[str, pb.ReplicaStatus] | None:
    """The answering replicas' statuses once every one names the same leader other than
    ``killed`` and that leader says it leads; None before."""
    seen = answers(cluster)
    named = {s.leader_id for s in seen.values()}
    if len(named) != 1 or killed in named or "" in named:
        return None
    (leader_id,) = named
    leader = seen.get(leader_id)
    return seen if leader is not None and leader.role == "leader" else None


def test_killing_the_leader_loses_no_acknowledged_submission(
    fresh_cluster: LocalCluster,
) -> None:
    cluster = fresh_cluster
    cluster.start()
    old_leader = cluster.serving_leader()
    submitter = Submitter(cluster)
    submitter.start()
    try:
        wait_for("submissions to flow", lambda: submitter.count() >= 50)
        old_term = cluster.local_status(old_leader).term
        cluster.kill(old_leader)
        killed_at = submitter.count()
        seen = wait_for(
            "the live replicas to agree on a new leader",
            lambda: agreed_leader(cluster, old_leader.replica_id),
        )
        # The killed replica answers nobody, and no live replica names it as leader.
        assert old_leader.replica_id not in seen
        assert sorted(seen) == sorted(r.replica_id for r in cluster.followers(old_leader))
        (new_id,) = {s.leader_id for s in seen.values()}
        assert new_id != old_leader.replica_id
        # One new leader, elected in a later term, that every live replica follows.
        assert [rid for rid, s in seen.items() if s.role == "leader"] == [new_id]
        assert all(s.term > old_term for s in seen.values()), (old_term, seen)
        assert cluster.serving_leader().replica_id == new_id
        wait_for("submissions to resume", lambda: submitter.count() >= killed_at + 50)
    finally:
        submitter.stop.set()
        submitter.join(timeout=15)
    assert not submitter.is_alive()
    acked = dict(submitter.acked)

    with cluster.client() as client:
        present = {j.request_id: j.job_id for j in client.list_jobs()}
        lost = {r: j for r, j in acked.items() if present.get(r) != j}
        assert lost == {}
        # Retrying any acknowledged submission returns the job it created.
        for request_id in list(acked)[:: max(1, len(acked) // 20)]:
            again = client.submit_job(job_spec(request_id), request_id=request_id)
            assert again.job_id == acked[request_id]
            assert not again.created

    # The killed replica comes back and catches up with the others.
    cluster.start(old_leader)
    leader = cluster.serving_leader()
    target = cluster.local_status(leader).commit_index
    wait_for(
        "the restarted replica to catch up",
        lambda: cluster.local_status(old_leader).last_applied >= target,
        timeout_s=20,
    )


def test_a_cold_restart_of_every_replica_keeps_all_state(fresh_cluster: LocalCluster) -> None:
    cluster = fresh_cluster
    cluster.start()
    cluster.serving_leader()
    with cluster.client() as client:
        client.register_node(register_request("cold-node", "10.1.0.1", gpu=8))
        job_ids = [
            client.submit_job(job_spec(f"cold-{i}", gpu=8), request_id=f"cold-{i}").job_id
            for i in range(120)  # more than the compaction threshold: snapshots are used
        ]
        first = wait_for(
            "the first job to be bound",
            lambda: (j := client.get_job(job_ids[0])).state == "SCHEDULED" and j,
        )
        before = {j.job_id: j.state for j in client.list_jobs()}
        assert len(before) == len(job_ids)
    assert any(r.data_dir.joinpath("raft.dump").exists() for r in cluster.replicas)

    for replica in cluster.replicas:
        cluster.kill(replica)
    cluster.start()
    cluster.serving_leader(timeout_s=20)

    with cluster.client() as client:
        after = {j.job_id: j.state for j in client.list_jobs()}
        assert after == before
        again = client.get_job(job_ids[0])
        assert again.attempt.fencing_token == first.attempt.fencing_token
        assert [n.node_id for n in client.list_nodes()] == ["cold-node"]
        # Scheduling resumes: finish the running job and the next one gets the node.
        token = again.attempt.fencing_token
        for kind in (pb.MemberReport.STARTED, pb.MemberReport.EXITED):
            report = pb.MemberReport(job_id=job_ids[0], fencing_token=token, rank=0, kind=kind)
            client.heartbeat(pb.HeartbeatRequest(node_id="cold-node", reports=[report]))
        assert client.get_job(job_ids[0]).state == "SUCCEEDED"
        wait_for(
            "the next job to be bound after the restart",
            lambda: client.get_job(job_ids[1]).state == "SCHEDULED",
        )


def test_the_replica_refuses_bad_configuration(tmp_path: Path) -> None:
    root = tmp_path
    base = [sys.executable, "-m", "synapse_ha.programs.scheduler", "--id", "r1"]
    ok_replicas = [
        "--replica",
        "r1=127.0.0.1:1,127.0.0.1:2",
        "--replica",
        "r2=127.0.0.1:3,127.0.0.1:4",
        "--replica",
        "r3=127.0.0.1:5,127.0.0.1:6",
    ]
    unwritable = root / "file-not-dir"
    unwritable.write_text("x")
    cases = {
        "expected ID=RAFT_HOST:PORT,GRPC_HOST:PORT": [
            *base,
            "--replica",
            "r1@127.0.0.1",
            "--data-dir",
            str(root / "a"),
        ],
        "is not writable": [*base, *ok_replicas, "--data-dir", str(unwritable / "sub")],
        "dead_timeout": [
            *base,
            *ok_replicas,
            "--data-dir",
            str(root / "b"),
            "--dead-timeout",
            "5s",
        ],
        "is not host:port": [
            *base,
            "--replica",
            "r1=127.0.0.1,127.0.0.1:2",
            "--data-dir",
            str(root / "c"),
        ],
    }
    for expected, argv in cases.items():
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=30,
            env={
                "SYNAPSE_RAFT_PASSWORD": "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI=",
                "PATH": "/usr/bin:/bin",
            },
            check=False,
        )
        assert done.returncode == 2, (argv, done.stderr)
        assert expected in done.stderr, done.stderr
