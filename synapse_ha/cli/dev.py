"""``synctl dev up|env``: a local cluster on this machine, and the settings that reach it.

``dev up`` runs it in the foreground (:mod:`synapse_ha.local.foreground`) and publishes
its dev profile, through which synctl and the Python client of the same account find it
with no settings (:mod:`synapse_ha.client.credentials`). ``dev env`` prints that profile
as shell lines, for ``eval "$(synctl dev env)"``. Neither calls the cluster, so neither
reads any credential (``LOCAL_COMMANDS``). Added to ``synctl`` by
:mod:`synapse_ha.cli.main`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from synapse_ha.cli.app import CommandFailed
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.client.credentials import dev_profile_path, read_dev_profile


@click.group()
def dev() -> None:
    """Tools for trying synapse on one machine."""


@dev.command("up")
@click.option("--workers", type=click.IntRange(0, 64), default=4, show_default=True)
@click.option("--racks", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option(
    "--gpus-per-worker",
    type=click.IntRange(0, 64),
    default=8,
    show_default=True,
    help="Mock GPUs each worker declares.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep replica and worker data (and the cluster's credentials) here (default: a "
    "temporary directory, removed).",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="No TLS and no authentication: anyone who can reach the ports is an admin.",
)
@click.option(
    "--replicas",
    type=click.Choice(["3", "5"]),
    default="3",
    show_default=True,
    help="Scheduler replicas (five survive two failures; ports 7101-7105).",
)
def dev_up(
    workers: int,
    racks: int,
    gpus_per_worker: int,
    data_dir: Path | None,
    insecure: bool,
    replicas: str,
) -> None:
    """Run three (or, with --replicas 5, five) scheduler replicas and mock-GPU workers on
    127.0.0.1 in the foreground, until Ctrl-C; then stop them all.

    Secure by default: it makes a CA, certificates and an admin token in
    DATA_DIR/credentials. While it runs, synctl and the Python client of this account
    find the cluster and those credentials by themselves (through the dev profile,
    $XDG_CONFIG_HOME/synapse/dev-cluster.json); `synctl dev env` prints them as export
    lines. The replicas listen on 127.0.0.1:7101-7103 when free, else on free ports.

    \b
    Example:
      synctl dev up --workers 4 --racks 2
      # in another shell:
      synctl submit examples/cpu-gang.yaml --follow
    """
    from synapse_ha.local.devoptions import DevClusterOptions
    from synapse_ha.local.foreground import run_foreground

    sys.exit(
        run_foreground(
            DevClusterOptions(
                workers=workers,
                racks=racks,
                gpus_per_worker=gpus_per_worker,
                data_dir=data_dir,
                insecure=insecure,
                replicas=int(replicas),
            ),
            out=click.echo,
        )
    )


@dev.command("env")
def dev_env() -> None:
    """Print the shell lines that point synctl and the Python client at the running dev
    cluster as its admin (and unset the SYNAPSE_* variables it does not use).

    \b
    Example:
      eval "$(synctl dev env)"
    """
    profile = read_dev_profile()
    if profile is None:
        raise CommandFailed(
            ExitCode.NOT_FOUND,
            f"no dev cluster is running (no live profile at {dev_profile_path()}); "
            "start one with `synctl dev up`",
            "NOT_FOUND",
        )
    for line in profile.exports():
        click.echo(line)


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [dev]
