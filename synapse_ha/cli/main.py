"""``synctl``: the command-line client of a synapse cluster.

Every command is a thin adapter: it turns its arguments into one or a few gRPC calls
through :class:`ClusterClient` (which finds the leader by itself) and hands the answer to
:mod:`synapse_ha.cli.render`. Errors are one line on stderr and an exit code from
:class:`ExitCode`: 0 ok, 1 job failed (``--wait``) or another error, 2 usage or invalid
spec, 3 cluster (or worker) unreachable within ``--timeout``, 4 no such job or node, 5
refused (no credential, a bad one, or not allowed). With
``-o json`` or ``-o yaml`` the error is a document instead, ``{"error": {"code": ...,
"message": ...}}``, whose code is the cluster's reason (docs/errors.md) or one of synctl's
own (``UNREACHABLE``, ``INTERRUPTED``, ...). The exit code is the same either way.

Credentials (DESIGN §8). synctl presents a client certificate (``--ca``/``--cert``/
``--key``, see :func:`find_tls`) over mutual TLS and sends a bearer token (see
:func:`find_token`); the token says who the caller is, or, without one, a user
certificate does. Without TLS files it speaks plaintext, which only an ``--insecure``
cluster accepts.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import grpc

from synapse_ha.cli import render
from synapse_ha.cli.ca import ca
from synapse_ha.cli.defaults import (
    CA_ENV,
    CA_FILE_NAME,
    CERT_ENV,
    CERT_FILE_NAME,
    CLUSTER_ENV,
    DEFAULT_CLUSTER,
    DEFAULT_TIMEOUT_S,
    KEY_ENV,
    KEY_FILE_NAME,
    PER_TRY_TIMEOUT_S,
    POLL_INTERVAL_S,
    TLS_HINT,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    TOKEN_FILE_NAME,
    ExitCode,
)
from synapse_ha.cli.history import HISTORY_COMMANDS
from synapse_ha.cli.logs import (
    GrantCache,
    LinePrinter,
    LogGrant,
    MemberFollower,
    MemberLog,
    WorkerUnreachable,
    read_log,
)
from synapse_ha.cli.specfile import SpecFileError, line_in_file, load_job_file
from synapse_ha.core.spec import SpecError, parse_duration
from synapse_ha.rpc.client import ClusterClient, ClusterUnavailable, new_request_id
from synapse_ha.rpc.convert import spec_to_proto
from synapse_ha.rpc.errors import Reason, RpcFailure, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.tls import TlsError, TlsFiles, Transport

FINISHED_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
ACTIVE_STATES = ("PENDING", "SCHEDULED", "RUNNING")
ALL_STATES = (*ACTIVE_STATES, *sorted(FINISHED_STATES))
# After a followed job ends, how long its members' log streams may take to deliver the
# rest of their output.
FOLLOW_DRAIN_S = 5.0

# Commands that never call the cluster: they read no token or TLS settings.
LOCAL_COMMANDS = frozenset({"ca", "dev"})

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
    """Every configured address with the last answer it gave (or that it was not tried);
    with ``plaintext`` (synctl had no TLS files), the hint that the cluster may need
    them."""
    last: dict[str, str] = {}
    for address, why in exc.attempts:
        last[address] = why
    tried = [
        f"{a} ({_one_line(last[a], 160)})" if a in last else f"{a} (not tried)"
        for a in dict.fromkeys([*addresses, *last])
    ]
    message = (
        f"cannot reach the cluster within {timeout:g}s; tried {'; '.join(tried)}. "
        f"Is it running? Set --cluster or {CLUSTER_ENV}."
    )
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
        except SpecFileError as exc:
            document = render.error_document(
                str(Reason.INVALID_FIELD),
                f"invalid job spec: {exc}",
                field=exc.field,
                rule=exc.rule,
                violation=str(exc.code),
                file=exc.path,
                line=exc.line,
            )
            _fail(ctx, ExitCode.USAGE, document)
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


def _fail(ctx: click.Context, code: ExitCode, document: render.Document) -> NoReturn:
    """One line on stderr, ``error: <message>``; with ``-o json``/``-o yaml`` the error
    document instead (also on stderr: stdout carries only answers)."""
    settings = _settings_of(ctx)
    output = settings.output if settings else "table"
    if output == "table":
        click.echo(f"error: {render.terminal_safe(document['error']['message'])}", err=True)
    else:
        click.echo(render.structured(document, output).rstrip("\n"), err=True)
    raise click.exceptions.Exit(int(code))


def note(message: str) -> None:
    """Progress for people; stderr, so that stdout stays the command's answer. Escaped
    for the terminal: notes quote reasons and workers' answers."""
    click.echo(render.terminal_safe(message, keep=render.MULTILINE), err=True)


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
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/synapse``, or ``~/.config/synapse``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "synapse"


