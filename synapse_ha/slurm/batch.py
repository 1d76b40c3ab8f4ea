"""The batch step: the script of an sbatch job, run once on the allocation's first node
with the batch step's Slurm variables, ``srun`` and ``scontrol`` first on its PATH, and
its output also written where ``-o``/``-e`` say (docs/slurm.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse_ha.slurm import wire
from synapse_ha.slurm.commands import write_commands
from synapse_ha.slurm.holder import Holder, status
from synapse_ha.slurm.hub import Hub
from synapse_ha.slurm.ids import NOT_AN_ARRAY, fill_pattern, slurm_id
from synapse_ha.slurm.member import Member


def batch_environment(
    env: Mapping[str, str], member: Member, ntasks: int, tasks_per_node: int, bin_dir: str
) -> dict[str, str]:
    """The batch script's environment: the member's, the batch step's Slurm variables,
    and ``srun``/``scontrol`` first on its PATH."""
    out = dict(env)
    nodes = len(member.hosts)
    out.update(
        {
            "SLURM_JOB_ID": slurm_id(member.job_id),
            "SLURM_JOBID": slurm_id(member.job_id),
            "SLURM_JOB_NAME": env.get("SYNAPSE_SBATCH_NAME", ""),
            "SLURM_JOB_NODELIST": ",".join(member.hosts),
            "SLURM_NODELIST": ",".join(member.hosts),
            "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_NNODES": str(nodes),
            "SLURM_NTASKS": str(ntasks),
            "SLURM_NPROCS": str(ntasks),
            "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
            "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})"
            if nodes > 1
            else str(tasks_per_node),
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_SUBMIT_DIR": env.get("SYNAPSE_SBATCH_SUBMIT_DIR", os.getcwd()),
            "SLURM_RESTART_COUNT": str(_restarts(env)),
            "SLURM_CPUS_PER_TASK": env.get("SYNAPSE_SBATCH_CPUS", "0"),
            "SLURM_GPUS_ON_NODE": str(
                len([g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g])
            ),
            wire.HUB_ENV: f"{member.hub[0]}:{member.hub[1]}",
            "PATH": f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
        }
    )
    if "SLURM_ARRAY_JOB_ID" in env:
        out["SLURM_ARRAY_JOB_ID"] = slurm_id(env["SLURM_ARRAY_JOB_ID"])
    return out


def _restarts(env: Mapping[str, str]) -> int:
    """Attempts before this one (requeues and retries alike): Slurm's restart count."""
    attempt = env.get("SYNAPSE_ATTEMPT", "1")
    return max(0, int(attempt) - 1) if attempt.isdigit() else 0


@dataclass(frozen=True, slots=True)
class OutputFiles:
    """``-o``/``-e`` as sbatch was given them (None: not given) and ``--open-mode``."""

    output: str | None = None
    error: str | None = None
    append: bool = False


@dataclass(frozen=True, slots=True)
class LimitSignal:
    """sbatch's ``--signal=[B:]SIG@SECONDS``: ``signum`` that long before the time limit
    (``limit_s`` from the script's start), to the batch script (``batch``) or else to
    every running step's tasks."""

    signum: int
    before_s: int
    limit_s: int
    batch: bool

    @classmethod
    def parse(cls, text: str | None, limit_s: int | None) -> LimitSignal | None:
        if not text or not limit_s:
            return None
        batch = text.startswith("B:")
        number, _, seconds = text.removeprefix("B:").partition("@")
        return cls(int(number), int(seconds or 60), limit_s, batch)


DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"


