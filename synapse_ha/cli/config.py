"""``synctl config show|set``: the cluster's per-identity limits (DESIGN §8,
docs/security.md "Limits").

Everyone may read them; ``config set`` is for admins (the cluster refuses anyone else
with PERMISSION_DENIED, exit 5) and changes only the limits it names, as
``limits.<name>=<value>``. Added to ``synctl`` by :mod:`synapse_ha.cli.main`.
"""

from __future__ import annotations

import dataclasses

import click

from synapse_ha.cli import render
from synapse_ha.cli.app import CommandFailed, Settings, emit, output_option, with_settings
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.client import limits as client_limits
from synapse_ha.core.cluster_config import Limits
from synapse_ha.rpc.errors import Reason

PREFIX = "limits."
# What each limit counts, for the table.
_UNITS = {
    "spec_bytes": "bytes, every caller",
    "env_bytes": "bytes, every caller",
    "pending_jobs_per_user": "jobs",
    "pending_jobs_per_queue": "jobs",
    "submit_burst": "submissions at once",
    "submit_per_s": "submissions a second",
    "watch_streams_per_identity": "streams, per replica",
    "watch_streams_total": "streams, per replica",
    "member_min_cpu_milli": "millicores a node reserves per member at least",
    "member_min_memory_mib": "MiB a node reserves per member at least",
    "member_overhead_memory_mib": "MiB a node reserves per member for its supervisor",
    "running_members_per_user": "members of one owner's live attempts, every owner",
    "members_per_node_per_user": "of those on one node, every owner",
}


@click.group()
def config() -> None:
    """Show and change the cluster's per-identity limits, and the floors and caps on
    members (what a node reserves per member; one user's members in the cluster and on a
    node).

    \b
    Examples:
      synctl config show
      synctl config set limits.pending_jobs_per_user=500 limits.submit_per_s=20
    """


def limits_document(limits: Limits) -> dict[str, int]:
    """``{name: value}`` in the order of :class:`Limits`' fields."""
    return dataclasses.asdict(limits)


def _limits_table(document: dict[str, int]) -> str:
    rows = [(f"{PREFIX}{name}", value, _UNITS.get(name, "")) for name, value in document.items()]
    note = (
        "Users and operators are held to them; admins, replicas and workers only to sizes. "
        "The member floors and caps hold every job's owner (a queue may set its own caps)."
    )
    return render.table(rows, ["limit", "value", "counts"]) + "\n" + note


@config.command("show")
@output_option
@with_settings
def config_show(settings: Settings) -> None:
    """Show the limits every user is held to.

    \b
    Example:
      synctl config show -o json
    """
    document = limits_document(client_limits.get_limits(settings.client()))
    emit(settings, {"limits": document}, lambda: _limits_table(document))


def _parse(assignment: str) -> tuple[str, int]:
    name, sep, value = assignment.partition("=")
    if not sep or not name.startswith(PREFIX):
        raise CommandFailed(
            ExitCode.USAGE,
            f"{assignment!r}: give limits.<name>=<whole number>, e.g. limits.submit_per_s=20",
            str(Reason.INVALID_FIELD),
        )
    try:
        number = int(value.replace("_", ""))
    except ValueError:
        raise CommandFailed(
            ExitCode.USAGE,
            f"{assignment!r}: {value!r} is not a whole number",
            str(Reason.INVALID_FIELD),
        ) from None
    return name[len(PREFIX) :], number


@config.command("set")
@click.argument("assignments", nargs=-1, required=True)
@output_option
@with_settings
def config_set(settings: Settings, assignments: tuple[str, ...]) -> None:
    """Change the named limits (admins only); the others stay as they are.

    \b
    Examples:
      synctl config set limits.pending_jobs_per_user=500
      synctl config set limits.submit_burst=50 limits.submit_per_s=10
    """
    limits = client_limits.set_limits(settings.client(), dict(_parse(a) for a in assignments))
    document = limits_document(limits)
    emit(settings, {"limits": document}, lambda: _limits_table(document))


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [config]