def default_token_file(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/synapse/token``, or ``~/.config/synapse/token``."""
    return config_dir(environ) / TOKEN_FILE_NAME


def find_tls(
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    environ: Mapping[str, str] | None = None,
) -> TlsFiles | None:
    """The TLS files synctl presents: each one as given (``--ca``/``--cert``/``--key``,
    which click also fills from ``$SYNAPSE_CA``/``$SYNAPSE_CERT``/``$SYNAPSE_KEY``), else
    ``ca.pem``/``cert.pem``/``key.pem`` in the config directory when that file exists.
    None when none of the three is found (plaintext). Raises :class:`CommandFailed`
    (usage) when only some are found, naming the missing ones, or when the files cannot
    be read or the key is not the certificate's."""
    folder = config_dir(environ)
    found: dict[str, Path | None] = {}
    for (flag, env, name), given in zip(
        (
            ("--ca", CA_ENV, CA_FILE_NAME),
            ("--cert", CERT_ENV, CERT_FILE_NAME),
            ("--key", KEY_ENV, KEY_FILE_NAME),
        ),
        (ca, cert, key),
        strict=True,
    ):
        default = folder / name
        found[f"{flag} (${env})"] = given or (default if default.is_file() else None)
    missing = [what for what, path in found.items() if path is None]
    if len(missing) == len(found):
        return None
    if missing:
        raise CommandFailed(
            ExitCode.USAGE,
            f"incomplete TLS settings: {', '.join(missing)} not given; mutual TLS needs the "
            f"cluster CA, a client certificate and its key (or none of them, for an "
            f"--insecure cluster). Defaults: {CA_FILE_NAME}, {CERT_FILE_NAME}, "
            f"{KEY_FILE_NAME} in {folder}",
            "USAGE",
        )
    ca_file, cert_file, key_file = found.values()
    assert ca_file is not None and cert_file is not None and key_file is not None
    files = TlsFiles(ca=ca_file, cert=cert_file, key=key_file)
    try:
        Transport(files).material()
    except TlsError as exc:
        raise CommandFailed(ExitCode.USAGE, str(exc), "USAGE") from exc
    return files


def find_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token synctl sends: from ``token_file`` (given: it must be readable),
    else ``$SYNAPSE_TOKEN``, else the default token file when it exists; None without
    one. Raises :class:`CommandFailed` for a given file that cannot be read."""
    env = os.environ if environ is None else environ
    if token_file is None:
        text = env.get(TOKEN_ENV, "").strip()
        if text:
            return text
        token_file = default_token_file(env)
        if not token_file.is_file():
            return None
    try:
        text = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CommandFailed(
            ExitCode.USAGE, f"cannot read the token file {token_file}: {exc.strerror}", "USAGE"
        ) from exc
    return text or None


def parse_cluster(value: str) -> list[str]:
    """``host:port,host:port,...`` into a list; raises :class:`ValueError` naming the
    address that is not ``host:port``."""
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    if not addresses:
        raise ValueError("no address given (expected host:port,host:port,...)")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{address!r} is not host:port")
    return addresses


def _cluster_callback(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
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
        click.echo(render.terminal_safe(table(), keep=render.MULTILINE))
    else:
        click.echo(render.structured(document, settings.output))


def now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------- completion


def _completion_client(ctx: click.Context) -> ClusterClient | None:
    root = ctx.find_root()
    value = root.params.get("cluster") or os.environ.get(CLUSTER_ENV) or DEFAULT_CLUSTER
    try:
        addresses = value if isinstance(value, list) else parse_cluster(str(value))
    except ValueError:
        return None
    try:
        token = find_token(root.params.get("token_file"))
        tls = find_tls(root.params.get("ca"), root.params.get("cert"), root.params.get("key"))
    except CommandFailed:
        return None
    return ClusterClient(
        addresses,
        timeout_s=1.0,
        per_try_timeout_s=0.5,
        token=token,
        channel_factory=Transport(tls).channel,
    )


def _complete(
    ctx: click.Context,
    fetch: Callable[[ClusterClient], list[tuple[str, str]]],
    incomplete: str,
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
        lambda c: [(j.job_id, f"{j.spec.name} {j.state}") for j in c.list_jobs()],
        incomplete,
    )


def complete_node_ids(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    return _complete(ctx, lambda c: [(n.node_id, n.status) for n in c.list_nodes()], incomplete)


# --------------------------------------------------------------------------- group


@click.group(
    cls=SynctlGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=(
        "Exit codes: 0 ok, 1 job failed (--wait) or other error, 2 usage or invalid spec, "
        "3 cluster unreachable, 4 not found, 5 refused (credential or permission).\n\n"
        'Shell completion (bash): eval "$(_SYNCTL_COMPLETE=bash_source synctl)"; '
        "zsh: zsh_source; fish: fish_source."
    ),
)
@click.option(
    "--cluster",
    envvar=CLUSTER_ENV,
    default=DEFAULT_CLUSTER,
    show_default=True,
    show_envvar=True,
    callback=_cluster_callback,
    help="gRPC addresses of the scheduler replicas, comma-separated (any one will do; "
    "requests find the leader).",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(render.OUTPUT_FORMATS),
    default="table",
    show_default=True,
    help="table for people; json or yaml for scripts (stable, see docs/cli.md).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=3600),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds each call may take, leader search and retries included.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=TOKEN_FILE_ENV,
    show_envvar=True,
    default=None,
    help=f"File holding the bearer token to send (default: ${TOKEN_ENV}, else "
    "$XDG_CONFIG_HOME/synapse/token, i.e. ~/.config/synapse/token).",
)
@click.option(
    "--ca",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=CA_ENV,
    show_envvar=True,
    default=None,
    help=f"The cluster CA bundle (PEM) (default: $XDG_CONFIG_HOME/synapse/{CA_FILE_NAME} "
    "when it exists). With --cert and --key: mutual TLS; without all three: plaintext.",
)
@click.option(
    "--cert",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=CERT_ENV,
    show_envvar=True,
    default=None,
    help=f"synctl's client certificate (PEM) (default: .../synapse/{CERT_FILE_NAME}).",
)
@click.option(
    "--key",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=KEY_ENV,
    show_envvar=True,
    default=None,
    help=f"The client certificate's private key (default: .../synapse/{KEY_FILE_NAME}).",
)
@click.version_option(package_name="synapse-ha", prog_name="synctl")
@click.pass_context
def cli(
    ctx: click.Context,
    cluster: list[str],
    output: str,
    timeout: float,
    token_file: Path | None,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
) -> None:
    """Submit and watch gang jobs, and look after the nodes and replicas of a synapse
    cluster.

    \b
    Examples:
      synctl submit examples/cpu-gang.yaml --wait
      synctl jobs -o json
      synctl --cluster 10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000 cluster

    \b
    Credentials (printed by `synctl dev up`):
      export SYNAPSE_CA=... SYNAPSE_CERT=... SYNAPSE_KEY=... SYNAPSE_TOKEN_FILE=...
    """
    settings = Settings(addresses=cluster, output=output, timeout=timeout)
    ctx.obj = settings
    ctx.call_on_close(settings.close)
    if ctx.invoked_subcommand in LOCAL_COMMANDS:
        return  # they touch local files or start processes; no cluster credentials
    settings.token = find_token(token_file)
    settings.tls = find_tls(ca, cert, key)


# -------------------------------------------------------------------------- submit


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Wait for the job to end; exit 1 unless it succeeded.")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Stream every member's output ([rank N] prefix) until the job ends; implies --wait.",
)
@output_option
@with_settings
def submit(settings: Settings, file: Path, wait: bool, follow: bool) -> None:
    """Validate the job spec FILE (YAML, see docs/cli.md) and submit it; print the job id.

    The spec is checked before anything is sent: an invalid one exits 2 naming the file
    line, the field and the rule. The submission carries the spec's request_id (a fresh
    one when it has none), reused on every retry, so a retry never creates a second job;
    submitting a file with the same request_id again returns the same job.

    \b
    Examples:
      synctl submit examples/cpu-gang.yaml
      synctl submit job.yaml --wait && echo done
      synctl submit job.yaml --follow
    """
    # The topology level names are the cluster's configuration: the cluster checks them.
    parsed = load_job_file(file, topology_levels=None)
    request_id = parsed.request_id or new_request_id()
    client = settings.client()
    try:
        answer = client.submit_job(spec_to_proto(parsed.spec), request_id)
    except grpc.RpcError as exc:
        failure = failure_of(exc)
        if failure.reason is not Reason.INVALID_FIELD or not failure.field:
            raise
        line = line_in_file(file, failure.field)
        violation = failure.violations[0] if failure.violations else None
        raise SpecFileError(
            str(file),
            line,
            failure.field,
            f"{failure.rule} (the cluster's rule)",
            violation.code if violation else None,
        ) from exc
    job_id = answer.job_id
    if not answer.created:
        note(f"job {job_id} already submitted (request_id {request_id}); not submitted again")
    document: dict[str, Any] = {"id": job_id, "request_id": request_id, "created": answer.created}
    if not (wait or follow):
        emit(settings, document, lambda: job_id)
        return
    if settings.output == "table":
        click.echo(job_id)
    job = follow_job(settings, job_id, None) if follow else wait_for_job(settings, job_id)
    note(f"job {job_id} {job.state}" + (f": {job.reason}" if job.reason else ""))
    if settings.output != "table":
        document["state"] = job.state
        click.echo(render.structured(document, settings.output))
    if job.state != "SUCCEEDED":
        raise click.exceptions.Exit(int(ExitCode.JOB_FAILED))


def _describe_progress(job: pb.Job) -> str:
    text = f"job {job.job_id}: {job.state}"
    if job.HasField("attempt") and job.state in ("SCHEDULED", "RUNNING"):
        text += f" (attempt {job.attempt.number})"
    elif job.reason and job.state == "PENDING":
        text += f" ({job.reason})"
    return text


def wait_for_job(settings: Settings, job_id: str) -> pb.Job:
    """Poll until the job reaches a final state, noting each change on stderr."""
    client = settings.client()
    last = ""
    while True:
        job = client.get_job(job_id)
        progress = _describe_progress(job)
        if progress != last and job.state not in FINISHED_STATES:
            note(progress)
            last = progress
        if job.state in FINISHED_STATES:
            return job
        time.sleep(POLL_INTERVAL_S)


# ---------------------------------------------------------------------------- logs


def node_addresses(settings: Settings) -> dict[str, str]:
    return {n.node_id: n.address for n in settings.client().list_nodes()}


def fetch_grant(settings: Settings, member: MemberLog) -> LogGrant | None:
    """A grant to read ``member``'s log, from the leader; None from a cluster that signs
    none (insecure, ``NEEDS_TLS``). A refusal (not the job's owner, no credential) is
    raised as the ``grpc.RpcError`` it is."""
    client = settings.client()
    request = pb.GrantLogAccessRequest(
        job_id=member.job_id, attempt=member.attempt, rank=member.rank
    )
    try:
        answer: pb.GrantLogAccessResponse = client.call(
            "GrantLogAccess", lambda a, t: client.scheduler(a).GrantLogAccess(request, timeout=t)
        )
    except grpc.RpcError as exc:
        if failure_of(exc).reason is Reason.NEEDS_TLS:
            return None
        raise
    return LogGrant(answer.grant, answer.expires_at_ms / 1000)


def grant_cache(settings: Settings) -> GrantCache:
    return GrantCache(functools.partial(fetch_grant, settings))


def member_logs(job: pb.Job, addresses: dict[str, str], member: int | None) -> list[MemberLog]:
    members = list(job.attempt.members)
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
        out.append(MemberLog(job.job_id, job.attempt.number, m.rank, m.node_id, address))
    return out


def _stop_followers(followers: list[MemberFollower], drain_s: float) -> None:
    deadline = time.monotonic() + drain_s
    for follower in followers:
        follower.join(max(0.0, deadline - time.monotonic()))
    for follower in followers:
        follower.stop()
    for follower in followers:
        follower.join(2.0)
        if not follower.done and follower.last_error:
            note(f"[rank {follower.member.rank}] log may be incomplete: {follower.last_error}")
    followers.clear()


def follow_job(settings: Settings, job_id: str, member: int | None, raw: bool = False) -> pb.Job:
    """Stream the members' output until the job ends; a retry's new attempt is followed
    from its start. Returns the final job. Output is escaped for the terminal unless
    ``raw``."""
    client = settings.client()
    printer = LinePrinter(click.echo, prefixed=member is None, raw=raw)
    grants = grant_cache(settings)
    followers: list[MemberFollower] = []
    followed = 0
    last = ""
    try:
        while True:
            job = client.get_job(job_id)
            progress = _describe_progress(job)
            if progress != last and job.state not in FINISHED_STATES:
                note(progress)
                last = progress
            attempt = job.attempt.number if job.HasField("attempt") else 0
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
            if job.state in FINISHED_STATES:
                _stop_followers(followers, FOLLOW_DRAIN_S)
                return job
            time.sleep(POLL_INTERVAL_S)
    finally:
        for follower in followers:
            follower.stop()


@cli.command()
@click.argument("job_id", metavar="JOB", shell_complete=complete_job_ids)
@click.option("--member", type=click.IntRange(min=0), help="Only this rank's output.")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new output until the job ends.")
@click.option(
    "--raw",
    is_flag=True,
    help="Write the output's bytes as the members wrote them, control characters included "
    "(for a file or a pipe; a terminal obeys them).",
)
@with_settings
def logs(settings: Settings, job_id: str, member: int | None, follow: bool, raw: bool) -> None:
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
    """
    if follow:
        job = follow_job(settings, job_id, member, raw)
        note(f"job {job_id} {job.state}")
        return
    job = settings.client().get_job(job_id)
    if not job.HasField("attempt"):
        raise CommandFailed(
            ExitCode.JOB_FAILED,
            f"job {job_id} is {job.state} and has never started, so it has no output"
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


@cli.command()
@click.argument("job_id", metavar="JOB", shell_complete=complete_job_ids)
@output_option
@with_settings
def status(settings: Settings, job_id: str) -> None:
    """Show one job: state, reason, attempt and fencing token, and where each member runs.

    \b
    Example:
      synctl status 42 -o json
    """
    document = render.job_document(settings.client().get_job(job_id))
    emit(settings, document, lambda: render.job_table(document, now_ms()))


@cli.command()
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
@output_option
@with_settings
def jobs(settings: Settings, states: tuple[str, ...], show_all: bool, name: str, node: str) -> None:
    """List jobs in submission order: active ones, or --all, or those in --state.

    \b
    Examples:
      synctl jobs
      synctl jobs --all -o json
      synctl jobs --state pending --state failed
    """
    wanted = [s.upper() for s in states] or ([] if show_all else list(ACTIVE_STATES))
    found = settings.client().list_jobs(states=wanted, name=name, node_id=node)
    documents = [render.job_document(j) for j in found]
    emit(settings, {"jobs": documents}, lambda: render.jobs_table(documents, now_ms()))


@cli.command()
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
    answer = client.explain_job(job_id)
    job = client.get_job(job_id)
    nodes = client.list_nodes() if job.HasField("attempt") else []
    document = render.explain_document(answer, job, nodes)
    emit(settings, document, lambda: render.explain_table(document))


@cli.command()
@click.argument("job_id", metavar="JOB", shell_complete=complete_job_ids)
@click.option("--reason", default="", help="Recorded with the cancellation.")
@output_option
@with_settings
def cancel(settings: Settings, job_id: str, reason: str) -> None:
    """Cancel a job: a pending one never starts, a running one's members are stopped.

    \b
    Example:
      synctl cancel 42 --reason "wrong dataset"
    """
    client = settings.client()
    try:
        answer = client.cancel_job(job_id, reason)
        document = {"id": job_id, "state": answer.state, "message": answer.message}
    except grpc.RpcError as exc:
        if failure_of(exc).reason is not Reason.CONFLICT:
            raise
        # Already finished. A retried cancel whose first try went through lands here too.
        job = client.get_job(job_id)
        if job.state != "CANCELLED":
            raise CommandFailed(
                ExitCode.JOB_FAILED,
                f"job {job_id} already finished as {job.state}",
                str(Reason.CONFLICT),
            ) from exc
        document = {"id": job_id, "state": job.state, "message": job.reason}
    emit(settings, document, lambda: f"job {job_id}: {document['state']}")


# --------------------------------------------------------------------------- nodes


@cli.command()
@output_option
@with_settings
def nodes(settings: Settings) -> None:
    """List nodes: status, topology path, free GPUs, CPU and memory in use, last heartbeat.

    \b
    Example:
      synctl nodes -o yaml
    """
    documents = [render.node_document(n) for n in settings.client().list_nodes()]
    emit(settings, {"nodes": documents}, lambda: render.nodes_table(documents))


def _node_status_command(action: str, summary: str, example: str) -> None:
    @cli.command(name=action, help=f"{summary}\n\n\b\nExample:\n  {example}")
    @click.argument("node_id", metavar="NODE", shell_complete=complete_node_ids)
    @click.option("--reason", default="", help="Shown in `synctl nodes -o json`.")
    @output_option
    @with_settings
    def command(settings: Settings, node_id: str, reason: str) -> None:
        new_status = settings.client().set_node_status(node_id, action, reason)
        document = {"id": node_id, "status": new_status}
        emit(settings, document, lambda: f"node {node_id}: {new_status}")


_node_status_command(
    "cordon",
    "Stop placing new members on NODE; members already there keep running.",
    'synctl cordon gpu-017 --reason "flaky NIC"',
)
_node_status_command("uncordon", "Let NODE take new members again.", "synctl uncordon gpu-017")
_node_status_command(
    "drain",
    "Place nothing new on NODE and let its members finish; it is cordoned once empty.",
    'synctl drain gpu-017 --reason "maintenance"',
)


# ------------------------------------------------------------------------- cluster


@cli.group(invoke_without_command=True)
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
    client = settings.client()
    request = pb.GetClusterStatusRequest()
    answer: pb.GetClusterStatusResponse = client.call(
        "GetClusterStatus", lambda a, t: client.scheduler(a).GetClusterStatus(request, timeout=t)
    )
    document = render.cluster_document(answer)
    emit(settings, document, lambda: render.cluster_table(document))


# Membership and backup: synctl cluster add-replica | remove-replica | snapshot
from synapse_ha.cli.cluster_ops import add_cluster_commands  # noqa: E402

add_cluster_commands(cluster)


# -------------------------------------------------------------------------- tokens


@cli.group()
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
    "--role",
    type=click.Choice(["user", "operator", "admin"]),
    default="user",
    show_default=True,
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
    answer = settings.client().create_token(
        user_name,
        role,
        queues,
        ttl_ms,
        priority_classes=priority_classes,
        max_priority=max_priority,
    )
    document = render.created_token_document(answer, user_name, role)
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
    client = settings.client()
    request = pb.ListTokensRequest()
    answer: pb.ListTokensResponse = client.call(
        "ListTokens", lambda a, t: client.scheduler(a).ListTokens(request, timeout=t)
    )
    documents = [render.token_document(t) for t in answer.tokens]
    emit(settings, {"tokens": documents}, lambda: render.tokens_table(documents))


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
    client = settings.client()
    request = pb.RevokeTokenRequest(token_id=token_id)
    answer: pb.RevokeTokenResponse = client.call(
        "RevokeToken", lambda a, t: client.scheduler(a).RevokeToken(request, timeout=t)
    )
    document = {"id": token_id, "revoked_at_ms": answer.revoked_at_ms}
    emit(settings, document, lambda: f"token {token_id}: revoked")


cli.add_command(ca)
from synapse_ha.cli import config as _config  # noqa: E402, F401  (registers its commands)
from synapse_ha.cli import queues as _queues  # noqa: E402, F401  (registers its commands)

# ----------------------------------------------------------------------------- dev


@cli.group()
def dev() -> None:
    """Tools for trying synapse on one machine."""


@dev.command("up")
@click.option("--workers", type=click.IntRange(0, 64), default=4, show_default=True)
@click.option("--racks", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option(
    "--gpus-per-worker",
    type=click.IntRange(0, 64),
    default=8,
    show_default=True,
    help="Mock GPUs each worker declares.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep replica and worker data (and the cluster's credentials) here (default: a "
    "temporary directory, removed).",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="No TLS and no authentication: anyone who can reach the ports is an admin.",
)
@click.option(
    "--replicas",
    type=click.Choice(["3", "5"]),
    default="3",
    show_default=True,
    help="Scheduler replicas (five survive two failures; ports 7101-7105).",
)
def dev_up(
    workers: int,
    racks: int,
    gpus_per_worker: int,
    data_dir: Path | None,
    insecure: bool,
    replicas: str,
) -> None:
    """Run three (or, with --replicas 5, five) scheduler replicas and mock-GPU workers on
    127.0.0.1 in the foreground, until Ctrl-C; then stop them all.

    Secure by default: it makes a CA, certificates and an admin token in DATA_DIR/credentials
    and prints the export lines that let the next synctl commands in.

    \b
    Example:
      synctl dev up --workers 4 --racks 2
      # printed; paste them into another shell:
      export SYNAPSE_CLUSTER=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
      export SYNAPSE_CA=... SYNAPSE_CERT=... SYNAPSE_KEY=... SYNAPSE_TOKEN_FILE=...
    """
    from synapse_ha.local.devcluster import DevClusterOptions, run_foreground

    sys.exit(
        run_foreground(
            DevClusterOptions(
                workers=workers,
                racks=racks,
                gpus_per_worker=gpus_per_worker,
                data_dir=data_dir,
                insecure=insecure,
                replicas=int(replicas),
            ),
            out=click.echo,
        )
    )


for _history_command in HISTORY_COMMANDS:  # history, usage, events
    cli.add_command(_history_command)


# ---------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> None:
    cli.main(args=list(argv) if argv is not None else None, prog_name="synctl")
