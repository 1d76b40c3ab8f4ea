"""Real processes: a member exits 0 while its worker cannot reach the leader, the node is
declared dead, the worker comes back and reports the exit; the job ends SUCCEEDED and no
second attempt runs (DESIGN §4, "no rerun after a lost success report")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.records import read_json
from tests.integration.cluster import LocalCluster, wait_for
from tests.worker.workers import LocalWorkers

pytestmark = pytest.mark.integration

TIMEOUTS = [
    "--heartbeat-interval",
    "250ms",
    "--lease-ttl",
    "2s",
    "--leader-step-down",
    "1s",
    "--dead-timeout",
    "5s",
]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster", extra_args=TIMEOUTS)
    try:
        c.start()
        c.serving_leader()
        yield c
    finally:
        c.close()


@pytest.fixture
def workers(cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalWorkers]:
    w = LocalWorkers(tmp_path / "workers", cluster.grpc_addresses, cluster.credentials)
    w.root.mkdir()
    try:
        yield w
    finally:
        for worker in w.workers:  # a test may have paused one
            worker.resume()
        w.close()


def test_an_exit_0_reported_after_the_node_was_declared_dead_ends_the_job_succeeded(
    workers: LocalWorkers, cluster: LocalCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("w1", "w2"):  # one CPU each: a gang of two needs both nodes
        workers.start(name, "--cpu", "1", "--memory", "1Gi", "--mock-gpus", "0")
    with cluster.client() as client:
        wait_for(
            "2 ready nodes",
            lambda: len([n for n in client.list_nodes() if n.status == "ready"]) == 2,
            timeout_s=30,
        )
        # Each member waits for the go file, then records that it ran and exits 0.
        command = (
            'while [ ! -e "$OUT/go" ]; do sleep 0.02; done; '
            'echo ran > "$OUT/ran-$SYNAPSE_ATTEMPT-$RANK"'
        )
        spec = pb.JobSpec(
            name="late",
            replicas=2,
            resources=pb.Resources(cpu_milli=1000, memory_mib=64),
            shell_command=command,
            env=[pb.EnvVar(name="OUT", value=str(out))],
        )
        job_id = client.submit_job(spec).job_id

        def running() -> pb.Job | None:
            job = client.get_job(job_id)
            started = all(m.state == "running" for m in job.attempt.members)
            return job if job.state == "RUNNING" and started else None

        job = wait_for("both members running", running, timeout_s=60)
        token = job.attempt.fencing_token
        victim_id = job.attempt.members[0].node_id
        victim = next(w for w in workers.workers if w.node_id == victim_id)
        # The victim's agent stops answering; its member finishes by itself meanwhile.
        victim.pause()
        (out / "go").touch()
        victim_dir = victim.data_dir / "members" / job_id
        wait_for(
            "the victim's member exit record",
            lambda: any(
                (r := read_json(d / "exit.json")) is not None and r["exit_code"] == 0
                for d in victim_dir.glob("a1.*")
            ),
            timeout_s=30,
        )
        wait_for(
            "the victim declared dead",
            lambda: any(n.node_id == victim_id and n.status == "dead" for n in client.list_nodes()),
            timeout_s=60,
        )
        requeued = client.get_job(job_id)
        assert requeued.state == "PENDING", requeued
        victim.resume()
        done = wait_for(
            "the job finished",
            lambda: (j := client.get_job(job_id)).state in {"SUCCEEDED", "FAILED"} and j,
            timeout_s=60,
        )
        assert done.state == "SUCCEEDED", done
        assert done.reason_code == "succeeded_after_node_death", done.reason
        assert done.attempts_made == 1
        assert sorted(p.name for p in out.glob("ran-*")) == ["ran-1-0", "ran-1-1"]
        assert done.attempt.fencing_token == token
