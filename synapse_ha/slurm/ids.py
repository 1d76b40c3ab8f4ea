"""Job ids in Slurm's form: Slurm's are numbers, ours ``job-000042``. The Slurm-facing
commands and variables (``squeue``, ``sacct``, ``sbatch`` as Slurm's, ``SLURM_JOB_ID``,
``%j``) use ``42`` (``42_7`` for task 7 of an array) and read either form."""

from __future__ import annotations

import re

_OURS = re.compile(r"^job-0*(\d+)(?:_(\d+))?$")
_SLURMS = re.compile(r"^(\d+)(?:_(\d+))?$")


def slurm_id(job_id: str) -> str:
    """``job-000042`` as ``42``, ``job-000042_7`` as ``42_7``; any other id as it is."""
    match = _OURS.match(job_id)
    if match is None:
        return job_id
    number, task = match.groups()
    return f"{number}_{task}" if task is not None else number


def job_id_of(text: str) -> str:
    """A job id as a Slurm command is given it: ``42`` and ``42_7`` in Slurm's form, or
    ours as it is."""
    match = _SLURMS.match(text.strip())
    if match is None:
        return text.strip()
    number, task = match.groups()
    ours = f"job-{int(number):06d}"
    return f"{ours}_{int(task)}" if task is not None else ours
