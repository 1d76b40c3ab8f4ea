"""What ``srun`` outside an sbatch job asks of its own allocation: the sbatch options its
words stand for, which sbatch's translation reads back into the same job."""

from __future__ import annotations

from synapse_ha.client.sbatch import translate
from synapse_ha.slurm.srun import allocation_options, parser


def options(*words: str) -> list[str]:
    return allocation_options(parser().parse_args(list(words)))


def test_the_sizes_and_site_options_become_sbatch_options() -> None:
    got = options(
        "-N", "2", "--ntasks-per-node=8", "-c", "4", "--gres=gpu:8", "-t", "10",
        "-p", "research", "-w", "gpu[01-02]", "-x", "gpu03", "--exclusive", "-l",
        "python", "train.py", "--lr", "3e-4",
    )  # fmt: skip
    assert got == [
        "--nodes=2",
        "--ntasks-per-node=8",
        "--cpus-per-task=4",
        "--time=10",
        "--partition=research",
        "--gres=gpu:8",
        "--nodelist=gpu[01-02]",
        "--exclude=gpu03",
        "--exclusive",
        "--job-name=python",
    ]


def test_the_job_is_named_after_the_command_unless_named() -> None:
    assert options("/usr/bin/hostname") == ["--job-name=hostname"]
    assert options("-J", "probe", "hostname") == ["--job-name=probe"]


def test_sbatch_reads_them_back_into_the_allocation_srun_asked_for() -> None:
    words = ["-N", "2", "-n", "4", "--gpus-per-task=1", "--mem=8G", "-t", "1:00:00", "hostname"]
    spec = translate("#!/bin/sh\nexec srun hostname\n", "srun", options(*words)).spec
    assert (spec["name"], spec["replicas"], spec["time_limit"]) == ("hostname", 2, "3600s")
    assert spec["resources"]["gpu"] == 2 and spec["resources"]["memory"] == "8Gi"
