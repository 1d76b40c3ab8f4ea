"""The Python client against a real cluster (one replica, one worker): submit from a
mapping and from a file, wait, read and follow logs, list, cancel, idempotent resubmits,
the typed errors, and examples/pipeline.py run as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.client import (
    AccessDenied,
    Cluster,
    ClusterUnreachable,
    InvalidSpec,
    JobNotFound,
    JobState,
    WaitTimedOut,
)
from tests.integration.cluster import LocalCluster, admin_python_client, python_client_cluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"gpu": 0, "cpu": "100m", "memory": "64Mi"}


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    with python_client_cluster("synapse-pyclient-") as cluster:
        yield cluster


@pytest.fixture
def cluster(local: LocalCluster) -> Iterator[Cluster]:
    with admin_python_client(local) as client:
        yield client


def spec(name: str, command: str, replicas: int = 1) -> dict[str, object]:
    return {"name": name, "replicas": replicas, "resources": SMALL, "command": command}


def test_submit_wait_and_read_the_output(cluster: Cluster) -> None:
    job = cluster.submit(spec("py-hello", 'echo "hello from $RANK"; echo second', replicas=2))
    assert job.created
    info = job.wait(timeout_s=60)
    assert info.succeeded and info.state is JobState.SUCCEEDED
    assert (info.id, info.name, info.attempt) == (job.id, "py-hello", 1)
    assert sorted(m.rank for m in info.members) == [0, 1]
    lines = sorted(str(line) for line in job.logs())
    assert lines == [
        "[rank 0] hello from 0",
        "[rank 0] second",
        "[rank 1] hello from 1",
        "[rank 1] second",
    ]
    assert [line.text for line in job.logs(member=1)] == ["hello from 1", "second"]
    listed = cluster.jobs(state="all", name="py-hello")
    assert [j.id for j in listed] == [job.id]
    assert job.id not in [j.id for j in cluster.jobs()]  # finished: not active


def test_following_yields_lines_as_they_are_written_until_the_end(cluster: Cluster) -> None:
    job = cluster.submit(spec("py-follow", "for i in 1 2 3; do echo step $i; sleep 0.5; done"))
    texts = [line.text for line in job.logs(follow=True)]
    assert texts == ["step 1", "step 2", "step 3"]
    assert job.info().state is JobState.SUCCEEDED


def test_the_same_request_id_returns_the_same_job(cluster: Cluster) -> None:
    first = cluster.submit(spec("py-idem", "true"), request_id="py-idem-1")
    again = cluster.submit(spec("py-idem", "true"), request_id="py-idem-1")
    assert (again.id, again.created) == (first.id, False)
    assert len(cluster.jobs(state="all", name="py-idem")) == 1


def test_submit_many_makes_each_job_once_in_calls_of_a_batch(cluster: Cluster) -> None:
    specs = [{**spec(f"py-many-{i}", f"echo {i}"), "request_id": f"py-many-{i}"} for i in range(5)]
    jobs = cluster.submit_many(specs, batch=2)  # three SubmitJobs calls
    assert [j.created for j in jobs] == [True] * 5
    assert [j.info().name for j in jobs] == [f"py-many-{i}" for i in range(5)]
    again = cluster.submit_many(specs)
    assert [(j.id, j.created) for j in again] == [(j.id, False) for j in jobs]
    for i, job in enumerate(jobs):
        assert job.wait(timeout_s=60).succeeded
        assert [line.text for line in job.logs()] == [str(i)]
    with pytest.raises(InvalidSpec) as caught:
        cluster.submit_many([spec("fine", "true"), {"name": "x", "replicas": 0, "command": "true"}])
    assert caught.value.field == "replicas"  # checked here: nothing was sent
    assert cluster.jobs(state="all", name="fine") == []


def test_cancel_and_wait_with_a_timeout(cluster: Cluster) -> None:
    job = cluster.submit(spec("py-sleep", "sleep 300"))
    with pytest.raises(WaitTimedOut) as waited:
        job.wait(timeout_s=0.5)
    assert not waited.value.info.finished
    assert job.cancel("no longer needed").state is JobState.CANCELLED
    assert job.cancel().state is JobState.CANCELLED  # again: the same answer


def test_rules_the_cluster_checks_come_back_with_the_file_line(
    cluster: Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: py-levels\nreplicas: 1\ncommand: 'true'\n"
        "resources: {gpu: 0, cpu: 100m, memory: 64Mi}\ntopology:\n  required: datacenter\n"
    )
    with pytest.raises(InvalidSpec) as caught:
        cluster.submit(path)
    assert caught.value.field == "topology.required"
    assert caught.value.line == 6
    assert cluster.jobs(state="all", name="py-levels") == []  # nothing was submitted


def test_unknown_jobs_refused_credentials_and_dead_addresses(
    cluster: Cluster, local: LocalCluster
) -> None:
    with pytest.raises(JobNotFound) as missing:
        cluster.job("job-999999").info()
    assert missing.value.job_id == "job-999999"
    assert local.credentials is not None
    with Cluster(local.grpc_addresses, tls=local.credentials.client_tls(), timeout_s=10) as anon:
        with pytest.raises(AccessDenied) as denied:
            anon.jobs()
        assert denied.value.reason == "UNAUTHENTICATED"
    with Cluster(["127.0.0.1:1"], timeout_s=1) as nowhere:
        with pytest.raises(ClusterUnreachable) as unreachable:
            nowhere.jobs()
        assert unreachable.value.attempts[0][0] == "127.0.0.1:1"


def test_the_pipeline_example_runs_its_steps_in_order(local: LocalCluster) -> None:
    assert local.credentials is not None
    tls = local.credentials.admin_tls()
    env = {
        **os.environ,
        "SYNAPSE_CLUSTER": ",".join(local.grpc_addresses),
        "SYNAPSE_CA": str(tls.ca),
        "SYNAPSE_CERT": str(tls.cert),
        "SYNAPSE_KEY": str(tls.key),
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, str(ROOT / "examples" / "pipeline.py"), "--run", "t1", "--follow"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.index("preprocess: job-") < out.index("train: job-") < out.index("evaluate: job-")
    assert "[rank 1] rank 1 of 2 trained" in out and "accuracy 0.93" in out
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("(already submitted)") == 3
