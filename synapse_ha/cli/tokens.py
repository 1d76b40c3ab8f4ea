"""``synctl token create | list | revoke`` (admins)."""

from __future__ import annotations

import click

from synapse_ha.cli import render_tokens
from synapse_ha.cli.app import CommandFailed, Settings, emit, note, output_option, with_settings
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.client import tokens as client_tokens
from synapse_ha.core.spec.document import SpecError, parse_duration
from synapse_ha.rpc.errors import Reason

# -------------------------------------------------------------------------- tokens


@click.group()
def token() -> None:
    """Create, list and revoke users' bearer tokens (admins only).

    \b
    Example:
      synctl token create --user alice --role user --ttl 90d
      synctl token list
    """


@token.command("create")
@click.option("--user", "user_name", required=True, help="The user the token names.")
@click.option(
    "--role", type=click.Choice(["user", "operator", "admin"]), default="user", show_default=True
)
@click.option("--queue", "queues", multiple=True, help="A queue it may submit to (repeatable).")
@click.option("--ttl", default="", help="Lifetime, e.g. 90d or 12h (default: never expires).")
@click.option(
    "--priority-class",
    "priority_classes",
    multiple=True,
    help="A class that preempts its user may use, in queues that list it (repeatable).",
)
@click.option(
    "--max-priority",
    type=click.IntRange(-1_000_000, 1_000_000),
    default=0,
    help="The highest priority it allows above a queue's own max_priority.",
)
@output_option
@with_settings
def token_create(
    settings: Settings,
    user_name: str,
    role: str,
    queues: tuple[str, ...],
    ttl: str,
    priority_classes: tuple[str, ...],
    max_priority: int,
) -> None:
    """Create a token and print it. It is shown this once: only its hash is kept.

    \b
    Examples:
      synctl token create --user alice --role user --ttl 90d > alice.token
      synctl token create --user bob --queue urgent --priority-class high > bob.token
    """
    try:
        ttl_ms = parse_duration(ttl, "ttl") if ttl else 0
    except SpecError as exc:
        raise CommandFailed(ExitCode.USAGE, str(exc), str(Reason.INVALID_FIELD)) from exc
    answer = client_tokens.create_token(
        settings.client(),
        user_name,
        role,
        queues,
        ttl_ms,
        priority_classes=priority_classes,
        max_priority=max_priority,
    )
    document = render_tokens.created_token_document(answer, user_name, role)
    emit(settings, document, lambda: answer.token)
    if settings.output == "table":
        note(f"token {answer.token_id} for {user_name} (role {role}); it is not shown again")


@token.command("list")
@output_option
@with_settings
def token_list(settings: Settings) -> None:
    """List tokens (never their secrets): user, role, who made them, expiry, revocation.

    \b
    Example:
      synctl token list -o json
    """
    tokens = client_tokens.list_tokens(settings.client())
    documents = [render_tokens.token_document(t) for t in tokens]
    emit(settings, {"tokens": documents}, lambda: render_tokens.tokens_table(documents))


@token.command("revoke")
@click.argument("token_id", metavar="ID")
@output_option
@with_settings
def token_revoke(settings: Settings, token_id: str) -> None:
    """Revoke a token: every replica refuses it once the revocation commits.

    \b
    Example:
      synctl token revoke 0123456789ab
    """
    revoked_at_ms = client_tokens.revoke_token(settings.client(), token_id)
    document = {"id": token_id, "revoked_at_ms": revoked_at_ms}
    emit(settings, document, lambda: f"token {token_id}: revoked")


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [token]
