"""Node health checks and a job's pre-start check on real processes: a worker whose
health-check program fails gets its node cordoned with the program's message and
uncordoned once it passes (an operator's cordon stays); a job whose pre-start check fails
on a node is requeued as the node's fault, never failed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobState, NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state, node_status
from tests.integration.cluster import wait_for
from tests.worker.one_replica import OneReplica, node, one_replica

pytestmark = pytest.mark.integration

CAPACITY = ["--cpu", "4", "--memory", "4Gi", "--mock-gpus", "0"]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OneReplica]:
    with one_replica(tmp_path) as made:
        yield made


def node_in(client: ClusterClient, node_id: str, status: NodeStatus) -> pb.Node | None:
    n = node(client, node_id)
    return n if n is not None and node_status(n) is status else None


def test_a_failing_health_check_cordons_the_node_until_it_passes(
    world: OneReplica, tmp_path: Path
) -> None:
    workers, client = world.workers, world.client
    sick = tmp_path / "sick"
    sick.write_text("disk /scratch full\n")
    script = tmp_path / "check.sh"
    script.write_text(f"if [ -s {sick} ]; then cat {sick}; exit 1; fi\necho fine\n")
    workers.start(
        "w1",
        *CAPACITY,
        "--health-check", f"/bin/sh {script}",
        "--health-check-interval", "300ms",
        "--health-check-timeout", "5s",
    )  # fmt: skip
    cordoned = wait_for("w1 cordoned", lambda: node_in(client, "w1", NodeStatus.CORDONED), 20)
    assert cordoned.status_reason == "health check failed: disk /scratch full"
    assert [(k.name, k.message) for k in cordoned.conditions] == [
        ("health-check", "disk /scratch full")
    ]
    events = [e for e in client.watch_events() if e.node_id == "w1"]
    assert ("node_check_failed", "health-check: disk /scratch full") in [
        (e.kind, e.detail) for e in events
    ]

    sick.write_text("")
    back = wait_for("w1 uncordoned", lambda: node_in(client, "w1", NodeStatus.READY), 10)
    assert list(back.conditions) == [] and back.status_reason == ""

    # An operator's cordon is the operator's: a failing, then passing check leaves it.
    client.set_node_status("w1", "cordon", "kernel upgrade")
    sick.write_text("ECC errors\n")

    def recorded() -> pb.Node | None:
        n = node(client, "w1")
        return n if n is not None and [k.message for k in n.conditions] == ["ECC errors"] else None

    assert wait_for("the condition recorded", recorded, 10).status_reason == "kernel upgrade"
    sick.write_text("")

    def cleared() -> bool:
        n = node(client, "w1")
        return n is not None and not n.conditions

    wait_for("the condition cleared", cleared, 10)
    kept = node_in(client, "w1", NodeStatus.CORDONED)
    assert kept is not None and kept.status_reason == "kernel upgrade"


def test_a_failing_prestart_check_requeues_the_gang_as_the_nodes_fault(
    world: OneReplica, tmp_path: Path
) -> None:
    workers, client = world.workers, world.client
    workers.start("w1", *CAPACITY)
    wait_for("w1 ready", lambda: node_in(client, "w1", NodeStatus.READY), 20)
    marker = tmp_path / "ran"
    spec = pb.JobSpec(
        name="needs-data",
        replicas=1,
        resources=pb.Resources(cpu_milli=500, memory_mib=64),
        shell_command=f"touch {marker}",
        prestart=pb.Prestart(
            command=["echo 'no /data mount' >&2; exit 1"], shell=True, timeout_ms=10_000
        ),
    )
    job_id = client.submit_job(spec).job_id

    def requeued() -> pb.Job | None:
        job = client.get_job(job_id)
        return job if job.requeues >= 1 else None

    job = wait_for("the gang to be requeued", requeued, 20)
    assert job.retries_used == 0
    assert job_state(job) is JobState.PENDING
    ended = [e for e in client.watch_events() if e.job_id == job_id and e.kind == "requeued"]
    assert [e.reason_code for e in ended] == ["requeued_node_cannot_run"], ended
    assert "prestart check failed: no /data mount" in job.attempt.outcome
    shown = node(client, "w1")
    assert shown is not None
    assert [u.owner for u in shown.unfit] == [job.owner]
    assert "prestart check failed: no /data mount" in shown.unfit[0].detail
    assert not marker.exists()  # the member itself never ran
