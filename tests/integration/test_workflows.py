"""Job dependencies on real processes (one replica, one worker): a chain submitted at
once runs in order, a failed step cancels the steps after it, and synctl's --after-*
options and status show what a job waits for."""

from __future__ import annotations

import itertools
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


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    with python_client_cluster("synapse-deps-") as cluster:
        yield cluster


@pytest.fixture
def cluster(local: LocalCluster) -> Iterator[Cluster]:
    with admin_python_client(local) as client:
        yield client


def test_a_chain_runs_in_order_and_each_step_starts_after_the_last_succeeded(
    cluster: Cluster,
) -> None:
    first = cluster.submit(small_spec("dep-prep", "sleep 1"))
    second = cluster.submit(small_spec("dep-train", "true"), after_ok=first)
    third = cluster.submit(small_spec("dep-eval", "true"), after_any=[second])
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
    failing = cluster.submit(small_spec("dep-fail", "exit 3"))
    second = cluster.submit(small_spec("dep-after-fail", "true"), after_ok=failing)
    third = cluster.submit(small_spec("dep-after-after", "true"), after_ok=second)
    cleanup = cluster.submit(small_spec("dep-cleanup", "true"), after_not_ok=failing)
    assert failing.wait(timeout_s=60).state is JobState.FAILED
    for job, on in ((second, failing), (third, second)):
        info = job.wait(timeout_s=10)
        assert info.state is JobState.CANCELLED and info.attempt == 0
        assert info.reason_code == "dependency_never_satisfied"
        assert on.id in info.reason and "can never be met" in info.reason
    assert cleanup.wait(timeout_s=60).state is JobState.SUCCEEDED
    with pytest.raises(InvalidSpec) as refused:
        cluster.submit(small_spec("dep-hopeless", "true"), after_ok=failing)
    assert refused.value.field == "dependencies.afterok"
    assert "can never be met" in refused.value.rule


