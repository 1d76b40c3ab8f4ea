"""submitit, unmodified, against a real cluster through the Slurm commands
`synctl slurm-commands` writes: a function submitted with AutoExecutor and its result
read back, then an array through map_array (sbatch's script with srun, sacct for the
states, Slurm's ids and output patterns end to end)."""

from __future__ import annotations

import operator
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import submitit

from tests.integration.cluster import LocalCluster, python_client_cluster, synctl

pytestmark = [
    pytest.mark.integration,
    # submitit finds its plugins through pkg_resources, which warns that it is deprecated.
    pytest.mark.filterwarnings("ignore:pkg_resources is deprecated:UserWarning"),
]

WAIT_S = 120.0


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    with python_client_cluster("synapse-submitit-") as cluster:
        yield cluster


@pytest.fixture
def slurm_path(local: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Slurm's commands first on PATH, finding ``local`` as its admin."""
    bin_dir = tmp_path / "bin"
    written = synctl(local, "slurm-commands", str(bin_dir))
    assert written.exit_code == 0, written.output
    assert local.credentials is not None
    tls = local.credentials.admin_tls()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    monkeypatch.setenv("SYNAPSE_CLUSTER", ",".join(local.grpc_addresses))
    monkeypatch.setenv("SYNAPSE_CA", str(tls.ca))
    monkeypatch.setenv("SYNAPSE_CERT", str(tls.cert))
    monkeypatch.setenv("SYNAPSE_KEY", str(tls.key))
    monkeypatch.chdir(tmp_path)  # the jobs' working directory (the submission directory)
    return bin_dir


def finished(jobs: list[submitit.Job[int]]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not all(job.done() for job in jobs):
        assert time.monotonic() < deadline, [job.state for job in jobs]
        time.sleep(0.5)


def test_submitit_round_trips_a_function_and_an_array(slurm_path: Path, tmp_path: Path) -> None:
    executor = submitit.AutoExecutor(folder=tmp_path / "runs" / "%j", cluster="slurm")
    executor.update_parameters(timeout_min=5, mem_gb=0.0625, cpus_per_task=1)
    job = executor.submit(operator.add, 2, 3)
    assert job.job_id.isdigit()  # Slurm's form, as submitit reads sbatch's answer
    finished([job])
    assert job.result() == 5
    deadline = time.monotonic() + WAIT_S  # the result is written just before the job ends
    while (state := job.watcher.get_state(job.job_id, mode="force")) != "COMPLETED":
        assert state in ("RUNNING", "CONFIGURING") and time.monotonic() < deadline, state
        time.sleep(0.5)
    assert "completed" in (job.stdout() or "")  # submitit's log, written through srun -o
    jobs = executor.map_array(operator.mul, [2, 3], [10, 100])
    assert [j.job_id for j in jobs] == [f"{jobs[0].job_id.split('_')[0]}_{i}" for i in (0, 1)]
    finished(jobs)
    assert [j.result() for j in jobs] == [20, 300]