def file_name(pattern: str, env: Mapping[str, str], member: Member) -> str:
    """sbatch's ``-o``/``-e`` pattern for this job: ``%j`` the job, ``%A`` its array
    (else the job), ``%a`` its index in the array, ``%x`` its name, ``%u`` the user,
    ``%N`` the first node's short host name, ``%n``/``%t`` 0, ``%s`` ``batch``, ``%%``;
    a width (``%4a``) pads a number with zeros."""
    task = env.get("SLURM_ARRAY_TASK_ID")
    values = {
        "j": slurm_id(member.job_id),
        "A": slurm_id(env.get("SLURM_ARRAY_JOB_ID") or member.job_id),
        "a": task if task is not None else NOT_AN_ARRAY,
        "x": env.get("SYNAPSE_SBATCH_NAME", ""),
        "u": env.get("USER", ""),
        "N": socket.gethostname().split(".")[0],
        "n": "0",
        "t": "0",
        "s": "batch",
    }

    return fill_pattern(pattern, values)


def _open(files: OutputFiles, env: Mapping[str, str], member: Member) -> tuple[Any, Any]:
    """The batch script's output and error files, opened as the job's owner (this
    process): where ``-o`` and ``-e`` say (their folders made when missing), else Slurm's
    default in the working directory; errors go to the output file without ``-e``.
    Raises OSError naming the file."""
    default = DEFAULT_ARRAY_OUTPUT if "SLURM_ARRAY_TASK_ID" in env else DEFAULT_OUTPUT
    mode = "ab" if files.append else "wb"
    out_name = file_name(files.output or default, env, member)
    out = _open_one(out_name, mode)
    if not files.error:
        return out, out
    try:
        return out, _open_one(file_name(files.error, env, member), mode)
    except OSError:
        out.close()
        raise


def _open_one(name: str, mode: str) -> Any:
    """``name`` opened, its folder made when missing (a pattern's ``%j/``); an OSError
    naming it."""
    try:
        if os.path.dirname(name):
            os.makedirs(os.path.dirname(name), exist_ok=True)
        return open(name, mode)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open {name}: {exc.strerror}") from None


async def _copy(stream: asyncio.StreamReader, file: Any, mine: Any) -> None:
    """Everything ``stream`` says, into ``file`` and this member's own output."""
    while chunk := await stream.read(64 * 1024):
        file.write(chunk)
        file.flush()
        mine.write(chunk)
        mine.flush()


async def run_batch(
    member: Member,
    command: Sequence[str],
    ntasks: int,
    tasks_per_node: int,
    files: OutputFiles = OutputFiles(),
    warning: LimitSignal | None = None,
) -> int:
    """Run the batch script (``command``) with the hub and this node's holder; its
    status. Its output goes to its output files and to the member's own."""
    try:
        out, err = _open(files, os.environ, member)
    except OSError as exc:
        print(f"stepd: {exc.strerror}", file=sys.stderr)
        return 1
    hub = Hub(member, tasks_per_node)
    try:
        await hub.start()
    except OSError as exc:
        print(f"stepd: cannot listen for job steps on port {member.hub[1]}: {exc}", file=sys.stderr)
        return 1
    holder = asyncio.ensure_future(Holder(member).run())
    with out, err, tempfile.TemporaryDirectory(prefix="synapse-slurm-") as bin_dir:
        write_commands(Path(bin_dir), sys.executable)
        env = batch_environment(os.environ, member, ntasks, tasks_per_node, bin_dir)
        process = await asyncio.create_subprocess_exec(
            *command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            loop.add_signal_handler(signum, _forward, process, signum)
        if warning is not None:
            at = max(0, warning.limit_s - warning.before_s)
            if warning.batch:
                loop.call_later(at, _forward, process, warning.signum)
            else:
                loop.call_later(at, lambda: asyncio.ensure_future(hub.signal_steps(warning.signum)))
        assert process.stdout is not None and process.stderr is not None
        await asyncio.gather(
            _copy(process.stdout, out, sys.stdout.buffer),
            _copy(process.stderr, err, sys.stderr.buffer),
        )
        code = await process.wait()
    await hub.release()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(holder, 5.0)
    await hub.close()
    return status(code)


def _forward(process: asyncio.subprocess.Process, signum: int) -> None:
    """A signal to the member (a stop, a preemption notice) reaches the batch script."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)
