"""``synctl srun``: Slurm's srun outside an allocation (docs/slurm.md, "Job steps").

Slurm's ``srun`` run where there is no allocation makes one, runs its command there as
one job step, prints the step's output and exits with its status. This does the same
with an sbatch job (:mod:`synapse_ha.cli.sbatch`): the allocation is what srun's own
options ask for (:func:`synapse_ha.slurm.srun.allocation_options`), its batch script is
``srun`` with the same words (inside the allocation, a job step), and the first
member's output (the step's, relayed by the batch script) is streamed here. Interrupted,
it cancels the job. The ``srun`` on an sbatch job's PATH and in ``synctl slurm-commands``'
folder comes here by itself when it finds no allocation.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex

import click

from synapse_ha.cli.app import CommandFailed, Settings, note, with_settings
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.jobs import follow_job
from synapse_ha.cli.sbatch import exit_status, prepare, submit
from synapse_ha.slurm import srun as slurm_srun
from synapse_ha.slurm.ids import slurm_id


@click.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,  # COMMAND's own --help is COMMAND's
        "help_option_names": ["--help"],
    },
    options_metavar="[SRUN OPTIONS]",
)
@click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar="COMMAND [ARGS]...")
@with_settings
def srun(settings: Settings, words: tuple[str, ...]) -> None:
    """Run COMMAND as a job of its own, as Slurm's srun does outside an allocation: the
    nodes and tasks its options ask for (-N, -n, --ntasks-per-node, -c, --gpus-per-task,
    --gres, --mem, -t, -p, -w, -x, -C, ...), its output here, its exit status; Ctrl-C
    cancels it.

    \b
    Examples:
      synctl srun -N 2 --ntasks-per-node 8 --gres=gpu:8 python train.py
      synctl srun -l -n 4 hostname
    """
    try:
        args = _parser().parse_args(list(words))
    except _UsageError as exc:
        raise CommandFailed(ExitCode.USAGE, f"srun: {exc}", "USAGE") from exc
    if not args.command or args.command == ["--"]:
        raise CommandFailed(ExitCode.USAGE, "srun: no command given", "USAGE")
    script = "#!/bin/sh\nexec srun " + shlex.join(words) + "\n"
    _, parsed = prepare(settings, script, "srun", slurm_srun.allocation_options(args), [])
    job_id = submit(settings, parsed, "srun")
    note(f"srun: job {slurm_id(job_id)} queued")
    try:
        job = follow_job(settings, job_id, 0, raw=True)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            settings.client().cancel_job(job_id, "srun interrupted")
        note(f"srun: job {slurm_id(job_id)} cancelled")
        raise
    code = exit_status(job)
    if code:
        raise click.exceptions.Exit(code)


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    """srun's options, its usage errors raised instead of exiting."""
    base = slurm_srun.parser()
    parser = _Parser(prog="srun", add_help=False, parents=[base], conflict_handler="resolve")
    return parser


COMMANDS: list[click.Command] = [srun]
