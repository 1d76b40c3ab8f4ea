"""Job arrays on real processes (one replica, one worker): the tasks run with their
indices, never more at once than the throttle, a dependant on the array starts after the
last task, synctl shows the array as one line and a task's logs, and cancelling the array
cancels every unfinished task."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.client import Cluster, InvalidSpec, JobState
from tests.integration.cluster import (
    LocalCluster,
    admin_python_client,
    python_client_cluster,
    small_spec,
    synctl,
    wait_for,
)

pytestmark = pytest.mark.integration

SAYS = 'echo "task=$SYNAPSE_ARRAY_TASK_ID of=$SYNAPSE_ARRAY_JOB_ID slurm=$SLURM_ARRAY_TASK_ID"'


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    with python_client_cluster("synapse-arrays-") as cluster:
        yield cluster


@pytest.fixture
def cluster(local: LocalCluster) -> Iterator[Cluster]:
    with admin_python_client(local) as client:
        yield client


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The most intervals (start, end) that hold at one instant (an end frees its slot
    before a start at the same instant)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_an_array_runs_its_tasks_within_the_throttle_then_its_dependant(
    local: LocalCluster, cluster: Cluster
) -> None:
    array = cluster.submit_array(small_spec("sweep", f"{SAYS}; sleep 1"), "0-4%2")
    after = cluster.submit(small_spec("pick-best", "true"), after_ok=array.id)
    assert after.info().waiting_for == (("afterok", array.id),)
    info = array.wait(timeout_s=120)
    assert info.succeeded and info.tasks == 5 and info.throttle == 2
    tasks = array.tasks()
    assert [t.id for t in tasks] == [f"{array.id}_{i}" for i in range(5)]
    held = [(t.raw.attempt.bound_at_ms, t.raw.attempt.ended_at_ms) for t in tasks]
    assert most_at_once(held) == 2  # the throttle, reached and never passed
    assert after.wait(timeout_s=60).state is JobState.SUCCEEDED
    assert after.info().raw.attempt.bound_at_ms >= max(t.finished_at_ms for t in tasks)

    logs = synctl(local, "logs", array.id, "--task", "3")
    assert logs.exit_code == 0, logs.output
    assert f"task=3 of={array.id} slurm=3" in logs.output
    listed = json.loads(synctl(local, "jobs", "--all", "-o", "json").output)
    line = next(a for a in listed["arrays"] if a["id"] == array.id)
    assert line["task_states"] == {"SUCCEEDED": 5} and line["array"] == "0-4%2"
    assert not any(j["id"].startswith(f"{array.id}_") for j in listed["jobs"])
    expanded = json.loads(synctl(local, "jobs", "--array", array.id, "--all", "-o", "json").output)
    assert [j["id"] for j in expanded["jobs"]] == [t.id for t in tasks]
    shown = synctl(local, "status", array.id)
    assert shown.exit_code == 0, shown.output
    assert "TASKS:         5 SUCCEEDED" in shown.output
    assert "0-4%2: 5 task(s), at most 2 at once" in shown.output


def test_cancelling_an_array_cancels_its_unfinished_tasks(
    local: LocalCluster, cluster: Cluster
) -> None:
    array = cluster.submit_array(small_spec("long-sweep", "sleep 300"), "0-3%1")
    running = array.task(0)
    wait_for("task 0 to run", lambda: running.info().state is JobState.RUNNING, 60.0)
    table = synctl(local, "jobs")
    assert "ARRAY[4]" in table.output and "3 PENDING, 1 RUNNING" in table.output
    assert "at most 1 at once" in table.output
    waiting = array.task(2).info()
    assert waiting.reason_code == "array_throttle", waiting.reason
    done = synctl(local, "cancel", array.id, "-o", "json")
    assert done.exit_code == 0, done.output
    assert "4 unfinished task(s) cancelled" in json.loads(done.output)["message"]
    assert array.wait(timeout_s=30).task_states == {JobState.CANCELLED: 4}


def test_bad_array_texts_are_refused_before_anything_is_sent(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    with pytest.raises(InvalidSpec) as refused:
        cluster.submit_array(small_spec("bad", "true"), "0-9%0")
    assert refused.value.field == "array" and "throttle" in refused.value.rule
    with pytest.raises(InvalidSpec, match="submit_array"):
        cluster.submit({**small_spec("bad", "true"), "array": "0-3"})
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nreplicas: 1\ncommand: 'true'\n")
    bad = synctl(local, "submit", str(path), "--array", "3-1")
    assert bad.exit_code == 2 and "--array: '3-1': a range ends at or after its start" in bad.output
    assert cluster.jobs(name="x") == []
