"""Job dependencies on real processes (one replica, one worker): a chain submitted at
once runs in order, a failed step cancels the steps after it, and synctl's --after-*
options and status show what a job waits for."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from synapse_ha.cli.main import cli
from synapse_ha.client import Cluster, InvalidSpec, JobState
from tests.integration.cluster import LocalCluster, one_worker_cluster

pytestmark = pytest.mark.integration

SMALL = {"gpu": 0, "cpu": "100m", "memory": "64Mi"}


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    flags = ["--mock-gpus", "0", "--no-cgroups", "--stop-grace", "1s"]
    with one_worker_cluster("synapse-deps-", flags) as (cluster, _):
        yield cluster


@pytest.fixture
def cluster(local: LocalCluster) -> Iterator[Cluster]:
    assert local.credentials is not None
    with Cluster(local.grpc_addresses, tls=local.credentials.admin_tls(), timeout_s=30) as c:
        yield c


def spec(name: str, command: str) -> dict[str, object]:
    return {"name": name, "replicas": 1, "resources": SMALL, "command": command}


def synctl(local: LocalCluster, *args: str) -> Result:
    creds = local.credentials
    assert creds is not None
    tls = creds.admin_tls()
    env = {"SYNAPSE_CA": str(tls.ca), "SYNAPSE_CERT": str(tls.cert), "SYNAPSE_KEY": str(tls.key)}
    addresses = ",".join(local.grpc_addresses)
    return CliRunner().invoke(cli, ["--cluster", addresses, "--timeout", "20", *args], env=env)


def test_a_chain_runs_in_order_and_each_step_starts_after_the_last_succeeded(
    cluster: Cluster,
) -> None:
    first = cluster.submit(spec("dep-prep", "sleep 1"))
    second = cluster.submit(spec("dep-train", "true"), after_ok=first)
    third = cluster.submit(spec("dep-eval", "true"), after_any=[second])
    waiting = second.info()
    assert waiting.waiting_for == (("afterok", first.id),)
    assert waiting.reason_code == "dependency"
    assert waiting.reason == f"waiting for {first.id} to succeed"
    assert third.wait(timeout_s=90).state is JobState.SUCCEEDED
    done = [job.info() for job in (first, second, third)]
    assert all(info.succeeded for info in done)
    for before, after in itertools.pairwise(done):
        assert after.raw.attempt.bound_at_ms >= before.finished_at_ms


def test_a_failed_step_cancels_the_steps_after_it(cluster: Cluster) -> None:
    failing = cluster.submit(spec("dep-fail", "exit 3"))
    second = cluster.submit(spec("dep-after-fail", "true"), after_ok=failing)
    third = cluster.submit(spec("dep-after-after", "true"), after_ok=second)
    cleanup = cluster.submit(spec("dep-cleanup", "true"), after_not_ok=failing)
    assert failing.wait(timeout_s=60).state is JobState.FAILED
    for job, on in ((second, failing), (third, second)):
        info = job.wait(timeout_s=10)
        assert info.state is JobState.CANCELLED and info.attempt == 0
        assert info.reason_code == "dependency_never_satisfied"
        assert on.id in info.reason and "can never be met" in info.reason
    assert cleanup.wait(timeout_s=60).state is JobState.SUCCEEDED
    with pytest.raises(InvalidSpec) as refused:
        cluster.submit(spec("dep-hopeless", "true"), after_ok=failing)
    assert refused.value.field == "dependencies.afterok"
    assert "can never be met" in refused.value.rule


def test_synctl_submits_with_after_options_and_shows_the_wait(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    blocker = cluster.submit(spec("dep-blocker", "sleep 300"))
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: dep-cli\nreplicas: 1\ncommand: 'true'\n"
        "resources: {gpu: 0, cpu: 100m, memory: 64Mi}\n"
    )
    submitted = synctl(local, "submit", str(path), "--after-ok", blocker.id, "-o", "json")
    assert submitted.exit_code == 0, submitted.output
    job_id = json.loads(submitted.output)["id"]
    shown = synctl(local, "status", job_id)
    assert shown.exit_code == 0, shown.output
    assert f"DEPENDS ON:    afterok {blocker.id}" in shown.output
    assert f"WAITING FOR:   afterok {blocker.id}" in shown.output
    document = json.loads(synctl(local, "status", job_id, "-o", "json").output)
    assert document["waiting_for"] == {"afterok": [blocker.id]}
    bad = synctl(local, "submit", str(path), "--after-any", "job-1")
    assert bad.exit_code == 2 and "--after-any: 'job-1' is not a job id" in bad.output
    unknown = synctl(local, "submit", str(path), "--after", "job-999999")
    assert unknown.exit_code == 2, unknown.output
    assert "dependencies.after" in unknown.output and "no job job-999999" in unknown.output
    blocker.cancel()
    assert cluster.job(job_id).wait(timeout_s=10).reason_code == "dependency_never_satisfied"
