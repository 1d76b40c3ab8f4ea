"""``synctl submit | logs | status | jobs | explain | cancel``: a user's jobs."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import grpc

from synapse_ha.cli import render, render_arrays, render_jobs
from synapse_ha.cli.app import (
    ACTIVE_STATES,
    ALL_STATES,
    FOLLOW_DRAIN_S,
    CommandFailed,
    Settings,
    complete_job_ids,
    emit,
    note,
    now_ms,
    output_option,
    with_settings,
)
from synapse_ha.cli.arrays import is_array_answer, wait_for_array, with_array
from synapse_ha.cli.defaults import POLL_INTERVAL_S, ExitCode
from synapse_ha.cli.logs import LinePrinter
from synapse_ha.client import jobs as client_jobs
from synapse_ha.client import nodes as client_nodes
from synapse_ha.client.cluster import new_request_id
from synapse_ha.client.jobs import ArrayView, JobView
from synapse_ha.client.logs import (
    GrantCache,
    MemberFollower,
    MemberLog,
    WorkerUnreachable,
    fetch_grant,
    read_log,
    stop_followers,
)
from synapse_ha.client.specfile import cluster_refusal, load_job_file
from synapse_ha.core.model import JobState
from synapse_ha.core.spec.document import ParsedJob
from synapse_ha.core.workflows.arrays import task_id
from synapse_ha.core.workflows.dependencies import Dependencies, dependency_problems, merged
from synapse_ha.rpc import states
from synapse_ha.rpc.errors import Reason, failure_of

# -------------------------------------------------------------------------- submit


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Wait for the job to end; exit 1 unless it succeeded.")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Stream every member's output ([rank N] prefix) until the job ends; implies --wait.",
)
@click.option(
    "--after-ok",
    "after_ok",
    multiple=True,
    metavar="JOB[,JOB]",
    help="Start only once these jobs succeeded (spec: dependencies.afterok).",
)
@click.option(
    "--after-any",
    "after_any",
    multiple=True,
    metavar="JOB[,JOB]",
    help="Start only once these jobs finished, however they ended.",
)
@click.option(
    "--after-not-ok",
    "after_not_ok",
    multiple=True,
    metavar="JOB[,JOB]",
    help="Start only once these jobs failed or were cancelled.",
)
@click.option(
    "--after",
    "after",
    multiple=True,
    metavar="JOB[,JOB]",
    help="Start only once these jobs started.",
)
@click.option(
    "--array",
    "array",
    default=None,
    metavar="INDICES[%N]",
    help="Submit an array: a task per index (0-99, 1,3,5, 0-98:2), at most N at once "
    "(spec: array).",
)
@output_option
@with_settings
def submit(
    settings: Settings,
    file: Path,
    wait: bool,
    follow: bool,
    after_ok: tuple[str, ...],
    after_any: tuple[str, ...],
    after_not_ok: tuple[str, ...],
    after: tuple[str, ...],
    array: str | None,
) -> None:
    """Validate the job spec FILE (YAML, see docs/cli.md) and submit it; print the job id.

    The spec is checked before anything is sent: an invalid one exits 2 naming the file
    line, the field and the rule. The submission carries the spec's request_id (a fresh
    one when it has none), reused on every retry, so a retry never creates a second job;
    submitting a file with the same request_id again returns the same job.

    \b
    The --after* options add to the spec's dependencies: the job waits (reason
    DEPENDENCY) until each is met, and is cancelled when one can never be.

    \b
    --array (or the spec's array:) submits an array: a job per task,
    ARRAY_<index>, each with $SYNAPSE_ARRAY_TASK_ID; the id printed is the
    array's. --wait then waits for every task.

    \b
    Examples:
      synctl submit examples/cpu-gang.yaml
      synctl submit job.yaml --wait && echo done
      synctl submit job.yaml --follow
      synctl submit train.yaml --after-ok job-000012
      synctl submit sweep.yaml --array 0-49%8
    """
    # The topology level names are the cluster's configuration: the cluster checks them.
    parsed = load_job_file(file, topology_levels=None)
    extra = Dependencies(
        _job_ids(after_ok), _job_ids(after_any), _job_ids(after_not_ok), _job_ids(after)
    )
    if extra.pairs():
        parsed = _with_dependencies(parsed, extra)
    if array is not None or parsed.spec.array:
        parsed = with_array(parsed, parsed.spec.array if array is None else array, follow)
    request_id = parsed.request_id or new_request_id()
    client = settings.client()
    try:
        job_id, created = client_jobs.submit_job(client, parsed.spec, request_id)
    except grpc.RpcError as exc:
        failure = failure_of(exc)
        if failure.reason is not Reason.INVALID_FIELD or not failure.field:
            raise
        raise cluster_refusal(file, failure.violations, failure.field, failure.rule) from exc
    if not created:
        note(f"job {job_id} already submitted (request_id {request_id}); not submitted again")
    document: dict[str, Any] = {"id": job_id, "request_id": request_id, "created": created}
    if not (wait or follow):
        emit(settings, document, lambda: job_id)
        return
    if settings.output == "table":
        click.echo(job_id)
    if parsed.spec.array:
        wait_for_array(settings, job_id, document)
        return
    job = follow_job(settings, job_id, None) if follow else wait_for_job(settings, job_id)
    state = job.job_state
    note(f"job {job_id} {state}" + (f": {job.reason}" if job.reason else ""))
    if settings.output != "table":
        document["state"] = str(state)
        click.echo(render.structured(document, settings.output))
    if state is not JobState.SUCCEEDED:
        raise click.exceptions.Exit(int(ExitCode.JOB_FAILED))


def _job_ids(given: tuple[str, ...]) -> tuple[str, ...]:
    """``--after-ok a,b --after-ok c`` as ``(a, b, c)``."""
    return tuple(i.strip() for text in given for i in text.split(",") if i.strip())


def _with_dependencies(parsed: ParsedJob, extra: Dependencies) -> ParsedJob:
    """The spec with the --after* options' dependencies added; a malformed one is a
    usage error naming the option."""
    spec = dataclasses.replace(parsed.spec, dependencies=merged(parsed.spec.dependencies, extra))
    for field, rule in dependency_problems(spec.dependencies):
        kind = field.rpartition(".")[2]
        option = _OPTIONS.get(kind, "--after-ok")
        raise CommandFailed(ExitCode.USAGE, f"{option}: {rule}", str(Reason.INVALID_FIELD))
    return dataclasses.replace(parsed, spec=spec)


_OPTIONS = {
    "afterok": "--after-ok",
    "afterany": "--after-any",
    "afternotok": "--after-not-ok",
    "after": "--after",
}


def _describe_progress(job: JobView) -> str:
    state = job.job_state
    text = f"job {job.job_id}: {state}"
    if job.attempt and state.holds_resources:
        text += f" (attempt {job.attempt.number})"
    elif job.reason and state is JobState.PENDING:
        text += f" ({job.reason})"
    return text


def _polled(settings: Settings, job_id: str) -> Iterator[JobView]:
    """The job at every poll, the last one in a final state, noting each change of its
    progress on stderr."""
    client = settings.client()
    last = ""
    while True:
        job = client_jobs.get_job(client, job_id)
        progress = _describe_progress(job)
        finished = job.job_state.finished
        if progress != last and not finished:
            note(progress)
            last = progress
        yield job
        if finished:
            return
        time.sleep(POLL_INTERVAL_S)


def wait_for_job(settings: Settings, job_id: str) -> JobView:
    """Poll until the job reaches a final state, noting each change on stderr."""
    return deque(_polled(settings, job_id), maxlen=1).pop()  # the last poll's


# ---------------------------------------------------------------------------- logs


def node_addresses(settings: Settings) -> dict[str, str]:
    return {n.node_id: n.address for n in client_nodes.list_nodes(settings.client())}


def grant_cache(settings: Settings) -> GrantCache:
    return GrantCache(functools.partial(fetch_grant, settings.client()))


def member_logs(job: JobView, addresses: dict[str, str], member: int | None) -> list[MemberLog]:
    attempt = job.attempt
    members = list(attempt.members) if attempt else []
    number = attempt.number if attempt else 0
    if member is not None:
        members = [m for m in members if m.rank == member]
        if not members:
            raise CommandFailed(
                ExitCode.NOT_FOUND,
                f"job {job.job_id} has no member {member} (ranks 0..{job.spec.replicas - 1})",
                "MEMBER_NOT_FOUND",
            )
    out = []
    for m in members:
        address = addresses.get(m.node_id)
        if not address:
            note(f"[rank {m.rank}] node {m.node_id} is no longer registered; no log")
            continue
        out.append(MemberLog(job.job_id, number, m.rank, m.node_id, address))
    return out


def _stop_followers(followers: list[MemberFollower], drain_s: float) -> None:
    for follower in stop_followers(followers, drain_s):
        note(f"[rank {follower.member.rank}] log may be incomplete: {follower.last_error}")


def follow_job(settings: Settings, job_id: str, member: int | None, raw: bool = False) -> JobView:
    """Stream the members' output until the job ends; a retry's new attempt is followed
    from its start. Returns the final job. Output is escaped for the terminal unless
    ``raw``."""
    printer = LinePrinter(click.echo, prefixed=member is None, raw=raw)
    grants = grant_cache(settings)
    followers: list[MemberFollower] = []
    followed = 0
    try:
        for job in _polled(settings, job_id):
            attempt = job.attempt.number if job.attempt else 0
            if attempt and attempt != followed:
                if followers:
                    _stop_followers(followers, FOLLOW_DRAIN_S)
                    note(f"job {job_id}: following attempt {attempt}")
                addresses = node_addresses(settings)
                for log in member_logs(job, addresses, member):
                    grants.get(log)  # here, so that a refusal ends the command
                    follower = MemberFollower(log, printer, settings.transport, grants)
                    follower.start()
                    followers.append(follower)
                followed = attempt
        _stop_followers(followers, FOLLOW_DRAIN_S)
        return job
    finally:
        for follower in followers:
            follower.stop()


@click.command()
@click.argument("job_id", metavar="JOB", shell_complete=complete_job_ids)
@click.option("--member", type=click.IntRange(min=0), help="Only this rank's output.")
@click.option(
    "--task", type=click.IntRange(min=0), help="JOB is an array: this task's output (JOB_TASK)."
)
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new output until the job ends.")
@click.option(
    "--raw",
    is_flag=True,
    help="Write the output's bytes as the members wrote them, control characters included "
    "(for a file or a pipe; a terminal obeys them).",
)
@with_settings
def logs(
    settings: Settings,
    job_id: str,
    member: int | None,
    task: int | None,
    follow: bool,
    raw: bool,
) -> None:
    """Print the output of a job's members (of its current or last attempt).

    Each line is prefixed with [rank N] unless --member picks one rank. Logs are read
    straight from the workers that run the members, with a short-lived grant from the
    leader (only the job's owner, operators and admins get one).

    The output is the job's own: control characters in it (escape sequences, carriage
    returns, backspaces) are shown escaped, as \\x1b, \\r, \\b, so that it cannot
    act on your terminal. --raw writes it as it is.

    \b
    Examples:
      synctl logs 42
      synctl logs 42 --member 0 -f
      synctl logs 42 --member 0 --raw > rank0.log
      synctl logs job-000012 --task 7
    """
    if task is not None:
        job_id = task_id(job_id, task)
    if follow:
        job = follow_job(settings, job_id, member, raw)
        note(f"job {job_id} {job.job_state}")
        return
    job = client_jobs.get_job(settings.client(), job_id)
    if job.attempt is None:
        raise CommandFailed(
            ExitCode.JOB_FAILED,
            f"job {job_id} is {job.job_state} and has never started, so it has no output"
            + (f" ({job.reason})" if job.reason else ""),
            "NOT_STARTED",
        )
    printer = LinePrinter(click.echo, prefixed=member is None, raw=raw)
    grants = grant_cache(settings)
    unreachable: list[str] = []
    for log in member_logs(job, node_addresses(settings), member):
        grant = grants.get(log)
        try:
            for data in read_log(log, settings.timeout, settings.transport, grant):
                printer.feed(log.rank, data)
        except LookupError:
            note(f"[rank {log.rank}] no output yet (not started on {log.node_id})")
        except WorkerUnreachable as exc:
            note(f"[rank {log.rank}] {exc}")
            unreachable.append(log.node_id)
        finally:
            printer.flush(log.rank)
    if unreachable:
        raise CommandFailed(
            ExitCode.UNREACHABLE,
            f"could not read logs from {', '.join(unreachable)}",
            "UNREACHABLE",
        )


# ---------------------------------------------------------------------------- jobs


@click.command()
@click.argument("job_id", metavar="JOB", shell_complete=complete_job_ids)
@output_option
@with_settings
def status(settings: Settings, job_id: str) -> None:
    """Show one job: state, reason, attempt and fencing token, and where each member runs.

    For an array: what it was submitted as and its tasks counted by state.

    \b
    Example:
      synctl status 42 -o json
    """
    client = settings.client()
    try:
        document = render_jobs.job_document(client_jobs.get_job(client, job_id), now_ms())
    except grpc.RpcError as exc:
        if not is_array_answer(exc):
            raise
        document = render_arrays.array_document(client_jobs.get_array(client, job_id))
        emit(settings, document, lambda: render_arrays.array_table(document, now_ms()))
        return
    emit(settings, document, lambda: render_jobs.job_table(document, now_ms()))


@click.command()
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(ALL_STATES, case_sensitive=False),
    help="Only jobs in this state (repeatable). Default: PENDING, SCHEDULED and RUNNING.",
)
@click.option("-a", "--all", "show_all", is_flag=True, help="Finished jobs too.")
@click.option("--name", default="", help="Only jobs with this exact name.")
@click.option("--node", default="", help="Only jobs with a member on this node.")
@click.option("--expand", is_flag=True, help="Each task of an array on its own line.")
@click.option("--array", "array_id", default="", help="Only the tasks of this array.")
@output_option
@with_settings
def jobs(
    settings: Settings,
    states: tuple[str, ...],
    show_all: bool,
    name: str,
    node: str,
    expand: bool,
    array_id: str,
) -> None:
    """List jobs in submission order: active ones, or --all, or those in --state.

    An array is one line, its tasks counted by state (one with a task in the
    states listed is shown); --expand lists the tasks instead.

    \b
    Examples:
      synctl jobs
      synctl jobs --all -o json
      synctl jobs --state pending --state failed
      synctl jobs --array job-000012 --all
    """
    wanted = [s.upper() for s in states] or ([] if show_all else [str(s) for s in ACTIVE_STATES])
    found = client_jobs.list_lines(
        settings.client(),
        states=wanted,
        name=name,
        node_id=node,
        array_id=array_id,
        collapse_arrays=not (expand or array_id),
    )
    now = now_ms()
    documents = [render_jobs.job_document(j, now) for j in found if isinstance(j, JobView)]
    arrays = [render_arrays.array_document(a) for a in found if isinstance(a, ArrayView)]
    lines = [
        render_jobs.job_document(j, now)
        if isinstance(j, JobView)
        else render_arrays.array_document(j)
        for j in found
    ]
    emit(
        settings,
        {"jobs": documents, "arrays": arrays},
        lambda: render_arrays.lines_table(lines, now),
    )


@click.command()
@click.argument("job_id", metavar="JOB", shell_complete=complete_job_ids)
@output_option
@with_settings
def explain(settings: Settings, job_id: str) -> None:
    """Say why a job is pending, or where each member runs (node, GPUs, rack).

    \b
    Example:
      synctl explain 42
    """
    client = settings.client()
    answer = client_jobs.explain_job(client, job_id)
    job = client_jobs.get_job(client, job_id)
    nodes = client_nodes.list_nodes(client) if job.attempt else []
    document = render_jobs.explain_document(answer, job, nodes)
    emit(settings, document, lambda: render_jobs.explain_table(document, now_ms()))


@click.command()
@click.argument("job_id", metavar="JOB", shell_complete=complete_job_ids)
@click.option("--reason", default="", help="Recorded with the cancellation.")
@click.option(
    "--requeue",
    is_flag=True,
    help="Stop its running attempt and queue it again in its place instead (scontrol requeue).",
)
@output_option
@with_settings
def cancel(settings: Settings, job_id: str, reason: str, requeue: bool) -> None:
    """Cancel a job: a pending one never starts, a running one's members are stopped.
    With --requeue, a running job's members are stopped and it waits again in its place
    for a new attempt (a job that holds no nodes is refused, exit 1).

    \b
    Examples:
      synctl cancel 42 --reason "wrong dataset"
      synctl cancel 42 --requeue --reason "resume from the checkpoint"
    """
    client = settings.client()
    if requeue:
        answer = client.requeue_job(job_id, reason)
        document = {"id": job_id, "state": str(states.job_state(answer)), "message": answer.message}
        emit(settings, document, lambda: f"job {job_id}: {document['message']}")
        return
    try:
        cancelled, message = client_jobs.cancel_job(client, job_id, reason)
        document = {"id": job_id, "state": str(cancelled), "message": message}
    except grpc.RpcError as exc:
        if failure_of(exc).reason is not Reason.CONFLICT:
            raise
        # Already finished. A retried cancel whose first try went through lands here too.
        job = client_jobs.get_job(client, job_id)
        state = job.job_state
        if state is not JobState.CANCELLED:
            raise CommandFailed(
                ExitCode.JOB_FAILED,
                f"job {job_id} already finished as {state}",
                str(Reason.CONFLICT),
            ) from exc
        document = {"id": job_id, "state": str(state), "message": job.reason}
    emit(settings, document, lambda: f"job {job_id}: {document['state']}")


# The commands this module adds to synctl.
COMMANDS: list[click.Command] = [submit, logs, status, jobs, explain, cancel]
