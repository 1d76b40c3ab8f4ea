"""Slurm batch scripts translated to job specs (synapse_ha.client.sbatch): every supported
option, command-line options over #SBATCH lines, and each refusal naming its line."""

from __future__ import annotations

import pytest

from synapse_ha.client.sbatch import (
    PREAMBLE,
    SbatchError,
    script_position,
    time_seconds,
    translate,
)
from synapse_ha.core.spec import parse_job_spec

SCRIPT = """#!/bin/bash
#SBATCH --job-name=LLaMA_pretrain.v2
#SBATCH -N 4
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:h100:8
#SBATCH --cpus-per-task=32 --mem=512G
#SBATCH -t 2-00:00:00
#SBATCH -p research
#SBATCH --qos=high
#SBATCH -d afterok:12:job-000013,afterany:14
#SBATCH -D /data/run1
#SBATCH --export=NONE,HF_HOME=/data/hf,WANDB_PROJECT
#SBATCH --requeue
#SBATCH -o logs/%j.out
#SBATCH -e logs/%j.err

srun-free torchrun train.py "$@"
#SBATCH --not-a-directive-any-more
"""


def test_every_supported_option_is_translated() -> None:
    out = translate(
        SCRIPT, "jobs/pretrain.sh", args=["--lr", "3e-4"], environ={"WANDB_PROJECT": "p"}
    )
    spec = out.spec
    assert spec["name"] == "llama-pretrain-v2"
    assert spec["replicas"] == 4
    assert spec["resources"] == {"gpu": 8, "cpu": 32, "memory": "512Gi"}
    assert spec["time_limit"] == "172800s"
    assert (spec["queue"], spec["priority"], spec["workdir"]) == ("research", "high", "/data/run1")
    assert spec["dependencies"] == {
        "afterok": ["job-000012", "job-000013"],
        "afterany": ["job-000014"],
    }
    assert spec["env"]["HF_HOME"] == "/data/hf" and spec["env"]["WANDB_PROJECT"] == "p"
    interpreter, flag, body, name, *args = spec["command"]
    assert (interpreter, flag, name, args) == ("/bin/bash", "-c", "pretrain.sh", ["--lr", "3e-4"])
    assert body == PREAMBLE + SCRIPT
    assert [n.split(": ")[1] for n in out.notes] == ["--requeue", "-o", "-e"]
    parsed = parse_job_spec(spec, topology_levels=None)  # a valid job spec
    assert parsed.spec.replicas == 4 and parsed.spec.resources.gpu == 8


def test_command_line_options_win_over_the_script() -> None:
    options = ["-N", "2", "--time=90", "--gpus-per-node=a100:4"]
    out = translate(SCRIPT, "pretrain.sh", options, environ={"WANDB_PROJECT": "p"})
    assert out.spec["replicas"] == 2 and out.spec["time_limit"] == "5400s"
    assert out.spec["resources"]["gpu"] == 4


def test_a_script_without_options_runs_under_sh_as_one_member() -> None:
    spec = translate("echo hi\n", "hello.sh").spec
    assert spec["command"][:2] == ["/bin/sh", "-c"] and spec["replicas"] == 1
    assert spec["resources"] == {"gpu": 0, "cpu": 1, "memory": "1Gi"}
    parse_job_spec(spec, topology_levels=None)


@pytest.mark.parametrize(
    ("line", "where", "says"),
    [
        ("#SBATCH --array=0-9", "s.sh:2", "--array=0-9: not supported"),
        ("#SBATCH --exclusive", "s.sh:2", "--exclusive: not supported"),
        ("#SBATCH -n 8", "s.sh:2", "-n: not supported"),
        ("#SBATCH --ntasks-per-node=8", "s.sh:2", "only 1 is supported"),
        ("#SBATCH -N 2-4", "s.sh:2", "a range min-max is not supported"),
        ("#SBATCH --gres=nvme:1", "s.sh:2", "only gpu:N or gpu:TYPE:N"),
        ("#SBATCH --mem=0", "s.sh:2", "0 (all of a node) is not supported"),
        ("#SBATCH -t soon", "s.sh:2", "give a time limit"),
        ("#SBATCH -d singleton", "s.sh:2", "supported are afterok"),
        ("#SBATCH -d afterok:1?afterany:2", "s.sh:2", "'?' (any of) is not supported"),
        ("#SBATCH --export=NOT_SET_HERE", "s.sh:2", "NOT_SET_HERE is not set here"),
        ("#SBATCH --begin=now+1hour", "s.sh:2", "--begin=now+1hour: not supported"),
        ("#SBATCH -J", "s.sh:2", "-J: needs a value"),
    ],
)
def test_options_that_cannot_be_translated_are_refused_with_their_line(
    line: str, where: str, says: str
) -> None:
    with pytest.raises(SbatchError) as refused:
        translate(f"#!/bin/sh\n{line}\necho\n", "s.sh", environ={})
    assert refused.value.where == where
    assert says in str(refused.value)


def test_slurm_time_formats() -> None:
    assert [time_seconds(t) for t in ("90", "10:30", "1:00:00", "2-3", "2-3:04", "2-3:04:05")] == [
        5400, 630, 3600, 2 * 86400 + 3 * 3600, 2 * 86400 + 3 * 3600 + 240,
        2 * 86400 + 3 * 3600 + 245,
    ]  # fmt: skip
    for bad in ("0", "UNLIMITED", "1:2:3:4", ""):
        with pytest.raises(ValueError, match="give a time limit"):
            time_seconds(bad)


def test_the_script_is_the_first_word_that_is_not_an_option() -> None:
    assert script_position(["-N", "2", "--gres=gpu:8", "--requeue", "run.sh", "-x"]) == 4
    assert script_position(["-N2", "run.sh"]) == 1
    assert script_position(["-N", "2"]) == 2
