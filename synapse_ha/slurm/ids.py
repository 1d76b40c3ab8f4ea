"""Job ids in Slurm's form, and Slurm's file-name patterns that name them.

Slurm's ids are numbers, ours ``job-000042``. The Slurm-facing commands and variables
(``squeue``, ``sacct``, ``sbatch`` as Slurm's, ``SLURM_JOB_ID``, ``%j``) use ``42``
(``42_7`` for task 7 of an array) and read either form."""

from __future__ import annotations

import re
from collections.abc import Mapping

_OURS = re.compile(r"^job-0*(\d+)(?:_(\d+))?$")
_SLURMS = re.compile(r"^(\d+)(?:_(\d+))?$")
_PATTERN = re.compile(r"%(\d*)([%A-Za-z])")
NOT_AN_ARRAY = "4294967294"  # Slurm's %a of a job that is not an array task


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


def fill_pattern(pattern: str, values: Mapping[str, str]) -> str:
    """A Slurm file-name pattern (``-o``/``-e`` of sbatch and srun) with each ``%X`` of
    ``values`` replaced (``%%`` is ``%``); a width (``%4a``) pads a number with zeros.
    A letter not in ``values`` is left as written."""

    def one(match: re.Match[str]) -> str:
        width, letter = match.groups()
        if letter == "%":
            return "%"
        value = values.get(letter)
        if value is None:
            return match.group(0)
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _PATTERN.sub(one, pattern)
