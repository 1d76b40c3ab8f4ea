"""``--wait-for-nodes`` (a synapse_ha option): the job waits for nodes to join rather than
being refused when no set of the cluster's nodes could ever hold it."""

from __future__ import annotations

from synapse_ha.client.sbatch import translate
from synapse_ha.core.spec.document import parse_job_spec

SCRIPT = "#!/bin/sh\n#SBATCH -N 5\n#SBATCH --gpus-per-node=8\n{extra}python train.py\n"


def test_the_directive_and_the_command_line_option_set_wait_for_nodes() -> None:
    directive = translate(SCRIPT.format(extra="#SBATCH --wait-for-nodes\n"), "train.sh")
    assert parse_job_spec(directive.spec).spec.wait_for_nodes is True
    given = translate(SCRIPT.format(extra=""), "train.sh", ["--wait-for-nodes"])
    assert parse_job_spec(given.spec).spec.wait_for_nodes is True
    plain = translate(SCRIPT.format(extra=""), "train.sh")
    assert parse_job_spec(plain.spec).spec.wait_for_nodes is False
