"""``synctl cohort set|delete``: the cohort tree's records (DESIGN §8, docs/queues.md
"Hierarchical cohorts"). For admins; the cluster refuses anyone else with
PERMISSION_DENIED (exit 5). ``synctl queues --tree`` draws the tree. Added to ``synctl``
by :mod:`synapse_ha.cli.main`."""

from __future__ import annotations

import click

from synapse_ha.cli.app import (
    Settings,
    delete_command,
    emit_put,
    limit_option,
    output_option,
    with_settings,
)
from synapse_ha.client import queues as client_queues
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.cluster_config import Cohort


@click.group()
def cohort() -> None:
    """Create, change and delete cohorts of the cohort tree (admins only).

    \b
    Examples:
      synctl cohort set org --gpu 8
      synctl cohort set research --parent org --borrowing-limit 16 --lending-limit 8
      synctl cohort set lab --fair-sharing-preemption
      synctl queue set team-a --gpu 32 --cohort research
      synctl queues --tree
      synctl cohort delete research
    """


@cohort.command("set")
@click.argument("name")
@click.option("--parent", default="", help="The cohort it belongs to (default: a root).")
@limit_option("--gpu", "Its own nominal GPUs (default 0).")
@limit_option(
    "--borrowing-limit", "GPUs its subtree may take from its parent's pool (default: any)."
)
@limit_option(
    "--lending-limit",
    "Of its subtree's idle GPUs, how many its parent's other children may borrow (default: all).",
)
@click.option(
    "--fair-sharing-preemption/--no-fair-sharing-preemption",
    default=False,
    help="A queue below its fair share may preempt gangs of a borrowing queue above it "
    "where the two meet in this cohort (default: off; needs format 16).",
)
@output_option
@with_settings
def cohort_set(
    settings: Settings,
    name: str,
    parent: str,
    gpu: int | None,
    borrowing_limit: int | None,
    lending_limit: int | None,
    fair_sharing_preemption: bool,
) -> None:
    """Create cohort NAME, or replace all of its settings (unset options become unset).
    Needs every replica at format 7 (``synctl cluster -o json``).

    \b
    Example:
      synctl cohort set team-a --parent org --borrowing-limit 8
    """
    record = Cohort(
        name=name,
        parent=parent,
        gpu=gpu,
        borrowing_limit_gpu=borrowing_limit,
        lending_limit_gpu=lending_limit,
        fair_sharing_preemption=fair_sharing_preemption,
    )
    emit_put(settings, "cohort", name, client_queues.set_cohort(settings.client(), record))


@delete_command(cohort)
def cohort_delete(client: ClusterClient, name: str) -> None:
    """Delete cohort NAME (refused while another cohort names it as its parent; queues
    that name it form a cohort of their own again).

    \b
    Example:
      synctl cohort delete team-a
    """
    client_queues.delete_cohort(client, name)


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [cohort]
