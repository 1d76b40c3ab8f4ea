"""Arrays in synctl's job commands: ``submit --array``, ``submit --wait`` of an array,
and telling an array's id from a job's in an answer."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click
import grpc

from synapse_ha.cli import render
from synapse_ha.cli.app import CommandFailed, Settings, note
from synapse_ha.cli.defaults import POLL_INTERVAL_S, ExitCode
from synapse_ha.cli.render_arrays import array_document, states_text
from synapse_ha.client.jobs import get_array
from synapse_ha.core.model import JobState
from synapse_ha.core.spec.document import ParsedJob
from synapse_ha.core.workflows.arrays import array_problems
from synapse_ha.rpc.errors import Reason, failure_of


def with_array(parsed: ParsedJob, text: str, follow: bool) -> ParsedJob:
    """The spec as an array of ``text`` (``--array``'s, which replaces the spec's
    ``array:``); a malformed text, or ``--follow`` of an array, is a usage error naming the
    option and the rule."""
    for _, rule in array_problems(text.strip() or " "):
        raise CommandFailed(ExitCode.USAGE, f"--array: {rule}", str(Reason.INVALID_FIELD))
    if follow:
        raise CommandFailed(
            ExitCode.USAGE,
            "--follow streams one job's output; for an array, follow a task: "
            "synctl logs ARRAY --task INDEX -f",
            str(Reason.INVALID_FIELD),
        )
    spec = dataclasses.replace(parsed.spec, array=text.strip())
    return dataclasses.replace(parsed, spec=spec)


def is_array_answer(exc: grpc.RpcError) -> bool:
    """Whether a failed job call says its id names an array (JOB_NOT_FOUND with the
    array's task count)."""
    failure = failure_of(exc)
    return failure.reason is Reason.JOB_NOT_FOUND and "array" in failure.metadata


def wait_for_array(settings: Settings, array_id: str, document: dict[str, Any]) -> None:
    """Poll until every task of the array has finished, noting each change of the counts
    on stderr; exit 1 unless every task succeeded."""
    client = settings.client()
    last = ""
    while True:
        summary = array_document(get_array(client, array_id))
        counts = states_text(summary)
        done = summary["finished"] == summary["tasks"]
        if counts != last and not done:
            note(f"array {array_id}: {counts}")
            last = counts
        if done:
            break
        time.sleep(POLL_INTERVAL_S)
    note(f"array {array_id}: {counts}")
    succeeded = summary["task_states"].get(str(JobState.SUCCEEDED), 0) == summary["tasks"]
    if settings.output != "table":
        document["task_states"] = summary["task_states"]
        click.echo(render.structured(document, settings.output))
    if not succeeded:
        raise click.exceptions.Exit(int(ExitCode.JOB_FAILED))
