"""``synctl scontrol``: the parts of Slurm's ``scontrol`` batch scripts call
(docs/slurm.md).

``show hostnames [LIST]`` prints each host of a Slurm host list on its own line (``LIST``
defaults to ``$SLURM_JOB_NODELIST``, as scontrol's does); ``show hostlist HOSTS`` writes
hosts as one compressed list; ``show job [ID]`` shows jobs in scontrol's ``Key=Value``
form (:func:`synapse_ha.cli.slurm.show_job`). Inside an sbatch job, ``scontrol`` runs this
(the script's preamble names it), so ``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1``
works unmodified. ``python -m synapse_ha.cli.scontrol`` is the same program.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click
import grpc

from synapse_ha.cli.app import CommandFailed, Settings, discover, with_settings
from synapse_ha.cli.defaults import DEFAULT_TIMEOUT_S, ExitCode
from synapse_ha.cli.slurm import show_jobs, split_ids
from synapse_ha.client import slurm_fields as sf
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.slurm.hostlist import HostListError, compress, expand_all

NODELIST_ENV = "SLURM_JOB_NODELIST"


@click.group(name="scontrol")
def scontrol() -> None:
    """Slurm's scontrol, the subcommands batch scripts call: show hostnames, show
    hostlist, show job, requeue.

    \b
    Examples:
      synctl scontrol show hostnames 'gpu[01-03],login'
      synctl scontrol show hostlist gpu01,gpu02,gpu03
      synctl scontrol requeue "$SLURM_JOB_ID"
    """


@scontrol.group(name="show")
def show() -> None:
    """Show jobs, a host list's hosts, or hosts as a host list.

    \b
    Examples:
      synctl scontrol show hostnames 'gpu[01-03]'
      synctl scontrol show hostlist gpu01,gpu02,gpu03
    """


@show.command(name="job")
@click.argument("ids", nargs=-1, metavar="[JOBID]...")
@with_settings
def job(settings: Settings, ids: tuple[str, ...]) -> None:
    """Show jobs as Slurm's scontrol does (Key=Value: JobId, JobState, NodeList,
    NumNodes, BatchHost, WorkDir, ...); without JOBID, every pending and running job.

    \b
    Examples:
      synctl scontrol show job 42
      synctl scontrol show job "$SLURM_JOB_ID" | grep -o 'NodeList=[^ ]*'
    """
    show_jobs(settings, ids)


@show.command(name="hostnames")
@click.argument("lists", nargs=-1, metavar="[LIST]...")
def hostnames(lists: tuple[str, ...]) -> None:
    """Print every host LIST names (Slurm's form: node[01-04,07],login), one per line;
    without LIST, those of $SLURM_JOB_NODELIST.

    \b
    Examples:
      synctl scontrol show hostnames 'gpu[01-03],login'
      synctl scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1
    """
    if not lists:
        given = os.environ.get(NODELIST_ENV, "")
        if not given:
            raise CommandFailed(
                ExitCode.USAGE, f"no host list given and ${NODELIST_ENV} is not set", "USAGE"
            )
        lists = (given,)
    for host in _expand(lists):
        click.echo(host)


@show.command(name="hostlist")
@click.argument("hosts", nargs=-1, required=True, metavar="HOSTS...")
def hostlist(hosts: tuple[str, ...]) -> None:
    """Print HOSTS (comma-separated, or several arguments) as one host list, in their
    order: gpu01,gpu02,gpu03 is gpu[01-03].

    \b
    Examples:
      synctl scontrol show hostlist gpu01,gpu02,gpu03
      synctl scontrol show hostlist gpu01 gpu02 login
    """
    click.echo(compress(_expand(hosts)))


@scontrol.command(name="requeue")
@click.argument("ids", nargs=-1, required=True, metavar="JOBID[,JOBID]...")
@with_settings
def requeue(settings: Settings, ids: tuple[str, ...]) -> None:
    """Stop running jobs and queue them again in their place, as Slurm's scontrol
    requeue: each waits for a new attempt (an array's id: its running tasks). A job
    that holds no nodes is refused (exit 1); silent when every one was requeued.

    \b
    Examples:
      synctl scontrol requeue 42
      scontrol requeue "$SLURM_JOB_ID"      # from inside the job, e.g. on its --signal
    """
    client = settings.client()
    failed = []
    for text in split_ids(ids):
        try:
            client.requeue_job(sf.job_id_of(text), "scontrol requeue")
        except grpc.RpcError as exc:
            failure = failure_of(exc)
            if failure.reason not in (Reason.CONFLICT, Reason.JOB_NOT_FOUND):
                raise
            click.echo(f"scontrol: error: job {text}: {failure.message}", err=True)
            failed.append(text)
    if failed:
        raise CommandFailed(ExitCode.JOB_FAILED, f"not requeued: {', '.join(failed)}", "CONFLICT")


def _expand(lists: Sequence[str]) -> list[str]:
    try:
        return expand_all(lists)
    except HostListError as exc:
        raise CommandFailed(ExitCode.USAGE, f"host list {exc}", "USAGE") from exc


COMMANDS: list[click.Command] = [scontrol]


def main(argv: Sequence[str] | None = None) -> None:
    """``scontrol`` on its own (no cluster is asked): errors as one line on stderr."""
    args = list(argv) if argv is not None else sys.argv[1:]
    settings = Settings(addresses=[], output="table", timeout=DEFAULT_TIMEOUT_S)
    try:
        found = discover(None, token_file=None, ca=None, cert=None, key=None)
        settings.addresses, settings.token, settings.tls = found.addresses, found.token, found.tls
    except CommandFailed:
        pass  # no cluster settings here: show job says so, the host lists need none
    try:
        scontrol.main(args=args, prog_name="scontrol", standalone_mode=False, obj=settings)
    except CommandFailed as exc:
        click.echo(f"scontrol: error: {exc}", err=True)
        sys.exit(int(exc.code))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    finally:
        settings.close()


if __name__ == "__main__":
    main()
