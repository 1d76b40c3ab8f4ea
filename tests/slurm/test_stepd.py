"""Job steps with real processes and sockets, without a cluster: the step daemons of a
two-node allocation (rank 0 with the batch script and the hub, rank 1 a holder) started
as a worker starts members, and srun from the batch script. Checked: the batch script
runs once with the batch step's variables; srun's tasks get Slurm's ranks, node ids and
their GPUs; output and exit statuses come back; steps run in the background and at
once; a process without the secret or of another attempt is turned away; holders exit
0 once the script ends, and the job's status is the script's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from synapse_ha.local.allocation import LocalAllocation, Ran

Run = Callable[..., Ran]


@pytest.fixture
def allocation(tmp_path: Path) -> Iterator[Run]:
    local = LocalAllocation(tmp_path)
    try:
        yield local.run
    finally:
        local.close()


def test_the_batch_script_runs_once_and_srun_runs_tasks_on_every_node(allocation: Run) -> None:
    script = r"""
echo "batch $SLURM_PROCID of $SLURM_NNODES nodes, $SLURM_NTASKS tasks, job $SLURM_JOB_ID"
echo "hosts $(scontrol show hostnames | wc -l)"
srun -l --gpus-per-task=1 sh -c 'echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID" \
  "$SLURM_NTASKS $SLURM_STEP_ID $CUDA_VISIBLE_DEVICES"'
echo "second step"
srun -N 1 sh -c 'echo "one $SLURM_STEP_ID $SLURM_NTASKS $SLURM_STEP_NUM_NODES"'
echo "tasks see scontrol: $(srun -n 2 -N 2 sh -c 'scontrol show hostnames | wc -l' | tr '\n' ' ')"
"""
    ran = allocation(script, tasks_per_node=2)
    assert ran.codes == [0, 0], ran.outputs
    batch = ran.outputs[0]
    assert "batch 0 of 2 nodes, 4 tasks, job 42" in batch
    assert "hosts 2" in batch
    lines = sorted(line for line in batch.splitlines() if line[:1].isdigit() and ": " in line)
    assert lines == [
        "0: 0 0 0 4 0 0",
        "1: 1 1 0 4 0 1",
        "2: 2 0 1 4 0 2",
        "3: 3 1 1 4 0 3",
    ], batch
    assert "one 1 2 1" in batch  # step 1: -N 1 runs the allocation's 2 tasks per node
    assert "tasks see scontrol: 2 2" in batch  # on every node, from the tasks' PATH
    assert ran.outputs[1] == ""  # the script ran on the first node only; holders are quiet
    assert "Traceback" not in batch


def test_statuses_background_steps_and_kill_on_bad_exit(allocation: Run) -> None:
    script = r"""
srun -w 127.0.0.1 -N 1 sh -c 'sleep 0.5; echo first done' &
srun -N 1 -x 127.0.0.1 sh -c 'echo cannot' 2>&1 | sed 's/^/excluded: /'
srun -N 2 sh -c 'echo second done' &
wait
srun -n 2 sh -c 'exit $((SLURM_PROCID + 4))'
echo "status $?"
srun -K -n 2 sh -c 'if [ "$SLURM_PROCID" = 0 ]; then exit 9; fi; sleep 30; echo not killed'
echo "killed status $?"
exit 3
"""
    ran = allocation(script)
    assert ran.codes == [3, 0], ran.outputs  # the job's status is the script's
    out = ran.outputs[0]
    assert "first done" in out and out.count("second done") == 2
    assert "excluded: srun: error: -N 1: the allocation has 0 node(s)" in out
    assert "status 5" in out
    assert "killed status 137" in out and "not killed" not in out


def test_a_process_without_the_secret_or_of_another_attempt_is_turned_away(allocation: Run) -> None:
    script = r"""
SYNAPSE_STEP_SECRET=guessed srun true; echo "secret $?"
SYNAPSE_FENCING_TOKEN=6 srun true; echo "token $?"
srun true; echo "own $?"
"""
    ran = allocation(script, nodes=1)
    out = ran.outputs[0]
    assert ran.codes == [0], out
    assert "secret 1" in out and "wrong proof of the step secret" in out
    assert "token 1" in out and "attempt token 7, not this attempt's 6" in out
    assert "own 0" in out


def test_srun_outside_an_allocation_makes_one_and_names_the_cluster_it_tried() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNAPSE_", "SLURM_"))}
    env["SYNAPSE_CLUSTER"] = "127.0.0.1:1"  # nothing listens there
    ran = subprocess.run(
        [sys.executable, "-m", "synapse_ha.slurm.srun", "-N", "2", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 3, ran.stderr  # synctl's: the cluster is unreachable
    assert "cannot reach the cluster; tried 127.0.0.1:1" in ran.stderr


def test_the_batch_scripts_output_is_also_written_where_slurm_writes_it(
    allocation: Run, tmp_path: Path
) -> None:
    ran = allocation("echo out; echo err >&2", nodes=1)
    assert ran.codes == [0]
    assert (tmp_path / "slurm-42.out").read_text() == "out\nerr\n"  # default
    array = {"SLURM_ARRAY_JOB_ID": "job-000040", "SLURM_ARRAY_TASK_ID": "3"}
    patterns = ["--output", "logs-%x-%A_%4a.out", "--error", "%j.err", "--open-mode", "append"]
    for _ in range(2):
        assert allocation("echo o; echo e >&2", nodes=1, stepd=patterns, env=array).codes == [0]
    assert (tmp_path / "logs-steps-40_0003.out").read_text() == "o\no\n"
    assert (tmp_path / "42.err").read_text() == "e\ne\n"
    assert allocation("true", nodes=1, env=array).codes == [0]
    assert (tmp_path / "slurm-40_3.out").exists()  # an array task's default


def test_an_output_file_the_owner_cannot_write_fails_the_job_naming_it(
    allocation: Run, tmp_path: Path
) -> None:
    ran = allocation("echo never", nodes=2, stepd=["--output", "/proc/no/such/%j.out"])
    assert ran.codes[0] == 1
    assert "cannot open /proc/no/such/42.out" in ran.outputs[0]
    assert "never" not in ran.outputs[0]


def test_a_signal_before_the_time_limit_reaches_the_script_or_the_steps(
    allocation: Run,
) -> None:
    script = r"""
trap 'echo "script got USR1"; exit 0' USR1
sleep 10 & wait
"""
    ran = allocation(script, nodes=1, stepd=["--signal=B:10@59", "--time-limit=60"])
    assert ran.codes == [0] and "script got USR1" in ran.outputs[0]
    script = r"""
trap 'echo "script got USR2"' USR2
srun sh -c 'trap "echo task got USR2; exit 0" USR2; sleep 10 & wait'
"""
    ran = allocation(script, nodes=2, stepd=["--signal=12@59", "--time-limit=60"])
    out = ran.outputs[0]
    assert ran.codes == [0, 0] and out.count("task got USR2") == 2, out
    assert "script got USR2" not in out
