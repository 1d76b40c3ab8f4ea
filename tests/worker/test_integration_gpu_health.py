"""GPU health on real processes: a worker with mock GPUs reads a fault appended to its
``--mock-gpu-faults`` file, names the GPU in its heartbeats, and the leader requeues the
gang holding it (a disruption, no retry used) onto GPUs that are healthy. The fault is
sticky in the worker until it restarts; a restart and an operator's repair clear it."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.core.model import JobState, NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state, node_status
from tests.integration.cluster import wait_for
from tests.worker.one_replica import OneReplica, node, one_replica

pytestmark = pytest.mark.integration


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OneReplica]:
    with one_replica(tmp_path) as made:
        yield made


def ready(client: ClusterClient, node_id: str) -> bool:
    n = node(client, node_id)
    return n is not None and node_status(n) is NodeStatus.READY


def running_attempt(client: ClusterClient, job_id: str, number: int) -> pb.Job | None:
    job = client.get_job(job_id)
    live = job_state(job) is JobState.RUNNING and job.attempt.number >= number
    return job if live and job.attempt.members else None


def test_a_fault_in_the_mock_file_requeues_the_gang_off_the_gpu_until_repaired(
    world: OneReplica, tmp_path: Path
) -> None:
    workers, client = world.workers, world.client
    faults = tmp_path / "gpu-faults"
    args = ["--cpu", "4", "--memory", "4Gi", "--mock-gpus", "2", "--mock-gpu-faults", str(faults)]
    worker = workers.start("w1", *args)
    wait_for("w1 ready", lambda: ready(client, "w1"), timeout_s=20)
    spec = pb.JobSpec(
        name="holds-gpus",
        replicas=1,
        resources=pb.Resources(cpu_milli=500, memory_mib=64, gpu=1),
        shell_command="sleep 600",
    )
    job_id = client.submit_job(spec).job_id
    first = wait_for("the gang to run", lambda: running_attempt(client, job_id, 1), 20)
    [sick] = first.attempt.members[0].gpus
    with faults.open("a") as f:
        f.write(f"{sick} xid 79\n")

    def requeued() -> pb.Job | None:
        job = client.get_job(job_id)
        return job if job.requeues >= 1 else None

    job = wait_for("the gang to be requeued", requeued, timeout_s=10)
    assert (job.requeues, job.retries_used) == (1, 0)
    # The job's reason moves on at once (waiting for the stop, then running again): the
    # requeue's own reason is in the event it made.
    requeues = [e for e in client.watch_events() if e.job_id == job_id and e.kind == "requeued"]
    assert [e.reason_code for e in requeues] == ["requeued_gpu_unhealthy"], requeues
    shown = node(client, "w1")
    assert shown is not None
    assert [(f.gpu, f.code) for f in shown.gpu_faults] == [(sick, "xid-79")]
    assert "Xid 79" in shown.gpu_faults[0].detail
    again = wait_for("the gang to run again", lambda: running_attempt(client, job_id, 2), 20)
    assert list(again.attempt.members[0].gpus) == [1 - sick]  # the one healthy GPU left
    assert [m.node_id for m in again.attempt.members] == ["w1"]

    # Sticky until the worker restarts: a restarted worker (the GPU reset) stops naming
    # it, and the operator's repair then clears it for good.
    client.cancel_job(job_id, "done")
    workers.kill(worker, signal.SIGTERM)
    workers.launcher.start(worker)
    wait_for("w1 back", lambda: ready(client, "w1"), timeout_s=20)
    answer = client.repair_gpus("w1")
    repaired_at = time.monotonic()
    assert list(answer.gpu_faults) == [] and f"GPU {sick} xid-79" in answer.message

    def heard_twice_since_the_repair() -> pb.Node | None:
        # The newest heartbeat came a whole interval (250 ms) after the repair.
        shown = node(client, "w1")
        since_ms = (time.monotonic() - repaired_at) * 1000
        fresh = shown is not None and 0 <= shown.last_heartbeat_age_ms < since_ms - 250
        return shown if fresh else None

    shown = wait_for("two heartbeats after the repair", heard_twice_since_the_repair, 10)
    assert list(shown.gpu_faults) == []  # none named the GPU again


def test_a_reboot_clears_the_faults_when_the_cluster_says_so(tmp_path: Path) -> None:
    """A worker that registers from a new boot (its boot id changed) has its node's GPU
    faults cleared with ``--clear-gpu-faults-on-reboot``; a mere restart keeps them."""
    with one_replica(tmp_path / "rebooting", "--clear-gpu-faults-on-reboot") as world:
        client, workers = world.client, world.workers
        faults, boot = tmp_path / "gpu-faults", tmp_path / "boot_id"
        boot.write_text("boot-1\n")
        args = ["--mock-gpus", "2", "--mock-gpu-faults", str(faults), "--boot-id-file", str(boot)]
        worker = workers.start("w1", *args)
        wait_for("w1 ready", lambda: ready(client, "w1"), timeout_s=20)
        with faults.open("a") as f:
            f.write("1 xid 79\n")

        def faulty() -> list[int]:
            shown = node(client, "w1")
            return [f.gpu for f in shown.gpu_faults] if shown is not None else []

        def registered(marker: str) -> bool:
            leader = world.cluster.serving_leader()
            state = decode_state(client.replica_state(leader.grpc).encoded_state)
            return marker in state.nodes["w1"].info.features

        wait_for("GPU 1 unhealthy", lambda: faulty() == [1], timeout_s=10)
        # The same boot (a restart): once the new registration is applied (its feature
        # marks it), the fault is still there.
        workers.kill(worker, signal.SIGTERM)
        worker.argv = [*worker.argv, "--feature", "restarted"]
        workers.launcher.start(worker)
        wait_for("w1 registered again", lambda: registered("restarted"), timeout_s=20)
        assert faulty() == [1]
        # A new boot: the registration clears it.
        boot.write_text("boot-2\n")
        workers.kill(worker, signal.SIGTERM)
        workers.launcher.start(worker)
        wait_for("the fault cleared by the reboot", lambda: faulty() == [], timeout_s=20)
