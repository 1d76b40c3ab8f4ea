"""``synctl sbatch``: submit a Slurm batch script (docs/slurm.md).

The translation (:mod:`synapse_ha.client.sbatch`) reads the script's ``#SBATCH`` lines and
the options given after the script; the result is checked as a job spec file is and
submitted as ``synctl submit`` does (``--dry-run`` prints it instead).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import grpc
import yaml

from synapse_ha.cli.app import CommandFailed, Settings, note, with_settings
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.jobs import wait_for_job
from synapse_ha.client.cluster import new_request_id
from synapse_ha.client.credentials import CA_ENV, CERT_ENV, CLUSTER_ENV, KEY_ENV, TOKEN_FILE_ENV
from synapse_ha.client.jobs import JobView
from synapse_ha.client.sbatch import (
    NodeShape,
    SbatchError,
    Translation,
    script_position,
    split_options,
    translate,
    whole_node_shape,
)
from synapse_ha.core.model import JobState, NodeStatus
from synapse_ha.core.node_selector import NodeSelector, compiled
from synapse_ha.core.spec.document import ParsedJob, SpecError, parse_job_spec
from synapse_ha.rpc import states
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.to_proto import spec_to_proto
from synapse_ha.slurm.ids import slurm_id

MAX_SCRIPT_BYTES = 48 * 1024  # the script is the members' command (at most 64 KiB in all)


@click.command(
    context_settings={"ignore_unknown_options": True},
    options_metavar="[SBATCH OPTIONS]",
)
@click.option(
    "--dry-run",
    "--test-only",
    "dry_run",
    is_flag=True,
    help="Print the job spec it builds; submit nothing.",
)
@click.option("--parsable", is_flag=True, help="Print only the job id.")
@click.option("--slurm-ids", is_flag=True, hidden=True, help="Print Slurm's form of the id (42).")
@click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar="SCRIPT [ARGS]...")
@with_settings
def sbatch(
    settings: Settings, words: tuple[str, ...], dry_run: bool, parsable: bool, slurm_ids: bool
) -> None:
    """Submit a Slurm batch SCRIPT, as sbatch does: its #SBATCH options, and those given
    before it (which win), become a job spec; the script runs as each member's command,
    with ARGS, and with the SLURM_* variables set.

    Options not supported here are refused with their line (exit 2), never ignored; the
    supported ones are listed in docs/slurm.md.

    \b
    Examples:
      synctl sbatch train.sh
      synctl sbatch -N 4 --gres=gpu:8 -t 12:00:00 train.sh --lr 3e-4
      synctl sbatch --dependency=afterok:job-000012 --dry-run eval.sh
      synctl sbatch -N 2 --wrap "srun hostname"
    """
    at = script_position(words)
    options, args = list(words[:at]), list(words[at + 1 :])
    wrapped = _wrapped(options)
    if wrapped is not None and at < len(words):
        raise CommandFailed(ExitCode.USAGE, "give a script or --wrap, not both", "USAGE")
    if wrapped is None and at >= len(words):
        raise CommandFailed(
            ExitCode.USAGE, "no script given: synctl sbatch [OPTIONS] SCRIPT", "USAGE"
        )
    script = Path("wrap") if wrapped is not None else Path(words[at])
    text = f"#!/bin/sh\n{wrapped}\n" if wrapped is not None else _read(script)
    translation, parsed = prepare(settings, text, str(script), options, args)
    if dry_run:
        click.echo(
            yaml.dump(translation.spec, Dumper=_Dumper, sort_keys=False, width=100), nl=False
        )
        return
    job_id = submit(settings, parsed, str(script))
    shown = slurm_id(job_id) if slurm_ids else job_id  # as Slurm's sbatch
    click.echo(shown if parsable else f"Submitted batch job {shown}")
    if translation.wait:
        code = exit_status(wait_for_job(settings, job_id))
        if code:
            raise click.exceptions.Exit(code)


def _wrapped(options: list[str]) -> str | None:
    """The command ``--wrap`` gives (sbatch makes it a ``/bin/sh`` script), if any."""
    try:
        given = split_options(options, "command line")
    except SbatchError:
        return None  # said with its line by the translation
    found = [value for name, value, _written in given if name == "wrap"]
    return found[-1] if found else None


def prepare(
    settings: Settings, text: str, script: str, options: list[str], args: list[str]
) -> tuple[Translation, ParsedJob]:
    """The job of batch script ``text`` with sbatch ``options`` and ``args``, checked as a
    job spec file is; its notes are said on stderr. Raises CommandFailed (exit 2)."""
    try:
        translation = translate(
            text, script, options, args, node_shape=functools.partial(node_shape, settings)
        )
    except SbatchError as exc:
        raise CommandFailed(ExitCode.USAGE, str(exc), str(Reason.INVALID_FIELD)) from exc
    for line in translation.notes:
        note(line)
    document = translation.spec
    for name, value in cluster_env(settings).items():  # --export's own values win
        document["env"].setdefault(name, value)
    try:
        parsed = parse_job_spec(document, topology_levels=None)
    except SpecError as exc:
        message = "; ".join(f"{script}: {v}" for v in exc.violations)
        raise CommandFailed(ExitCode.USAGE, message, str(Reason.INVALID_FIELD)) from exc
    return translation, parsed


def submit(settings: Settings, parsed: ParsedJob, script: str) -> str:
    """Submit the job; its id. A spec the cluster refuses is exit 2, naming its rule."""
    try:
        answer = settings.client().submit_job(spec_to_proto(parsed.spec), new_request_id())
    except grpc.RpcError as exc:
        failure = failure_of(exc)
        if failure.reason is not Reason.INVALID_FIELD:
            raise
        broken = [f"{v.field}: {v.rule}" for v in failure.violations]
        if not broken:  # one rule, or only the refusal's own words
            broken = [f"{failure.field}: {failure.rule}" if failure.field else exc.details() or ""]
        message = "; ".join(f"{script}: {b} (the cluster's rule)" for b in broken)
        raise CommandFailed(ExitCode.USAGE, message, str(Reason.INVALID_FIELD)) from exc
    job_id: str = answer.job_id
    return job_id


def exit_status(job: JobView) -> int:
    """sbatch -W's status: 0 when the job succeeded, else its batch script's exit code
    (1 when it has none: cancelled, or never started)."""
    if job.job_state is JobState.SUCCEEDED:
        return 0
    first = [m for m in (job.attempt.members if job.attempt else ()) if m.rank == 0]
    return (first[0].exit_code if first and first[0].exit_code else 0) or int(ExitCode.JOB_FAILED)


def cluster_env(settings: Settings) -> dict[str, str]:
    """How the job's own ``sbatch``, ``squeue``, ``scancel`` and ``scontrol`` reach the
    cluster: the addresses this synctl used, and the paths (never the contents) of its
    TLS files and token file. A token given as text (``$SYNAPSE_TOKEN``) is not passed
    on: inside the job the owner's configuration directory is read, as synctl reads it."""
    env = {CLUSTER_ENV: ",".join(settings.addresses)}
    if settings.tls is not None:
        tls = settings.tls
        for name, path in ((CA_ENV, tls.ca), (CERT_ENV, tls.cert), (KEY_ENV, tls.key)):
            env[name] = str(Path(path).resolve())
    root = click.get_current_context().find_root().params
    token_file = root.get("token_file") or os.environ.get(TOKEN_FILE_ENV)
    if token_file:
        env[TOKEN_FILE_ENV] = str(Path(token_file).resolve())
    return env


