"""``synctl squeue``, ``synctl sacct`` and ``synctl scancel``: Slurm's query and cancel
commands over the cluster's jobs, with the options and output formats that scripts and
tools (submitit, Hydra's launcher) use (docs/slurm.md).

Job ids print in Slurm's form (``42``, ``42_7``) and are read in either form
(:mod:`synapse_ha.client.slurm_fields`); states and pending reasons are Slurm's words.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import click
import grpc

from synapse_ha.cli.app import CommandFailed, Settings, with_settings
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.client import slurm_fields as sf
from synapse_ha.client.sbatch import RECORDED
from synapse_ha.core.model import JobState
from synapse_ha.rpc import states
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.slurm.commands import PROGRAMS, write_commands

# squeue's default format, as Slurm's.
SQUEUE_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
SACCT_FIELDS = "JobID,JobName,Partition,State,ExitCode"
_SPEC = re.compile(r"%(\.)?(\d+)?([a-zA-Z])")
# squeue's format letters (those its -o takes) and the field each one prints.
_LETTERS = {
    "i": "jobid", "A": "jobid", "j": "jobname", "u": "user", "t": "statecompact",
    "T": "state", "M": "elapsed", "l": "timelimit", "D": "nnodes", "N": "nodelist",
    "P": "partition", "S": "start", "V": "submit", "e": "end", "r": "reason",
    "R": "reasonlist",
    "F": "arrayjobid", "K": "arraytaskid", "Z": "workdir",
}  # fmt: skip
_HEADERS = {
    "jobid": "JOBID", "jobname": "NAME", "user": "USER", "statecompact": "ST",
    "state": "STATE", "elapsed": "TIME", "timelimit": "TIME_LIMIT", "nnodes": "NODES",
    "nodelist": "NODELIST", "partition": "PARTITION", "start": "START_TIME",
    "submit": "SUBMIT_TIME", "end": "END_TIME", "reason": "REASON",
    "reasonlist": "NODELIST(REASON)",
    "arrayjobid": "ARRAY_JOB_ID", "arraytaskid": "ARRAY_TASK_ID", "workdir": "WORK_DIR",
}  # fmt: skip
_ACTIVE_STATES = (JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING)


def split_ids(values: Sequence[str]) -> list[str]:
    return [v for value in values for v in value.split(",") if v]


def _jobs(settings: Settings, ids: Sequence[str], every: bool) -> list[pb.Job]:
    """The jobs named by ``ids`` (Slurm's or our form; an array's id names its tasks), or
    every active one (``every``: finished ones too), in submission order."""
    client = settings.client()
    if ids:
        found = []
        for text in ids:
            job_id = sf.job_id_of(text)
            try:
                found.append(client.get_job(job_id))
            except grpc.RpcError as exc:
                if failure_of(exc).reason is not Reason.JOB_NOT_FOUND:
                    raise
                if "_" not in job_id:  # an array: its tasks
                    found.extend(client.list_jobs(array_id=job_id))
        return found
    if every:
        return client.list_jobs()
    return client.list_jobs(**states.job_state_filter(_ACTIVE_STATES))


def cell(text: str, width: int | None, right: bool) -> str:
    if width is None:
        return text
    text = text[:width]
    return text.rjust(width) if right else text.ljust(width)


def squeue_line(job: pb.Job, fmt: str, now_ms: int) -> str:
    """One job as squeue's ``-o`` format ``fmt`` prints it (``%[.][width]letter``; ``.``
    right-justifies; ``%%`` is ``%``)."""
    return render_format(fmt, _LETTERS, lambda name: _squeue_value(job, name, now_ms), "squeue")


def squeue_header(fmt: str) -> str:
    return render_format(fmt, _LETTERS, lambda name: _HEADERS[name], "squeue")


def _squeue_value(job: pb.Job, name: str, now_ms: int) -> str:
    if name == "reasonlist":  # %R: why it waits, or where it runs
        return sf.reason(job)
    return sf.field(job, name, now_ms)


def render_format(
    fmt: str, letters: Mapping[str, str], value: Callable[[str], str], command: str
) -> str:
    """``fmt`` with each ``%[.][width]letter`` replaced by ``value`` of the field
    ``letters`` names for it; a letter not there is refused naming ``command``."""
    out: list[str] = []
    at = 0
    for match in _SPEC.finditer(fmt):
        out.append(fmt[at : match.start()].replace("%%", "%"))
        dot, width, letter = match.groups()
        name = letters.get(letter)
        if name is None:
            raise CommandFailed(
                ExitCode.USAGE, f"-o: %{letter} is not a {command} field here", "USAGE"
            )
        out.append(cell(value(name), int(width) if width else None, bool(dot)))
        at = match.end()
    out.append(fmt[at:].replace("%%", "%"))
    return "".join(out)


@click.command(context_settings={"help_option_names": ["--help"]})  # -h is --noheader
@click.option("-j", "--jobs", "ids", multiple=True, help="Only these jobs (42, 42_7, job-000042).")
@click.option("-u", "--user", "users", multiple=True, help="Only these users' jobs.")
@click.option("-n", "--name", "names", multiple=True, help="Only jobs of these names.")
@click.option(
    "-t", "--states", "wanted", multiple=True, help="Only these states (Slurm's words; all)."
)
@click.option("-p", "--partition", "partitions", multiple=True, help="Only these queues.")
@click.option("-o", "--format", "fmt", default=SQUEUE_FORMAT, show_default=True, help="Fields.")
@click.option("-h", "--noheader", is_flag=True, help="No header line.")
@click.option("--me", is_flag=True, help="Only your own jobs (the cluster shows you yours).")
@click.option(
    "-a", "--all", "all_partitions", is_flag=True, help="Accepted (every queue is listed)."
)
@click.option("-r", "--array", is_flag=True, help="Accepted (array tasks are listed one per line).")
@with_settings
def squeue(
    settings: Settings,
    ids: tuple[str, ...],
    users: tuple[str, ...],
    names: tuple[str, ...],
    wanted: tuple[str, ...],
    partitions: tuple[str, ...],
    fmt: str,
    noheader: bool,
    me: bool,
    all_partitions: bool,
    array: bool,
) -> None:
    """Pending and running jobs as Slurm's squeue lists them.

    \b
    Examples:
      synctl squeue
      synctl squeue -j 42,43 -h -o '%i %T %R'
      synctl squeue -u alice -t running
    """
    wanted_states = {s.upper() for s in split_ids(wanted)}
    jobs = _jobs(settings, split_ids(ids), every="ALL" in wanted_states)
    now_ms = int(time.time() * 1000)
    lines = [] if noheader else [squeue_header(fmt)]
    for job in jobs:
        if users and job.owner not in split_ids(users):
            continue
        if names and job.spec.name not in split_ids(names):
            continue
        if partitions and sf.partition(job) not in split_ids(partitions):
            continue
        slurm_state = sf.state(job)
        short = sf.SHORT_STATES.get(slurm_state, slurm_state)
        if wanted_states - {"ALL"} and not {slurm_state, short} & wanted_states:
            continue
        if not wanted_states and states.job_state(job) not in _ACTIVE_STATES:
            continue
        lines.append(squeue_line(job, fmt, now_ms))
    for line in lines:
        click.echo(line)


@click.command()
@click.option("-j", "--jobs", "ids", multiple=True, help="These jobs (42, 42_7, job-000042).")
@click.option("-o", "--format", "fields", default=SACCT_FIELDS, show_default=True, help="Fields.")
@click.option("-P", "--parsable2", is_flag=True, help="'|' between fields, none at the end.")
@click.option("-p", "--parsable", is_flag=True, help="'|' after every field.")
@click.option("-n", "--noheader", is_flag=True, help="No header line.")
@click.option("-X", "--allocations", is_flag=True, help="Accepted (a job has no steps here).")
@click.option("-u", "--user", "users", multiple=True, help="Only these users' jobs.")
@click.option("-S", "--starttime", default=None, help="Accepted (every job the cluster holds).")
@with_settings
def sacct(
    settings: Settings,
    ids: tuple[str, ...],
    fields: str,
    parsable2: bool,
    parsable: bool,
    noheader: bool,
    allocations: bool,
    users: tuple[str, ...],
    starttime: str | None,
) -> None:
    """Jobs, finished ones too, as Slurm's sacct shows them.

    Fields (-o): JobID, JobIDRaw, JobName, User, State, ExitCode, NodeList, NNodes,
    Partition, Timelimit, Elapsed, Submit, Start, End, WorkDir, Restarts, Reason; a
    %WIDTH suffix sets a column's width.

    \b
    Examples:
      synctl sacct -j 42
      synctl sacct -o JobID,State,NodeList --parsable2 -n -j 42,43
    """
    columns: list[tuple[str, int]] = []
    for item in split_ids([fields]):
        name, _, width = item.partition("%")
        if name.lower() not in sf.FIELDS:
            raise CommandFailed(
                ExitCode.USAGE, f"--format: {name} is not a sacct field here", "USAGE"
            )
        columns.append((name, int(width) if width.isdigit() else 10))
    jobs = _jobs(settings, split_ids(ids), every=True)
    if users:
        jobs = [j for j in jobs if j.owner in split_ids(users)]
    now_ms = int(time.time() * 1000)
    rows = [[sf.field(job, name, now_ms) for name, _ in columns] for job in jobs]
    header = [name for name, _ in columns]
    if parsable2 or parsable:
        end = "|" if parsable else ""
        for row in ([] if noheader else [header]) + rows:
            click.echo("|".join(row) + end)
        return
    if not noheader:
        click.echo(" ".join(cell(h, w, False) for h, (_, w) in zip(header, columns, strict=True)))
        click.echo(" ".join("-" * w for _, w in columns))
    for row in rows:
        click.echo(" ".join(cell(v, w, True) for v, (_, w) in zip(row, columns, strict=True)))


@click.command()
@click.argument("ids", nargs=-1, required=True, metavar="JOBID...")
@click.option("-Q", "--quiet", is_flag=True, help="No message for a job already finished.")
@with_settings
def scancel(settings: Settings, ids: tuple[str, ...], quiet: bool) -> None:
    """Cancel jobs as Slurm's scancel does: silent when it worked.

    \b
    Examples:
      synctl scancel 42
      synctl scancel 42_7 43
    """
    client = settings.client()
    failed = False
    for text in split_ids(ids):
        job_id = sf.job_id_of(text)
        try:
            client.cancel_job(job_id)
        except grpc.RpcError as exc:
            reason = failure_of(exc).reason
            if reason is Reason.CONFLICT:
                if not quiet:
                    click.echo(f"scancel: error: Job {text} already finished", err=True)
                continue
            if reason is not Reason.JOB_NOT_FOUND:
                raise
            click.echo(f"scancel: error: Invalid job id {text}", err=True)
            failed = True
    if failed:
        raise CommandFailed(ExitCode.NOT_FOUND, "some job ids were not found", "JOB_NOT_FOUND")


def show_job(job: pb.Job, now_ms: int) -> str:
    """``scontrol show job``'s ``Key=Value`` lines, with the keys scripts parse."""
    f = sf.field
    pairs = [
        [("JobId", f(job, "jobid", now_ms)), ("JobName", job.spec.name)],
        [("UserId", job.owner)],
        [("JobState", sf.state(job)), ("Reason", f(job, "reason", now_ms))],
        [("Restarts", f(job, "restarts", now_ms)), ("ExitCode", sf.exit_code(job))],
        [("RunTime", sf.elapsed(job, now_ms)), ("TimeLimit", sf.time_limit(job))],
        [("SubmitTime", f(job, "submit", now_ms))],
        [("StartTime", f(job, "start", now_ms)), ("EndTime", f(job, "end", now_ms))],
        [("Partition", sf.partition(job))],
        [("NodeList", sf.node_list(job) or "(null)"), ("BatchHost", _batch_host(job))],
        [("NumNodes", sf.nodes_count(job)), ("NumTasks", sf.nodes_count(job))],
        [("WorkDir", job.spec.workdir or "(null)")],
        [("StdOut", "(null)")],  # a member's output stays on its node: synctl logs
    ]
    env = {e.name: e.value for e in job.spec.env}  # withheld from those who may not see it
    kept = [(key, env[name]) for name, key in RECORDED.values() if name in env]
    if kept:
        pairs.append(kept)
    return "\n".join(" ".join(f"{k}={v}" for k, v in line) for line in pairs)


