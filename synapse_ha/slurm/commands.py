"""The Slurm commands an sbatch job's processes find first on their PATH: small scripts
in a private directory that run ours with the worker's interpreter."""

from __future__ import annotations

from pathlib import Path

SLURM_COMMANDS = {"srun": "synapse_ha.slurm.srun", "scontrol": "synapse_ha.cli.scontrol"}


def write_commands(bin_dir: Path, python: str) -> None:
    """``srun`` and ``scontrol`` in ``bin_dir``: ``python`` running ours."""
    for name, module in SLURM_COMMANDS.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{python}" -m {module} "$@"\n')
        path.chmod(0o700)
