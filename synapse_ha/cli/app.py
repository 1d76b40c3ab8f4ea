"""synctl's application layer: its errors and exit codes, its settings and credential
discovery, output options and shell completion, shared by every command module."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import grpc

from synapse_ha.cli import render, terminal
from synapse_ha.cli.defaults import (
    DEFAULT_TIMEOUT_S,
    PER_TRY_TIMEOUT_S,
    TLS_HINT,
    ExitCode,
)
from synapse_ha.client import credentials
from synapse_ha.client import jobs as client_jobs
from synapse_ha.client import nodes as client_nodes
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.client.credentials import (
    CLUSTER_ENV,
    CredentialsError,
    parse_cluster,
)
from synapse_ha.client.logs import WorkerUnreachable
from synapse_ha.client.specfile import SpecFileError, SpecFileUnreadable
from synapse_ha.core.model import FINISHED_JOB_STATES, JobState
from synapse_ha.rpc.errors import Reason, RpcFailure, failure_of
from synapse_ha.security.tls import TlsFiles, Transport

ACTIVE_STATES = (JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING)
# The names `synctl jobs --state` accepts.
ALL_STATES = tuple(str(s) for s in (*ACTIVE_STATES, *sorted(FINISHED_JOB_STATES)))
# After a followed job ends, how long its members' log streams may take to deliver the
# rest of their output.
FOLLOW_DRAIN_S = 5.0

# Commands that never call the cluster: they read no token or TLS settings.
LOCAL_COMMANDS = frozenset({"ca", "dev", "slurm-commands"})

F = TypeVar("F", bound=Callable[..., Any])


# -------------------------------------------------------------------------- errors


class CommandFailed(Exception):
    """Ends a command with one line on stderr and ``code``; ``reason`` is the error's code
    in structured output."""

    def __init__(self, code: ExitCode, message: str, reason: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


def _one_line(text: str, width: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def unreachable_message(
    exc: ClusterUnavailable, addresses: Sequence[str], timeout: float, plaintext: bool = False
) -> str:
    """Every configured address with why it could not be reached, or else the last
    answer it gave (or that it was not tried), and what to do about it; with
    ``plaintext`` (synctl had no TLS files) and no cause known, the hint that the cluster
    may need them."""
    last: dict[str, str] = {}
    for address, why in exc.attempts:
        last[address] = _one_line(why, 160)
    last |= {address: str(cause) for address, cause in exc.causes.items()}
    tried = [
        f"{a} ({last[a]})" if a in last else f"{a} (not tried)"
        for a in dict.fromkeys([*addresses, *last])
    ]
    within = "" if exc.fast else f" within {timeout:g}s"
    message = f"cannot reach the cluster{within}; tried {'; '.join(tried)}."
    if exc.hint:
        return f"{message} {exc.hint} Set --cluster or {CLUSTER_ENV} for another cluster."
    message += f" Is it running? Set --cluster or {CLUSTER_ENV}."
    return f"{message} Or {TLS_HINT}." if plaintext else message


_EXIT_FOR_REASON = {
    Reason.INVALID_FIELD: ExitCode.USAGE,
    Reason.JOB_NOT_FOUND: ExitCode.NOT_FOUND,
    Reason.NODE_NOT_FOUND: ExitCode.NOT_FOUND,
    Reason.NO_LEADER: ExitCode.UNREACHABLE,
    Reason.LEADER_NOT_READY: ExitCode.UNREACHABLE,
    Reason.NOT_COMMITTED: ExitCode.UNREACHABLE,
    Reason.OUTCOME_UNKNOWN: ExitCode.UNREACHABLE,
    Reason.UNAUTHENTICATED: ExitCode.DENIED,
    Reason.PERMISSION_DENIED: ExitCode.DENIED,
    Reason.TOKEN_NOT_FOUND: ExitCode.NOT_FOUND,
    Reason.QUEUE_NOT_FOUND: ExitCode.NOT_FOUND,
    Reason.COHORT_NOT_FOUND: ExitCode.NOT_FOUND,
    Reason.LIMIT_EXCEEDED: ExitCode.DENIED,
}


def exit_code_for(failure: RpcFailure) -> ExitCode:
    """By the error's reason; by its status code when it carried none."""
    if failure.reason in _EXIT_FOR_REASON:
        return _EXIT_FOR_REASON[failure.reason]
    if failure.reason is not Reason.UNKNOWN:
        return ExitCode.JOB_FAILED
    return _exit_code_for(failure.code)


def _exit_code_for(code: grpc.StatusCode | None) -> ExitCode:
    if code is grpc.StatusCode.NOT_FOUND:
        return ExitCode.NOT_FOUND
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return ExitCode.DENIED
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return ExitCode.USAGE
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ExitCode.UNREACHABLE
    return ExitCode.JOB_FAILED