def node_shape(settings: Settings, selected: Mapping[str, Any]) -> NodeShape:
    """The shape whole-node jobs take (:func:`whole_node_shape`) among the cluster's live
    nodes that the job's ``nodes`` selector (``selected``, as the job spec writes it)
    allows, less the memory the cluster adds to each member for its supervisor."""
    client = settings.client()
    overhead = client.get_limits().member_overhead_memory_mib
    selector = NodeSelector(
        features=str(selected.get("features", "")),
        gpu_model=str(selected.get("gpu_model", "")),
        exclude=tuple(selected.get("exclude", ())),
    )
    rules = compiled(selector)
    nodes = []
    for n in client.list_nodes():
        alternatives = range(len(rules.alternatives))
        if states.node_status(n) is NodeStatus.DEAD or not any(
            rules.allows(a, n.node_id, n.address, n.features, n.gpu_model) for a in alternatives
        ):
            continue
        c = n.capacity
        nodes.append((n.node_id, NodeShape(c.gpu, c.cpu_milli, max(0, c.memory_mib - overhead))))
    return whole_node_shape(nodes)


class _Dumper(yaml.SafeDumper):
    """Writes strings of several lines (the script) as YAML literal blocks."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def _read(script: Path) -> str:
    try:
        with open(script, "rb") as f:
            raw = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise CommandFailed(
            ExitCode.USAGE, f"cannot read {script}: {exc.strerror}", "USAGE"
        ) from exc
    if len(raw) > MAX_SCRIPT_BYTES:
        raise CommandFailed(
            ExitCode.USAGE, f"{script}: larger than {MAX_SCRIPT_BYTES} bytes", "USAGE"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandFailed(ExitCode.USAGE, f"{script}: not UTF-8 text", "USAGE") from exc


COMMANDS: list[click.Command] = [sbatch]
