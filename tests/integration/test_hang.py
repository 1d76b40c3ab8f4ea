"""Hang detection on real processes (``progress:``): a one-replica cluster and one worker;
a member that touches its ``$SYNAPSE_PROGRESS_FILE`` and then stops is stopped by its
worker after the job's timeout and reported hung, and the job fails as hung (no retry
left), counted as the program's failure and not as a requeue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobState
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state
from tests.integration.cluster import one_worker_cluster, wait_for

pytestmark = pytest.mark.integration

ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
TOUCH_THEN_HANG = (
    'for i in 1 2 3; do touch "$SYNAPSE_PROGRESS_FILE"; sleep 0.2; done; exec sleep 300'
)


@pytest.fixture(scope="module")
def admin() -> Iterator[ClusterClient]:
    flags = ["--mock-gpus", "0", "--no-cgroups", "--stop-grace", "1s"]
    with one_worker_cluster("synapse-hang-", flags) as (_, client):
        yield client


def test_a_member_that_stops_making_progress_fails_the_job_as_hung(admin: ClusterClient) -> None:
    spec = pb.JobSpec(
        name="stuck",
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64),
        shell_command=TOUCH_THEN_HANG,
        progress=pb.Progress(timeout_ms=10_000),
    )
    job_id = admin.submit_job(spec).job_id

    def finished() -> pb.Job | None:
        job = admin.get_job(job_id)
        return job if job_state(job) in ENDED else None

    job = wait_for("the job to end", finished, 40.0)
    assert job_state(job) is JobState.FAILED
    assert job.reason_code == "failed_hung"
    assert (job.retries_used, job.requeues) == (0, 0)
    assert "rank 0 on w1 hung and was stopped, code 143: no progress for 10s" in job.reason
    assert "progress file not touched since 20" in job.reason
    assert "member started" not in job.reason  # its touches were seen
    assert job.spec.progress == pb.Progress(timeout_ms=10_000, source="file")
