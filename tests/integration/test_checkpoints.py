"""Checkpoint marks on real processes (one replica, one worker): the members of a gang
run examples/pytorch_checkpoint.py, save and mark step 5 and fail at step 7; the job's
second attempt gets $SYNAPSE_RESUME_STEP=5, resumes there and succeeds, and synctl shows
the marks."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.client import Cluster, JobState
from tests.integration.cluster import (
    LocalCluster,
    admin_python_client,
    python_client_cluster,
    synctl,
)

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch_checkpoint.py"


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    with python_client_cluster("synapse-ckpt-") as cluster:
        yield cluster


@pytest.fixture
def cluster(local: LocalCluster) -> Iterator[Cluster]:
    with admin_python_client(local) as client:
        yield client


def test_a_failed_attempt_resumes_from_its_gangs_mark(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    saved = tmp_path / "states"
    command = [sys.executable, str(EXAMPLE), "--steps", "10", "--every", "5"]
    job = cluster.submit(
        {
            "name": "ckpt-resume",
            "replicas": 2,
            "resources": {"gpu": 0, "cpu": "100m", "memory": "64Mi"},
            "command": [*command, "--crash-at", "7", "--dir", str(saved)],
            "retries": {"max": 1, "backoff": "1s"},
        }
    )
    info = job.wait(timeout_s=120)
    assert info.state is JobState.SUCCEEDED, info.reason
    assert info.attempt == 2 and info.raw.retries_used == 1
    lines = sorted(line.text for line in job.logs())
    assert lines == sorted(
        f"rank {rank}: {text}"
        for rank in (0, 1)
        for text in (
            "resuming from step 5 (the gang's mark: 5)",
            "saved step 10 and marked it",
            "done at step 10",
        )
    )
    assert sorted(p.name for p in saved.glob("*.json")) == [
        f"step-{step}.rank-{rank}.json" for step in (10, 5) for rank in (0, 1)
    ]
    raw = info.raw
    assert info.resume_step == raw.resume_step == 10  # where a next attempt would resume
    assert raw.attempt.HasField("checkpoint") and raw.attempt.checkpoint.step == 10
    assert [m.checkpoint.step for m in raw.attempt.members] == [10, 10]

    shown = synctl(local, "status", job.id)
    assert shown.exit_code == 0, shown.output
    assert "CHECKPOINT:    step 10, " in shown.output
    assert "RESUME STEP:   10" in shown.output
    document = json.loads(synctl(local, "status", job.id, "-o", "json").output)
    assert document["checkpoint"]["step"] == 10 and document["resume_step"] == 10
    assert [m["checkpoint"]["step"] for m in document["members"]] == [10, 10]
    explained = synctl(local, "explain", job.id)
    assert explained.exit_code == 0, explained.output
    assert "checkpoint: step 10, " in explained.output


def test_a_first_attempt_has_a_checkpoint_file_and_no_resume_step(cluster: Cluster) -> None:
    job = cluster.submit(
        {
            "name": "ckpt-plain",
            "replicas": 1,
            "resources": {"gpu": 0, "cpu": "100m", "memory": "64Mi"},
            "command": 'echo "file=${SYNAPSE_CHECKPOINT_FILE:+set}"'
            ' "resume=${SYNAPSE_RESUME_STEP-none}"',
        }
    )
    info = job.wait(timeout_s=60)
    assert info.succeeded, info.reason
    assert [line.text for line in job.logs()] == ["file=set resume=none"]
    assert not info.raw.HasField("resume_step")
    assert not info.raw.attempt.HasField("checkpoint")
