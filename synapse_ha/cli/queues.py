"""``synctl queues`` and ``synctl queue set|delete``: the cluster's queues (DESIGN §8,
docs/queues.md).

``queues`` shows each queue's nominal quota, what it uses, borrows from its cohort and
lends to it, and what waits, with the priority classes and the preemption mode. ``queue
set`` and ``queue delete`` are for admins; the cluster refuses anyone else with
PERMISSION_DENIED (exit 5). Added to ``synctl`` by :mod:`synapse_ha.cli.main`.
"""

from __future__ import annotations

import click

from synapse_ha.cli import render_cohorts, render_queues
from synapse_ha.cli.app import (
    CommandFailed,
    Settings,
    delete_command,
    emit,
    emit_put,
    limit_option,
    output_option,
    with_settings,
)
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.client import queues as client_queues
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.spec.document import SpecError, parse_cpu, parse_duration, parse_memory
from synapse_ha.rpc.errors import Reason


@click.command()
@click.option(
    "--tree", is_flag=True, help="Draw the cohort tree: nominal, used and borrowed per node."
)
@output_option
@with_settings
def queues(settings: Settings, tree: bool) -> None:
    """List queues: nominal GPUs, used, borrowed, lent, running and pending jobs.

    \b
    Examples:
      synctl queues
      synctl queues -o json
      synctl queues --tree
    """
    answer = client_queues.list_queues(settings.client())
    if tree:
        drawn = render_cohorts.tree_document(answer)
        emit(settings, drawn, lambda: render_cohorts.tree_table(drawn))
        return
    document = render_queues.queues_document(answer)
    emit(settings, document, lambda: render_queues.queues_table(document))


@click.group()
def queue() -> None:
    """Create, change and delete queues (admins only).

    \b
    Examples:
      synctl queue set team-a --gpu 64 --cohort research --borrowing-limit 32
      synctl queue set team-b --gpu 32 --cohort research --lending-limit 16
      synctl queue delete team-b
    """


def _classes(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


@queue.command("set")
@click.argument("name")
@limit_option("--gpu", "Nominal GPU quota.")
@click.option("--cpu", default=None, help="Nominal CPU: cores (64, 0.5) or millicores (500m).")
@click.option("--memory", default=None, help="Nominal memory, e.g. 512Gi.")
@click.option(
    "--cohort",
    default="",
    help="Queues of one cohort lend each other idle quota; a cohort of the cohort tree "
    "(synctl cohort set) lends and borrows through the cohorts above it too.",
)
@limit_option(
    "--borrowing-limit",
    "GPUs it may borrow beyond its quota (default: any idle quota of the cohort).",
)
@limit_option("--lending-limit", "Of its idle quota, GPUs others may borrow (default: all of it).")
@click.option(
    "--classes",
    default="",
    help="Priority classes its jobs may use, comma-separated (default: all that do not "
    "preempt; a class that preempts must be named).",
)
@click.option(
    "--max-priority",
    type=click.IntRange(-1_000_000, 1_000_000),
    default=0,
    show_default=True,
    help="The highest priority users may give a job here; more needs a token allowing it.",
)
@click.option(
    "--min-runtime",
    default=None,
    help="How long its gangs run (from their bind) before they may be preempted, e.g. 2h "
    "(default 0; the longer of this and the job's class's holds).",
)
@limit_option(
    "--user-running-members",
    "At most this many members of one user's live gangs when it starts a gang here "
    "(default: the cluster's limits.running_members_per_user).",
)
@limit_option(
    "--user-members-per-node",
    "At most this many members of one user's live gangs on one node, for gangs of "
    "this queue (default: the cluster's limits.members_per_node_per_user).",
)
@click.option(
    "--default-time-limit",
    default=None,
    help="How long its jobs without a time_limit are expected to run, e.g. 4h (Slurm's "
    "DefaultTime): an estimate for reservations and backfill, never a limit they are "
    "stopped at (default: unknown).",
)
@click.option(
    "--learned-estimates",
    is_flag=True,
    help="Expect such jobs to run as long as the 90th percentile of the finished runs of "
    "the same user and name here (or of the user here), from 5 runs on.",
)
@output_option
@with_settings
def queue_set(
    settings: Settings,
    name: str,
    gpu: int | None,
    cpu: str | None,
    memory: str | None,
    cohort: str,
    borrowing_limit: int | None,
    lending_limit: int | None,
    classes: str,
    max_priority: int,
    min_runtime: str | None,
    user_running_members: int | None,
    user_members_per_node: int | None,
    default_time_limit: str | None,
    learned_estimates: bool,
) -> None:
    """Create queue NAME, or replace all of its settings (unset options become unset).

    \b
    Example:
      synctl queue set team-a --gpu 64 --cohort research --classes normal,high
      synctl queue set batch --default-time-limit 4h --learned-estimates
    """
    try:
        cpu_milli = parse_cpu(cpu, "--cpu") if cpu is not None else None
        memory_mib = parse_memory(memory, "--memory") if memory is not None else None
        min_runtime_ms = parse_duration(min_runtime, "--min-runtime") if min_runtime else 0
        default_time_limit_ms = (
            parse_duration(default_time_limit, "--default-time-limit") if default_time_limit else 0
        )
    except SpecError as exc:
        raise CommandFailed(ExitCode.USAGE, str(exc), str(Reason.INVALID_FIELD)) from exc
    record = Queue(
        name=name,
        gpu=gpu,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        cohort=cohort,
        borrowing_limit_gpu=borrowing_limit,
        lending_limit_gpu=lending_limit,
        priority_classes=tuple(_classes(classes)),
        max_priority=max_priority,
        min_runtime_ms=min_runtime_ms,
        running_members_per_user=user_running_members,
        members_per_node_per_user=user_members_per_node,
        default_time_limit_ms=default_time_limit_ms,
        learned_estimates=learned_estimates,
    )
    emit_put(settings, "queue", name, client_queues.set_queue(settings.client(), record))


@delete_command(queue)
def queue_delete(client: ClusterClient, name: str) -> None:
    """Delete queue NAME (refused for default and while unfinished jobs name it).

    \b
    Example:
      synctl queue delete team-b
    """
    client_queues.delete_queue(client, name)


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [queues, queue]
