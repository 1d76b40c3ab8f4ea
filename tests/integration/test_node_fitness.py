"""The node's fault is never the job's (DESIGN §4), on real processes: a worker that has
no account for a job's owner reports the member it cannot start as the node's fault; the
gang is requeued without using a retry, that node skips the owner's gangs, and the gang
runs on a node that can run it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobState, NodeStatus
from synapse_ha.local.process import Worker
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state, node_status
from tests.integration.cluster import LocalCluster, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="runs worker agents as root with members as their owners' accounts: needs root",
    ),
]

OWNER = "alice"
MISSING_ACCOUNT = "syn-no-such-account"


@dataclass
class World:
    cluster: LocalCluster
    admin: ClusterClient
    alice: ClusterClient
    workers: list[Worker] = field(default_factory=list)

    def ready(self, node_id: str) -> bool:
        nodes = [n for n in self.admin.list_nodes() if n.node_id == node_id]
        return bool(nodes) and node_status(nodes[0]) is NodeStatus.READY


def _worker(cluster: LocalCluster, root: Path, node_id: str, account: str) -> Worker:
    worker = cluster.launcher.worker(
        cluster.grpc_addresses,
        node_id,
        root / node_id,
        extra=[
            "--run-as",
            "owner",
            "--user-map",
            f"{OWNER}={account}",
            "--mock-gpus",
            "0",
            "--no-cgroups",
            "--stop-grace",
            "1s",
        ],
    )
    cluster.launcher.start(worker)
    return worker


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    # Members run as another account: it must reach its member directory.
    root = Path(tempfile.mkdtemp(prefix="synapse-node-fitness-"))
    root.chmod(0o755)
    cluster = LocalCluster(root / "cluster", size=1)
    clients: list[ClusterClient] = []
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        admin = cluster.client(timeout_s=30.0)
        clients.append(admin)
        alice = cluster.client(timeout_s=30.0, token=admin.create_token(OWNER).token)
        clients.append(alice)
        w = World(cluster, admin, alice)
        w.workers.append(_worker(cluster, root, "w-bad", MISSING_ACCOUNT))
        w.workers.append(_worker(cluster, root, "w-good", "nobody"))
        for node_id in ("w-bad", "w-good"):
            wait_for(
                f"{node_id} to register",
                lambda n=node_id: w.ready(n),  # type: ignore[misc]
                30.0,
            )
        yield w
    finally:
        for client in clients:
            client.close()
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_node_without_the_owners_account_requeues_the_gang_to_one_with_it(
    world: World,
) -> None:
    w = world
    w.admin.set_node_status("w-good", "cordon", "until w-bad has tried")
    spec = pb.JobSpec(
        name="fit",
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64),
        shell_command="true",
    )
    job_id = w.alice.submit_job(spec).job_id

    def requeued() -> pb.Job | None:
        job = w.admin.get_job(job_id)
        return job if job.requeues >= 1 else None

    job = wait_for("the gang to be requeued", requeued, 30.0)
    # The job's reason moves on at the next pass; its last attempt keeps the outcome.
    assert job.retries_used == 0
    assert "could not be started by its node" in job.attempt.outcome
    assert f"has no account {MISSING_ACCOUNT}" in job.attempt.outcome
    # w-bad now skips alice's gangs: the job waits while w-good is cordoned.
    assert job_state(w.admin.get_job(job_id)) is JobState.PENDING
    w.admin.set_node_status("w-good", "uncordon")

    def done() -> pb.Job | None:
        job = w.admin.get_job(job_id)
        return job if job_state(job).finished else None

    job = wait_for("the gang to finish on w-good", done, 30.0)
    assert job_state(job) is JobState.SUCCEEDED, job.reason
    assert [m.node_id for m in job.attempt.members] == ["w-good"]
    assert (job.retries_used, job.requeues) == (0, 1)