def test_synctl_submits_with_after_options_and_shows_the_wait(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    blocker = cluster.submit(small_spec("dep-blocker", "sleep 300"))
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


SBATCH_SCRIPT = """#!/bin/sh
#SBATCH -J slurm_env
#SBATCH -N 2
#SBATCH --ntasks-per-node=2   # two tasks on each node's member
#SBATCH --mem=64M
#SBATCH -t 5
#SBATCH -o batch-%j.log
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
echo "batch proc=$SLURM_PROCID nodes=$SLURM_NNODES tasks=$SLURM_NTASKS job=$SLURM_JOB_ID" \\
  "name=$SLURM_JOB_NAME arg=$1 first=$first hosts=$(scontrol show hostnames | wc -l)"
srun -l sh -c 'echo "task $SLURM_PROCID local=$SLURM_LOCALID node=$SLURM_NODEID of=$SLURM_NTASKS"'
for node in $(scontrol show hostnames); do
  srun -w "$node" -N 1 -n 1 sh -c 'echo "background step $SLURM_STEP_ID"' &
done
wait
"""


def test_a_batch_script_runs_once_and_srun_runs_its_steps_on_the_allocation(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "env.sh"
    script.write_text(SBATCH_SCRIPT)
    dry = synctl(local, "sbatch", "--dry-run", str(script), "first")
    assert dry.exit_code == 0, dry.output
    assert "replicas: 2" in dry.output and "name: slurm-env" in dry.output
    submitted = synctl(local, "sbatch", "--parsable", "-D", str(tmp_path), str(script), "first")
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.output.strip().splitlines()[-1]
    job = cluster.job(job_id)
    info = job.wait(timeout_s=90)
    assert info.succeeded, info.reason
    assert info.raw.spec.time_limit_ms == 300_000
    number = job_id.removeprefix("job-").lstrip("0")  # Slurm's form of the id
    logs = list(job.logs())
    assert {line.rank for line in logs} == {0}, logs  # the other member only holds its node
    lines = sorted(line.text for line in logs)
    # One worker holds both members: both nodes' host is loopback.
    assert lines == sorted(
        [
            f"batch proc=0 nodes=2 tasks=4 job={number} name=slurm-env arg=first "
            "first=127.0.0.1 hosts=2",
            "0: task 0 local=0 node=0 of=4",
            "1: task 1 local=1 node=0 of=4",
            "2: task 2 local=0 node=1 of=4",
            "3: task 3 local=1 node=1 of=4",
            "background step 1",
            "background step 2",
        ]
    ), "\n".join(str(line) for line in logs)
    # -o batch-%j.log: the batch script's output, also in that file.
    written = (tmp_path / f"batch-{number}.log").read_text().splitlines()
    assert sorted(written) == lines


def test_sbatch_refuses_what_it_cannot_translate_naming_the_line(
    local: LocalCluster, tmp_path: Path
) -> None:
    script = tmp_path / "scratch.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N 1\n#SBATCH --tmp=10G\necho $SLURM_JOB_ID\n")
    refused = synctl(local, "sbatch", "-D", str(tmp_path), str(script))
    assert refused.exit_code == 2
    assert f"{script}:3: --tmp=10G: not supported" in refused.output
    # A feature no node advertises reaches the cluster, which refuses the job saying so.
    script.write_text("#!/bin/sh\n#SBATCH -N 1\n#SBATCH -C 'volta32gb&ib'\necho\n")
    refused = synctl(local, "sbatch", "-D", str(tmp_path), str(script))
    assert refused.exit_code != 0
    assert "nodes.features: the job can never fit this cluster: no node has feature" in (
        refused.output
    ), refused.output


def test_sbatch_submits_an_array_whose_tasks_see_their_slurm_index(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "sweep.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH -J sweep\n#SBATCH --array=1,3%1\n#SBATCH --mem=64M\n"
        'echo "task=$SLURM_ARRAY_TASK_ID of=$SLURM_ARRAY_JOB_ID job=$SLURM_JOB_ID"\n'
    )
    submitted = synctl(local, "sbatch", "--parsable", "-D", str(tmp_path), str(script))
    assert submitted.exit_code == 0, submitted.output
    array_id = submitted.output.strip()  # its tasks are the jobs ARRAY_1 and ARRAY_3
    assert cluster.jobs("all", array=array_id)[0].id == f"{array_id}_1"
    for index in (1, 3):
        task = cluster.job(f"{array_id}_{index}")
        assert task.wait(timeout_s=60).state is JobState.SUCCEEDED
        logs = synctl(local, "logs", array_id, "--task", str(index))
        number = array_id.removeprefix("job-").lstrip("0")  # Slurm's form of the id
        said = f"task={index} of={number} job={number}_{index}"
        assert said in logs.output
        # Slurm's default file of an array task, in the working directory.
        assert (tmp_path / f"slurm-{number}_{index}.out").read_text() == said + "\n"


def test_slurms_query_and_cancel_commands_speak_slurms_ids_states_and_formats(
    local: LocalCluster, cluster: Cluster
) -> None:
    running = cluster.submit(small_spec("slurm-view", "sleep 60"))
    number = running.id.removeprefix("job-").lstrip("0")

    def started() -> bool:
        return cluster.job(running.id).info().state is JobState.RUNNING

    wait_for("the job running", started, timeout_s=60)
    listed = synctl(local, "squeue", "-h", "-o", "%i|%j|%T|%t|%D|%P")
    assert listed.exit_code == 0, listed.output
    assert f"{number}|slurm-view|RUNNING|R|1|default" in listed.output.splitlines()
    header = synctl(local, "squeue", "-j", number).output.splitlines()[0].split()
    assert header == [
        "JOBID",
        "PARTITION",
        "NAME",
        "USER",
        "ST",
        "TIME",
        "NODES",
        "NODELIST(REASON)",
    ]
    shown = synctl(local, "scontrol", "show", "job", number)
    assert shown.exit_code == 0, shown.output
    fields = dict(word.split("=", 1) for word in shown.output.split())
    assert (fields["JobId"], fields["JobState"], fields["NumNodes"]) == (number, "RUNNING", "1")
    assert fields["NodeList"] == fields["BatchHost"] != "(null)"
    assert synctl(local, "scancel", number).exit_code == 0
    cluster.job(running.id).wait(timeout_s=30)
    accounted = synctl(local, "sacct", "-j", number, "-o", "JobID,State,NNodes", "-P", "-n")
    assert accounted.output.strip() == f"{number}|CANCELLED|1", accounted.output
    unknown = synctl(local, "scancel", "999999")
    assert unknown.exit_code == 4 and "Invalid job id 999999" in unknown.output
    bad = synctl(local, "squeue", "-o", "%i %Q")
    assert bad.exit_code == 2 and "%Q is not a squeue field" in bad.output


def test_an_exclusive_batch_job_takes_its_node_whole(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "whole.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N 1 --exclusive\necho whole\n")
    with local.client() as client:
        nodes = client.list_nodes()
        overhead = client.get_limits().member_overhead_memory_mib  # the supervisor's
    assert len(nodes) == 1
    capacity = nodes[0].capacity
    dry = synctl(local, "sbatch", "--dry-run", "-D", str(tmp_path), str(script))
    assert dry.exit_code == 0, dry.output
    assert f"gpu: {capacity.gpu}" in dry.output
    assert f"cpu: {capacity.cpu_milli}m" in dry.output
    assert f"memory: {capacity.memory_mib - overhead}Mi" in dry.output
    submitted = synctl(local, "sbatch", "--parsable", "-D", str(tmp_path), str(script))
    assert submitted.exit_code == 0, submitted.output
    job = cluster.job(submitted.output.strip().splitlines()[-1])
    assert job.wait(timeout_s=60).succeeded
    assert [line.text for line in job.logs()] == ["whole"]


SELF_REQUEUE = """#!/bin/sh
#SBATCH -J requeue-me
#SBATCH --mem=64M
echo "$SLURM_RESTART_COUNT" >> restarts.txt
if [ "$SLURM_RESTART_COUNT" = 0 ]; then
  scontrol requeue "$SLURM_JOB_ID" || exit 9
  sleep 60
  exit 3
fi
sbatch --parsable -D "$PWD" child.sh > child.id
"""


def test_a_job_requeues_itself_and_submits_another_from_inside(
    local: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    """``scontrol requeue`` and ``sbatch`` inside the job reach the cluster as the
    submitting synctl did; the second attempt sees Slurm's restart count."""
    (tmp_path / "requeue.sh").write_text(SELF_REQUEUE)
    (tmp_path / "child.sh").write_text("#!/bin/sh\n#SBATCH --mem=64M\necho child\n")
    submitted = synctl(  # -W: back once the job has ended, with its status
        local, "sbatch", "--parsable", "-W", "-D", str(tmp_path), str(tmp_path / "requeue.sh")
    )
    assert submitted.exit_code == 0, submitted.output
    job = cluster.job(submitted.output.strip().splitlines()[0])
    info = job.info()
    assert info.succeeded, (info.reason, [line.text for line in job.logs()])
    assert (info.attempt, info.raw.retries_used) == (2, 0)
    assert (tmp_path / "restarts.txt").read_text().split() == ["0", "1"]
    child = (tmp_path / "child.id").read_text().strip()  # Slurm's form, as sbatch prints it
    assert child.isdigit()
    assert cluster.job(f"job-{int(child):06d}").wait(timeout_s=60).succeeded
    nodes = synctl(local, "sinfo", "-h", "-o", "%P|%D|%a")
    assert nodes.exit_code == 0, nodes.output
    assert nodes.output.splitlines()[0] == "default*|1|up"
    finished = synctl(local, "scontrol", "requeue", child)
    assert finished.exit_code == 1 and "already finished as SUCCEEDED" in finished.output
    (tmp_path / "fails.sh").write_text("#!/bin/sh\n#SBATCH --mem=64M\nexit 3\n")
    failed = synctl(local, "sbatch", "-W", "-D", str(tmp_path), str(tmp_path / "fails.sh"))
    assert failed.exit_code == 3, failed.output


def test_srun_outside_an_allocation_makes_one_and_streams_the_step(
    local: LocalCluster, tmp_path: Path
) -> None:
    ran = synctl(
        local, "srun", "-n", "2", "--mem=64M", "-D", str(tmp_path), "-l",
        "sh", "-c", 'echo "task $SLURM_PROCID of $SLURM_NTASKS"',
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    assert {"0: task 0 of 2", "1: task 1 of 2"} <= set(ran.output.splitlines()), ran.output
    failed = synctl(local, "srun", "--mem=64M", "-D", str(tmp_path), "sh", "-c", "exit 4")
    assert failed.exit_code == 4, failed.output