class SynctlGroup(click.Group):
    """Turns the errors of every command into one stderr line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CommandFailed as exc:
            _fail(ctx, exc.code, render.error_document(exc.reason, str(exc)))
        except SpecFileUnreadable as exc:
            _fail(ctx, ExitCode.USAGE, render.error_document("USAGE", str(exc), file=exc.path))
        except SpecFileError as exc:
            _fail(ctx, ExitCode.USAGE, spec_file_error_document(exc), multiline=True)
        except ClusterUnavailable as exc:
            settings = _settings_of(ctx)
            addresses = settings.addresses if settings else []
            timeout = settings.timeout if settings else DEFAULT_TIMEOUT_S
            message = unreachable_message(exc, addresses, timeout, _plaintext(settings))
            _fail(ctx, ExitCode.UNREACHABLE, render.error_document("UNREACHABLE", message))
        except WorkerUnreachable as exc:
            message = str(exc)
            if _plaintext(_settings_of(ctx)):
                message += f"; {TLS_HINT}"
            _fail(ctx, ExitCode.UNREACHABLE, render.error_document("UNREACHABLE", message))
        except grpc.RpcError as exc:
            failure = failure_of(exc)
            code = failure.reason if failure.reason is not Reason.UNKNOWN else failure.code.name
            message = f"{_one_line(failure.message)} ({code})"
            if failure.code is grpc.StatusCode.UNAVAILABLE and _plaintext(_settings_of(ctx)):
                message += f"; {TLS_HINT}"
            fields: dict[str, object] = dict(sorted(failure.metadata.items()))
            if failure.violations:
                fields["violations"] = [
                    {"field": v.field, "rule": v.rule, "violation": str(v.code)}
                    for v in failure.violations
                ]
            fields["status"] = failure.code.name
            document = render.error_document(str(code), message, **fields)
            _fail(ctx, exit_code_for(failure), document)
        except KeyboardInterrupt:
            _fail(ctx, ExitCode.INTERRUPTED, render.error_document("INTERRUPTED", "interrupted"))


def _settings_of(ctx: click.Context) -> Settings | None:
    return ctx.obj if isinstance(ctx.obj, Settings) else None


def _plaintext(settings: Settings | None) -> bool:
    """Whether synctl spoke (or would speak) plaintext to the cluster."""
    return settings is not None and settings.tls is None


def spec_file_error_document(exc: SpecFileError) -> render.Document:
    """Every problem of a job spec file: the message a line for each (``FILE:LINE:
    FIELD: RULE``, in line order), the first one's fields, and ``problems`` for all."""
    lines = [line.replace("\n", "\\n") for line in exc.lines()]  # a line per problem
    message = (
        f"invalid job spec: {lines[0]}"
        if len(lines) == 1
        else "\n  ".join([f"invalid job spec, {len(lines)} problems:", *lines])
    )
    return render.error_document(
        str(Reason.INVALID_FIELD),
        message,
        field=exc.field,
        rule=exc.rule,
        violation=str(exc.code),
        file=exc.path,
        line=exc.line,
        problems=[
            {"line": p.line, "field": p.field, "rule": p.rule, "violation": str(p.code)}
            for p in exc.problems
        ],
    )


def _fail(
    ctx: click.Context, code: ExitCode, document: render.Document, *, multiline: bool = False
) -> NoReturn:
    """``error: <message>`` on stderr (one line, unless ``multiline`` keeps the
    message's lines); with ``-o json``/``-o yaml`` the error document instead (also on
    stderr: stdout carries only answers)."""
    settings = _settings_of(ctx)
    output = settings.output if settings else "table"
    if output == "table":
        keep = terminal.MULTILINE if multiline else ""
        message = terminal.terminal_safe(document["error"]["message"], keep)
        click.echo(f"error: {message}", err=True)
    else:
        click.echo(render.structured(document, output).rstrip("\n"), err=True)
    raise click.exceptions.Exit(int(code))


def note(message: str) -> None:
    """Progress for people; stderr, so that stdout stays the command's answer. Escaped
    for the terminal: notes quote reasons and workers' answers."""
    click.echo(terminal.terminal_safe(message, keep=terminal.MULTILINE), err=True)


# ------------------------------------------------------------------------ settings