def _batch_host(job: pb.Job) -> str:
    if job.HasField("attempt") and job.attempt.members:
        return job.attempt.members[0].node_id
    return "(null)"


def show_jobs(settings: Settings, ids: Sequence[str]) -> None:
    """Every job named (or every active one), blank lines between, as scontrol."""
    jobs = _jobs(settings, ids, every=False)
    if ids and not jobs:
        raise CommandFailed(ExitCode.NOT_FOUND, "Invalid job id specified", "JOB_NOT_FOUND")
    now_ms = int(time.time() * 1000)
    click.echo("\n\n".join(show_job(job, now_ms) for job in jobs))


@click.command(name="slurm-commands")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
def slurm_commands(folder: Path) -> None:
    """Write Slurm's commands (sbatch, squeue, sacct, scancel, sinfo, scontrol, srun) into
    FOLDER, each running synctl's with this Python, for tools that call Slurm's by name
    (submitit, Hydra's launcher). Put FOLDER first on PATH where no real Slurm is wanted;
    they find the cluster as synctl does (SYNAPSE_CLUSTER and the credential variables,
    or the configuration files).

    \b
    Examples:
      synctl slurm-commands ~/.local/synapse-slurm/bin
      PATH=~/.local/synapse-slurm/bin:$PATH python train_with_submitit.py
    """
    folder.mkdir(parents=True, exist_ok=True)
    write_commands(folder, sys.executable, mode=0o755)
    click.echo(f"wrote {', '.join(PROGRAMS)} to {folder}")


COMMANDS: list[click.Command] = [squeue, sacct, scancel, slurm_commands]
