"""``synctl``: the command-line client of a synapse cluster.

Every command is a thin adapter: it turns its arguments into one or a few gRPC calls
through :class:`ClusterClient` (which finds the leader by itself) and hands the answer to
:mod:`synapse_ha.cli.render`. Errors are one line on stderr and an exit code from
:class:`ExitCode`: 0 ok, 1 job failed (``--wait``) or another error, 2 usage or invalid
spec, 3 cluster (or worker) unreachable within ``--timeout``, 4 no such job or node, 5
refused (no credential, a bad one, or not allowed). With
``-o json`` or ``-o yaml`` the error is a document instead, ``{"error": {"code": ...,
"message": ...}}``, whose code is the cluster's reason (docs/errors.md) or one of synctl's
own (``UNREACHABLE``, ``INTERRUPTED``, ...). The exit code is the same either way.

Credentials (DESIGN §8). synctl presents a client certificate (``--ca``/``--cert``/
``--key``) over mutual TLS and sends a bearer token, found as
:mod:`synapse_ha.client.credentials` says; the token says who the caller is, or, without one, a user
certificate does. Without TLS files it speaks plaintext, which only an ``--insecure``
cluster accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import click

from synapse_ha.cli import (
    cluster_commands,
    cohorts,
    config,
    dev,
    jobs,
    nodes,
    queues,
    render,
    sbatch,
    scontrol,
    sinfo,
    slurm,
    srun,
    tokens,
)
from synapse_ha.cli.app import (
    LOCAL_COMMANDS,
    F,
    Settings,
    SynctlGroup,
    cluster_callback,
    discover,
)
from synapse_ha.cli.ca import ca
from synapse_ha.cli.defaults import DEFAULT_TIMEOUT_S
from synapse_ha.cli.history import HISTORY_COMMANDS
from synapse_ha.client.credentials import (
    CA_ENV,
    CA_FILE_NAME,
    CERT_ENV,
    CERT_FILE_NAME,
    CLUSTER_ENV,
    DEFAULT_CLUSTER,
    KEY_ENV,
    KEY_FILE_NAME,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
)

# --------------------------------------------------------------------------- group


def _file_option(flag: str, envvar: str, help: str) -> Callable[[F], F]:
    """A global option naming a file, read from ``envvar`` when not given."""
    return click.option(
        flag,
        type=click.Path(dir_okay=False, path_type=Path),
        envvar=envvar,
        show_envvar=True,
        default=None,
        help=help,
    )


@click.group(
    cls=SynctlGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=(
        "Exit codes: 0 ok, 1 job failed (--wait) or other error, 2 usage or invalid spec, "
        "3 cluster unreachable, 4 not found, 5 refused (credential or permission).\n\n"
        'Shell completion (bash): eval "$(_SYNCTL_COMPLETE=bash_source synctl)"; '
        "zsh: zsh_source; fish: fish_source."
    ),
)
@click.option(
    "--cluster",
    envvar=CLUSTER_ENV,
    default=None,
    show_envvar=True,
    callback=cluster_callback,
    help="gRPC addresses of the scheduler replicas, comma-separated (any one will do; "
    "requests find the leader). Default: the cluster of a running `synctl dev up` "
    f"(with its admin credentials), else {DEFAULT_CLUSTER}.",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(render.OUTPUT_FORMATS),
    default="table",
    show_default=True,
    help="table for people; json or yaml for scripts (stable, see docs/cli.md).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=3600),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds each call may take, leader search and retries included.",
)
@_file_option(
    "--token-file",
    TOKEN_FILE_ENV,
    f"File holding the bearer token to send (default: ${TOKEN_ENV}, else "
    "$XDG_CONFIG_HOME/synapse/token, i.e. ~/.config/synapse/token).",
)
@_file_option(
    "--ca",
    CA_ENV,
    f"The cluster CA bundle (PEM) (default: $XDG_CONFIG_HOME/synapse/{CA_FILE_NAME} "
    "when it exists). With --cert and --key: mutual TLS; without all three: plaintext.",
)
@_file_option(
    "--cert",
    CERT_ENV,
    f"synctl's client certificate (PEM) (default: .../synapse/{CERT_FILE_NAME}).",
)
@_file_option(
    "--key",
    KEY_ENV,
    f"The client certificate's private key (default: .../synapse/{KEY_FILE_NAME}).",
)
@click.version_option(package_name="synapse-ha", prog_name="synctl")
@click.pass_context
def cli(
    ctx: click.Context,
    cluster: list[str],
    output: str,
    timeout: float,
    token_file: Path | None,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
) -> None:
    """Submit and watch gang jobs, and look after the nodes and replicas of a synapse
    cluster.

    \b
    Examples:
      synctl submit examples/cpu-gang.yaml --wait
      synctl jobs -o json
      synctl --cluster 10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000 cluster

    \b
    Where synctl finds the cluster and its credentials, first match wins: the flags,
    the SYNAPSE_* variables, the running `synctl dev up` (its profile), the files in
    $XDG_CONFIG_HOME/synapse (ca.pem, cert.pem, key.pem, token). `synctl dev env`
    prints the dev cluster's settings as export lines.
    """
    settings = Settings(addresses=cluster or [], output=output, timeout=timeout)
    ctx.obj = settings
    ctx.call_on_close(settings.close)
    if ctx.invoked_subcommand in LOCAL_COMMANDS:
        return  # they touch local files or start processes; no cluster credentials
    found = discover(cluster, token_file=token_file, ca=ca, cert=cert, key=key)
    settings.addresses, settings.token, settings.tls = found.addresses, found.token, found.tls


for _command in (
    *jobs.COMMANDS,
    *sbatch.COMMANDS,
    *scontrol.COMMANDS,
    *slurm.COMMANDS,
    *sinfo.COMMANDS,
    *srun.COMMANDS,
    *nodes.COMMANDS,
    *cluster_commands.COMMANDS,
    *tokens.COMMANDS,
    *config.COMMANDS,
    *queues.COMMANDS,
    *cohorts.COMMANDS,
    *HISTORY_COMMANDS,
    *dev.COMMANDS,
    ca,
):
    cli.add_command(_command)


# ---------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> None:
    cli.main(args=list(argv) if argv is not None else None, prog_name="synctl")