@dataclass
class Settings:
    addresses: list[str]
    output: str
    timeout: float
    token: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None  # None: plaintext
    _client: ClusterClient | None = field(default=None, repr=False)

    @property
    def transport(self) -> Transport:
        """How synctl reaches replicas and workers: mutual TLS with :attr:`tls`."""
        return Transport(self.tls)

    def client(self) -> ClusterClient:
        if self._client is None:
            self._client = ClusterClient(
                self.addresses,
                timeout_s=self.timeout,
                per_try_timeout_s=min(PER_TRY_TIMEOUT_S, self.timeout),
                token=self.token,
                channel_factory=self.transport.channel,
                fail_fast=True,
                secure=self.tls is not None,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def find_tls(
    ca: Path | None, cert: Path | None, key: Path | None, environ: Mapping[str, str] | None = None
) -> TlsFiles | None:
    """:func:`synapse_ha.client.credentials.find_tls`, its errors as usage errors."""
    try:
        return credentials.find_tls(ca, cert, key, environ)
    except CredentialsError as exc:
        raise CommandFailed(ExitCode.USAGE, str(exc), "USAGE") from exc


def find_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """:func:`synapse_ha.client.credentials.find_token`, its errors as usage errors."""
    try:
        return credentials.find_token(token_file, environ)
    except CredentialsError as exc:
        raise CommandFailed(ExitCode.USAGE, str(exc), "USAGE") from exc


def discover(
    cluster: list[str] | None,
    *,
    token_file: Path | None,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
) -> credentials.Found:
    """:func:`synapse_ha.client.credentials.discover`, its errors as usage errors."""
    try:
        return credentials.discover(cluster, token_file=token_file, ca=ca, cert=cert, key=key)
    except CredentialsError as exc:
        raise CommandFailed(ExitCode.USAGE, str(exc), "USAGE") from exc


def cluster_callback(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> list[str] | None:
    if value is None:
        return None  # not given: discover() finds it
    try:
        return parse_cluster(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc


def output_option(func: F) -> F:
    """``-o`` on a command as well, so that ``synctl jobs -o json`` works like
    ``synctl -o json jobs``."""
    return click.option(
        "-o",
        "--output",
        "command_output",
        type=click.Choice(render.OUTPUT_FORMATS),
        default=None,
        help="Output format (overrides the global -o).",
    )(func)


def limit_option(flag: str, help: str) -> Callable[[F], F]:
    """An option whose value is a whole number of 0 or more, None when not given (for a
    limit: "none", or the default its help names)."""
    return click.option(flag, type=click.IntRange(min=0), default=None, help=help)


def with_settings(func: Callable[..., Any]) -> Callable[..., Any]:
    """Pass the global settings, with a command's own ``-o`` applied, as ``settings``."""

    @click.pass_obj
    @functools.wraps(func)
    def wrapper(settings: Settings, *args: Any, **kwargs: Any) -> Any:
        command_output = kwargs.pop("command_output", None)
        if command_output:
            settings.output = command_output
        return func(settings, *args, **kwargs)

    return wrapper


def emit(settings: Settings, document: object, table: Callable[[], str]) -> None:
    """The answer on stdout: ``table`` (escaped for the terminal once more as a whole,
    whatever its renderer did) or the document as JSON or YAML."""
    if settings.output == "table":
        click.echo(terminal.terminal_safe(table(), keep=terminal.MULTILINE))
    else:
        click.echo(render.structured(document, settings.output))


def emit_put(settings: Settings, kind: str, name: str, created: bool) -> None:
    """The answer of a write that creates or replaces the ``kind`` named ``name``."""
    document = {"name": name, "created": created}
    emit(settings, document, lambda: f"{kind} {name}: {'created' if created else 'updated'}")


def delete_command(
    group: click.Group,
) -> Callable[[Callable[[ClusterClient, str], None]], click.Command]:
    """``<group> delete NAME``: the decorated ``delete(client, name)`` (whose docstring is
    the command's help) deletes the record of the group's kind named NAME."""

    def command(delete: Callable[[ClusterClient, str], None]) -> click.Command:
        @group.command("delete", help=delete.__doc__)
        @click.argument("name")
        @output_option
        @with_settings
        def delete_named(settings: Settings, name: str) -> None:
            delete(settings.client(), name)
            document = {"name": name, "deleted": True}
            emit(settings, document, lambda: f"{group.name} {name}: deleted")

        return delete_named

    return command


def now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------- completion


def _completion_client(ctx: click.Context) -> ClusterClient | None:
    root = ctx.find_root()
    value = root.params.get("cluster")
    try:
        found = credentials.discover(
            value if isinstance(value, list) else None,
            token_file=root.params.get("token_file"),
            ca=root.params.get("ca"),
            cert=root.params.get("cert"),
            key=root.params.get("key"),
        )
    except (CredentialsError, ValueError):
        return None
    return ClusterClient(
        found.addresses,
        timeout_s=1.0,
        per_try_timeout_s=0.5,
        token=found.token,
        channel_factory=Transport(found.tls).channel,
        fail_fast=True,
    )


def _complete(
    ctx: click.Context, fetch: Callable[[ClusterClient], list[tuple[str, str]]], incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Completion items ``(value, help)`` from the cluster; none when it cannot answer."""
    client = _completion_client(ctx)
    if client is None:
        return []
    try:
        with client:
            items = fetch(client)
    except (ClusterUnavailable, grpc.RpcError):
        return []
    return [
        click.shell_completion.CompletionItem(value, help=text)
        for value, text in items
        if value.startswith(incomplete)
    ]


def complete_job_ids(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    return _complete(
        ctx,
        lambda c: [(j.job_id, f"{j.spec.name} {j.state}") for j in client_jobs.list_jobs(c)],
        incomplete,
    )


def complete_node_ids(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    return _complete(
        ctx,
        lambda c: [(n.node_id, n.status) for n in client_nodes.list_nodes(c)],
        incomplete,
    )
