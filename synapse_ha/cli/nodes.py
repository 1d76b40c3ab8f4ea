"""``synctl nodes | nodes repair | cordon | uncordon | drain``."""

from __future__ import annotations

import click

from synapse_ha.cli import render_nodes
from synapse_ha.cli.app import (
    Settings,
    complete_node_ids,
    emit,
    now_ms,
    output_option,
    with_settings,
)
from synapse_ha.client import nodes as client_nodes

# --------------------------------------------------------------------------- nodes


@click.group(invoke_without_command=True)
@output_option
@with_settings
def nodes(settings: Settings) -> None:
    """List nodes: status, topology path, free GPUs, CPU and memory in use, last heartbeat.

    \b
    Example:
      synctl nodes -o yaml
    """
    if click.get_current_context().invoked_subcommand is not None:
        return
    now = now_ms()
    documents = [
        render_nodes.node_document(n, now) for n in client_nodes.list_nodes(settings.client())
    ]
    emit(settings, {"nodes": documents}, lambda: render_nodes.nodes_table(documents))


@nodes.command()
@click.argument("node_id", metavar="NODE", shell_complete=complete_node_ids)
@click.option(
    "--gpu",
    "gpus",
    type=click.IntRange(min=0),
    multiple=True,
    help="A GPU index to mark healthy again (repeatable); default: every GPU of NODE.",
)
@output_option
@with_settings
def repair(settings: Settings, node_id: str, gpus: tuple[int, ...]) -> None:
    """Clear NODE's GPU faults: the scheduler places on those GPUs again.

    Once the hardware is fixed or checked. Prints the cluster's answer and the faults
    left; a GPU that fails again is reported unhealthy again by its worker.

    \b
    Example:
      synctl nodes repair gpu-017 --gpu 3 --gpu 5
    """
    answer = client_nodes.repair_gpus(settings.client(), node_id, sorted(set(gpus)))
    document = render_nodes.repair_document(node_id, answer)
    emit(settings, document, lambda: render_nodes.repair_text(document))


def _node_status_command(action: str, summary: str, example: str) -> click.Command:
    @click.command(name=action, help=f"{summary}\n\n\b\nExample:\n  {example}")
    @click.argument("node_id", metavar="NODE", shell_complete=complete_node_ids)
    @click.option("--reason", default="", help="Shown in `synctl nodes -o json`.")
    @output_option
    @with_settings
    def command(settings: Settings, node_id: str, reason: str) -> None:
        new_status = settings.client().set_node_status(node_id, action, reason)
        document = {"id": node_id, "status": new_status}
        emit(settings, document, lambda: f"node {node_id}: {new_status}")

    return command


_STATUS_COMMANDS: list[click.Command] = []
_STATUS_COMMANDS.append(
    _node_status_command(
        "cordon",
        "Stop placing new members on NODE; members already there keep running.",
        'synctl cordon gpu-017 --reason "flaky NIC"',
    )
)
_STATUS_COMMANDS.append(
    _node_status_command("uncordon", "Let NODE take new members again.", "synctl uncordon gpu-017")
)
_STATUS_COMMANDS.append(
    _node_status_command(
        "drain",
        "Place nothing new on NODE and let its members finish; it is cordoned once empty.",
        'synctl drain gpu-017 --reason "maintenance"',
    )
)


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [nodes, *_STATUS_COMMANDS]
