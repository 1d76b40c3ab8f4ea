"""Slurm's commands as small scripts that run ours: in a private directory first on an
sbatch job's PATH (the batch script and every step's tasks), and in the folder an
operator writes with ``synctl slurm-commands`` for tools that call Slurm's by name."""

from __future__ import annotations

import shlex
from pathlib import Path

# Each Slurm command and the module (with its first arguments) that runs it: synctl's
# (ids in Slurm's form) or srun's and scontrol's own.
PROGRAMS: dict[str, tuple[str, ...]] = {
    "sbatch": ("synapse_ha.cli", "sbatch", "--slurm-ids"),
    "squeue": ("synapse_ha.cli", "squeue"),
    "sacct": ("synapse_ha.cli", "sacct"),
    "scancel": ("synapse_ha.cli", "scancel"),
    "sinfo": ("synapse_ha.cli", "sinfo"),
    "scontrol": ("synapse_ha.cli.scontrol",),
    "srun": ("synapse_ha.slurm.srun",),
}


def write_commands(bin_dir: Path, python: str, mode: int = 0o700) -> None:
    """Every command of :data:`PROGRAMS` in ``bin_dir``: ``python`` running ours."""
    for name, (module, *args) in PROGRAMS.items():
        words = " ".join(shlex.quote(w) for w in (python, "-m", module, *args))
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec {words} "$@"\n')
        path.chmod(mode)
