"""``synctl ca``: make the cluster CA and issue certificates (DESIGN §8).

Local file operations only; no cluster is contacted. Each command prints the paths it
wrote, one per line. Errors (a CA or certificate already there, a bad name) are one line
on stderr with exit code 1, or 2 for a bad argument.
"""

from __future__ import annotations

from pathlib import Path

import click

from synapse_ha.core.identity.access import NAME_PATTERN, Identity, Kind, Role
from synapse_ha.security.pki import PkiError, init_ca, issue, issue_client

# The transport-only certificate kind (no identity: a token says who the caller is).
CLIENT = "client"


@click.group()
def ca() -> None:
    """Create the cluster CA and issue replica, worker and user certificates.

    \b
    Example:
      synctl ca init /etc/synapse/ca
      synctl ca issue replica r1 --ca-dir /etc/synapse/ca --host 10.0.0.1 --out /etc/synapse
      synctl ca issue user alice --role admin --ca-dir /etc/synapse/ca
    """


@ca.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--days", type=click.IntRange(min=1), default=3650, show_default=True, help="CA lifetime."
)
@click.option("--name", "common_name", default="synapse cluster CA", show_default=True)
def ca_init(directory: Path, days: int, common_name: str) -> None:
    """Create a new CA (ca.pem, and ca.key readable by its owner only) in DIRECTORY.
    Refuses when a CA is there already.

    \b
    Example:
      synctl ca init /etc/synapse/ca
    """
    try:
        files = init_ca(directory, common_name=common_name, days=days)
    except PkiError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(files.cert)
    click.echo(files.key)


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise click.BadParameter(
            f"{value!r}: use letters, digits, '.', '_' and '-', starting with a letter or "
            "digit, at most 63 characters"
        )
    return value


@ca.command("issue")
@click.argument("kind", type=click.Choice([*(k.value for k in Kind), CLIENT]))
@click.argument("name", callback=_name)
@click.option(
    "--ca-dir",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The directory `synctl ca init` made.",
)
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    default=None,
    help="A user's role (default: user). Users only.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A host name or IP address clients dial (replicas and workers); repeatable.",
)
@click.option(
    "--days", type=click.IntRange(min=1), default=365, show_default=True, help="Lifetime."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Where to write KIND-NAME.pem and KIND-NAME.key.",
)
@click.option("--force", is_flag=True, help="Replace an existing certificate and key.")
def ca_issue(
    kind: str,
    name: str,
    ca_dir: Path,
    role: str | None,
    hosts: tuple[str, ...],
    days: int,
    out: Path,
    force: bool,
) -> None:
    """Issue a certificate for a replica (NAME: its id), a worker (NAME: its node id), a
    user, or a client (transport only: it completes the TLS handshake but names nobody;
    token holders use it with their token), signed by the CA in --ca-dir. Prints the
    certificate, key and CA paths. Replicas and workers serve gRPC: give every --host
    clients dial them by; their certificate also carries the name clients demand of their
    role (replica.synapse.invalid, or NODE.worker.synapse.invalid), which no --host may
    take. User and client certificates only call: they name no hosts and cannot serve.

    \b
    Examples:
      synctl ca issue worker gpu-7 --ca-dir ca --host 10.0.1.7 --host gpu-7.lan --out tls
      synctl ca issue user alice --role operator --ca-dir ca
      synctl ca issue client cli --ca-dir ca
    """
    if role is not None and kind != Kind.USER:
        raise click.BadParameter("only user certificates carry a role", param_hint="--role")
    if kind in (CLIENT, Kind.USER) and hosts:
        raise click.BadParameter(
            f"a {kind} certificate names no hosts (it only calls, never serves)",
            param_hint="--host",
        )
    try:
        if kind == CLIENT:
            files = issue_client(ca_dir, name, out, days=days, overwrite=force)
        else:
            identity_kind = Kind(kind)
            identity = Identity(
                identity_kind,
                name,
                Role(role or Role.USER) if identity_kind is Kind.USER else None,
            )
            files = issue(ca_dir, identity, out, hosts=hosts, days=days, overwrite=force)
    except PkiError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(files.cert)
    click.echo(files.key)
    click.echo(files.ca)
