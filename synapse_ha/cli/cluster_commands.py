"""``synctl cluster``: the replicas' status, and the membership and backup subcommands
of :mod:`synapse_ha.cli.cluster_ops`."""

from __future__ import annotations

import click

from synapse_ha.cli import render_cluster
from synapse_ha.cli.app import Settings, emit, output_option, with_settings
from synapse_ha.cli.cluster_ops import add_cluster_commands
from synapse_ha.client.replicas import cluster_status

# ------------------------------------------------------------------------- cluster


@click.group(invoke_without_command=True)
@output_option
@with_settings
def cluster(settings: Settings) -> None:
    """Show the replicas: role, term, commit index, leader and health.

    Any replica answers (no leader needed), so this also works while there is none.
    Subcommands change the replica set and save backups (admins only).

    \b
    Example:
      synctl cluster
      synctl cluster add-replica r4 10.0.0.4:7001 10.0.0.4:7101
      synctl cluster snapshot save backup.snap
    """
    if click.get_current_context().invoked_subcommand is not None:
        return
    document = render_cluster.cluster_document(cluster_status(settings.client()))
    emit(settings, document, lambda: render_cluster.cluster_table(document))


add_cluster_commands(cluster)


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [cluster]
