"""``synctl scontrol`` and the ``scontrol`` program an sbatch job's script calls: host
lists expanded and compressed, $SLURM_JOB_NODELIST by default, errors as one line with
exit 2 and no cluster asked."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from synapse_ha.cli.main import cli
from synapse_ha.cli.slurm import show_job
from synapse_ha.core.model import JobState
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def synctl(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    # No --cluster and no credentials: scontrol never asks the cluster.
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def test_show_hostnames_prints_one_host_per_line() -> None:
    code, out = synctl("scontrol", "show", "hostnames", "gpu[08-10],login")
    assert (code, out.split()) == (0, ["gpu08", "gpu09", "gpu10", "login"])


def test_show_hostnames_reads_the_jobs_nodelist_by_default() -> None:
    code, out = synctl(
        "scontrol", "show", "hostnames", env={"SLURM_JOB_NODELIST": "10.0.0.1,10.0.0.2"}
    )
    assert (code, out.split()) == (0, ["10.0.0.1", "10.0.0.2"])
    code, out = synctl("scontrol", "show", "hostnames", env={"SLURM_JOB_NODELIST": ""})
    assert code == 2 and "SLURM_JOB_NODELIST is not set" in out


def test_show_hostlist_compresses_in_order() -> None:
    code, out = synctl("scontrol", "show", "hostlist", "gpu01,gpu02", "gpu03", "login")
    assert (code, out.strip()) == (0, "gpu[01-03],login")


@pytest.mark.parametrize("bad", ["n[1-", "n[3-1]", "n1,,n2"])
def test_a_malformed_list_is_one_line_and_exit_2(bad: str) -> None:
    code, out = synctl("scontrol", "show", "hostnames", bad)
    assert code == 2 and "host list" in out
    ran = subprocess.run(
        [sys.executable, "-m", "synapse_ha.cli.scontrol", "show", "hostnames", bad],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.startswith("scontrol: error: host list")


def test_the_program_on_its_own_prints_the_hosts() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "synapse_ha.cli.scontrol", "show", "hostnames", "r[1-2]n1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (ran.returncode, ran.stdout.split()) == (0, ["r1n1", "r2n1"])


def test_show_job_shows_the_comment_and_mail_options_kept_with_the_job() -> None:

    pending = states.job_state_fields(JobState.PENDING)
    env = [pb.EnvVar(name="SYNAPSE_SBATCH_COMMENT", value="ablation 3")]
    job = pb.Job(job_id="job-000042", spec=pb.JobSpec(name="x", env=env), **pending)
    shown = show_job(job, 0).splitlines()
    assert shown[-1] == "Comment=ablation 3"
    assert "Comment" not in show_job(pb.Job(job_id="job-000042", **pending), 0)
