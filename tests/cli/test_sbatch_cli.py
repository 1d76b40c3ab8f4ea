"""synctl sbatch's command line without a cluster (--dry-run): --wrap makes the script,
and the job's environment says how its own Slurm commands reach the cluster."""

from __future__ import annotations

import yaml
from click.testing import CliRunner, Result

from synapse_ha.cli.main import cli


def sbatch(*args: str) -> Result:
    cluster = ["--cluster", "10.0.0.1:7101,10.0.0.2:7101"]
    return CliRunner().invoke(cli, [*cluster, "sbatch", "--dry-run", *args], env={})


def test_wrap_runs_its_command_as_a_shell_script() -> None:
    result = sbatch("-N", "2", "-J", "probe", "--wrap", "srun hostname")
    assert result.exit_code == 0, result.output
    spec = yaml.safe_load(result.stdout)
    assert (spec["name"], spec["replicas"]) == ("probe", 2)
    at = spec["command"].index("--")
    assert spec["command"][at + 1 :] == ["/bin/sh", "-c", "#!/bin/sh\nsrun hostname\n", "wrap"]
    # The job's own sbatch, squeue and scontrol find the cluster this synctl used.
    assert spec["env"]["SYNAPSE_CLUSTER"] == "10.0.0.1:7101,10.0.0.2:7101"


def test_a_script_and_wrap_together_or_neither_are_refused() -> None:
    both = sbatch("--wrap", "true", "job.sh")
    assert both.exit_code == 2 and "give a script or --wrap, not both" in both.output
    neither = sbatch("-N", "2")
    assert neither.exit_code == 2 and "no script given" in neither.output
