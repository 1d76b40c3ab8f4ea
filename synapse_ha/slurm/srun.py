"""``srun`` inside an sbatch job: a job step on the allocation's nodes, through the step
daemons (:mod:`synapse_ha.slurm.stepd`), never ssh.

    srun [-N NODES] [-n TASKS] [--ntasks-per-node K] [-w HOSTS] [-x HOSTS] [-l] [-K]
         [--export=ALL|NONE|VARS] [--gpus-per-task G] [-o FILE] [-e FILE] COMMAND [ARGS]...

The tasks' output comes back here (so into the batch script's output), ``-l`` prefixing
each line with its task's rank; ``-o``/``-e`` write it to files instead (Slurm's ``%j``
``%A`` ``%a`` ``%s`` ``%t`` ``%%`` patterns, :func:`output_path`). The exit status is
the highest of the tasks' (128+N for one killed by signal N). SIGINT and SIGTERM are
passed to the tasks. Options that only change how Slurm binds CPUs or GPUs
(``--cpu-bind``, ``--gpu-bind``, ``--accel-bind``, ``--mpi=none``, ``-u``,
``--overlap``, ``-c``) are accepted, and so are those that size an allocation (``-t``,
``--gres``, ``--mem``, ...: the step runs within what its allocation holds). Outside an
sbatch job (no ``$SYNAPSE_STEP_HUB``) it runs ``synctl srun``, which makes an allocation
of its own (:func:`allocation_options`) whose batch script is this ``srun`` and streams
its output back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from synapse_ha.slurm import wire
from synapse_ha.slurm.hostlist import HostListError, expand_all
from synapse_ha.slurm.ids import NOT_AN_ARRAY, fill_pattern


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="srun", allow_abbrev=True, add_help=True)
    p.add_argument("-N", "--nodes", type=int)
    p.add_argument("-n", "--ntasks", type=int)
    p.add_argument("--ntasks-per-node", "--tasks-per-node", type=int, dest="ntasks_per_node")
    p.add_argument("-w", "--nodelist", action="append", default=[])
    p.add_argument("-x", "--exclude", action="append", default=[])
    p.add_argument("-l", "--label", action="store_true")
    p.add_argument("-K", "--kill-on-bad-exit", nargs="?", const=1, type=int, default=0)
    p.add_argument("--export", default="ALL")
    p.add_argument("--gpus-per-task", type=int)
    p.add_argument("-o", "--output")
    p.add_argument("-e", "--error")
    p.add_argument("-D", "--chdir")
    p.add_argument("--jobid")
    p.add_argument("-J", "--job-name")
    p.add_argument("--mpi")
    p.add_argument("-c", "--cpus-per-task", type=int)
    p.add_argument("--wait", type=int)
    for flag in ("-u", "--unbuffered", "--overlap", "--exact"):
        p.add_argument(flag, action="store_true")
    for option in ("--cpu-bind", "--cpu_bind", "--gpu-bind", "--accel-bind", "--mem-bind"):
        p.add_argument(option)
    # What an allocation asks for: used when srun makes its own (outside an sbatch job),
    # accepted inside one (the step runs within what the allocation holds).
    for flags, _sbatch in ALLOCATION:
        p.add_argument(*flags)
    p.add_argument("--exclusive", nargs="?", const="")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


# srun's options that size an allocation, with the sbatch option each one is.
ALLOCATION: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-t", "--time"), "--time"),
    (("-p", "--partition"), "--partition"),
    (("--gres",), "--gres"),
    (("--gpus-per-node",), "--gpus-per-node"),
    (("-G", "--gpus"), "--gpus"),
    (("--mem",), "--mem"),
    (("--mem-per-cpu",), "--mem-per-cpu"),
    (("--mem-per-gpu",), "--mem-per-gpu"),
    (("-A", "--account"), "--account"),
    (("-C", "--constraint"), "--constraint"),
    (("-q", "--qos"), "--qos"),
)
_SIZES = (
    ("nodes", "--nodes"),
    ("ntasks", "--ntasks"),
    ("ntasks_per_node", "--ntasks-per-node"),
    ("cpus_per_task", "--cpus-per-task"),
    ("gpus_per_task", "--gpus-per-task"),
    ("job_name", "--job-name"),
    ("chdir", "--chdir"),
)


def allocation_options(args: argparse.Namespace) -> list[str]:
    """The sbatch options of the allocation ``srun`` makes outside an sbatch job: those
    its own options ask for (``-N``, ``-n``, ``-c``, ``-t``, ``--gres``, ``-w``, ...); the
    job is named after the command unless ``-J`` names it."""
    out = [f"{sbatch}={getattr(args, name)}" for name, sbatch in _SIZES if getattr(args, name)]
    for flags, sbatch in ALLOCATION:
        value = getattr(args, flags[-1].lstrip("-").replace("-", "_"))
        if value:
            out.append(f"{sbatch}={value}")
    for name in ("nodelist", "exclude"):
        if getattr(args, name):
            out.append(f"--{name}={','.join(getattr(args, name))}")
    if args.exclusive is not None:
        out.append(f"--exclusive={args.exclusive}" if args.exclusive else "--exclusive")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.job_name and command:
        out.append(f"--job-name={os.path.basename(command[0])}")
    return out


def exported(value: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables ``--export`` passes to the tasks (Slurm's forms: ALL, NONE, a list
    of VAR and VAR=value, with ALL or NONE first)."""
    items = [i for i in value.split(",") if i]
    out: dict[str, str] = dict(env) if not items or items[0] == "ALL" else {}
    for item in items:
        if item in ("ALL", "NONE"):
            continue
        name, eq, given = item.partition("=")
        if eq:
            out[name] = given
        elif name in env:
            out[name] = env[name]
    if not (items and items[0] == "ALL"):  # the job's own variables always go along
        out.update({k: v for k, v in env.items() if k.startswith(("SLURM_", "SYNAPSE_"))})
    return out


def request(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """The step request for the hub, from parsed options; raises ValueError."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ValueError("no command given")
    if args.mpi not in (None, "none"):
        raise ValueError(f"--mpi={args.mpi}: only none (start your own launcher in the tasks)")
    own = env.get("SLURM_JOB_ID", "")
    if args.jobid and args.jobid not in (own, own.removeprefix("job-").lstrip("0")):
        raise ValueError(f"--jobid {args.jobid}: a step runs only in its own job ({own})")
    try:
        nodelist = expand_all(args.nodelist)
        exclude = expand_all(args.exclude)
    except HostListError as exc:
        raise ValueError(f"host list {exc}") from None
    return {
        "op": "step",
        "argv": command,
        "nodes": args.nodes,
        "ntasks": args.ntasks,
        "ntasks_per_node": args.ntasks_per_node,
        "nodelist": nodelist,
        "exclude": exclude,
        "gpus_per_task": args.gpus_per_task,
        "cwd": args.chdir or os.getcwd(),
        "env": exported(args.export, env),
    }


def output_path(pattern: str, env: Mapping[str, str], step: int, task: int) -> str:
    """srun's ``-o``/``-e`` file name for one task: ``%j`` the job, ``%A`` its array
    (else the job), ``%a`` its index, ``%s`` the step, ``%t`` the task, ``%%``."""
    job_id = env.get("SLURM_JOB_ID", "")
    values = {
        "j": job_id,
        "J": job_id,
        "A": env.get("SLURM_ARRAY_JOB_ID", job_id),
        "a": env.get("SLURM_ARRAY_TASK_ID", NOT_AN_ARRAY),
        "s": str(step),
        "t": str(task),
    }
    return fill_pattern(pattern, values)


class _Output:
    """Where each task's output goes: here (with ``-l`` labels, whole lines), or files."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str]) -> None:
        self.label = args.label
        self.patterns: dict[int, str | None] = {1: args.output, 2: args.error or args.output}
        self.env = env
        self.partial: dict[tuple[int, int], bytes] = {}
        self.files: dict[str, IO[bytes]] = {}
        self.step = 0

    def write(self, task: int, fd: int, data: bytes) -> None:
        pattern = self.patterns[fd]
        if pattern:
            name = output_path(pattern, self.env, self.step, task)
            if name not in self.files:
                try:
                    if os.path.dirname(name):
                        os.makedirs(os.path.dirname(name), exist_ok=True)
                    self.files[name] = open(name, "ab")  # noqa: SIM115 (closed at the end)
                except OSError as exc:
                    print(f"srun: error: cannot open {name}: {exc.strerror}", file=sys.stderr)
                    self.patterns[fd] = None  # here instead
                    self.write(task, fd, data)
                    return
            self.files[name].write(data)
            self.files[name].flush()
            return
        stream = sys.stdout.buffer if fd == 1 else sys.stderr.buffer
        if not self.label:
            stream.write(data)
            stream.flush()
            return
        text = self.partial.pop((task, fd), b"") + data
        *lines, rest = text.split(b"\n")
        for line in lines:
            stream.write(f"{task}: ".encode() + line + b"\n")
        if rest:
            self.partial[(task, fd)] = rest
        stream.flush()

    def close(self) -> None:
        for (task, fd), rest in self.partial.items():
            stream = sys.stdout.buffer if fd == 1 else sys.stderr.buffer
            stream.write(f"{task}: ".encode() + rest + b"\n")
        for f in self.files.values():
            f.close()


async def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    hub = env.get(wire.HUB_ENV, "")
    secret = env.get(wire.SECRET_ENV, "")
    token = env.get("SYNAPSE_FENCING_TOKEN", "")
    if not hub or not secret or not token.isdigit():
        print(
            "srun: error: not inside an sbatch job's allocation (no $SYNAPSE_STEP_HUB)",
            file=sys.stderr,
        )
        return 1
    try:
        ask = request(args, env)
    except ValueError as exc:
        print(f"srun: error: {exc}", file=sys.stderr)
        return 2
    host, _, port = hub.rpartition(":")
    try:
        channel = await wire.connect(host, int(port))
        await channel.hello(secret.encode(), "srun", int(token), 0)
    except (OSError, wire.WireError, TimeoutError) as exc:
        print(f"srun: error: cannot reach the job's step daemon at {hub}: {exc}", file=sys.stderr)
        return 1
    out = _Output(args, env)
    loop = asyncio.get_running_loop()
    signalled: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, signalled.append, signum)
    try:
        await channel.send(ask)
        return await _relay(channel, out, signalled, args.kill_on_bad_exit)
    except wire.WireError as exc:
        print(f"srun: error: the job's step daemon went away: {exc}", file=sys.stderr)
        return 1
    finally:
        out.close()
        channel.close()


async def _relay(
    channel: wire.Channel, out: _Output, signalled: list[int], kill_on_bad: int
) -> int:
    sent_signals = 0
    killed = False
    while True:
        receiving = asyncio.ensure_future(channel.receive())
        while not receiving.done():
            await asyncio.wait({receiving}, timeout=0.1)
            while sent_signals < len(signalled):
                await channel.send({"op": "signal", "signal": int(signalled[sent_signals])})
                sent_signals += 1
        message = receiving.result()
        op = message.get("op")
        if op == "error":
            print(f"srun: error: {message.get('message')}", file=sys.stderr)
            return 1
        if op == "started":
            out.step = int(message["step"])
        elif op == "out":
            out.write(int(message["task"]), int(message.get("fd", 1)), wire.decode(message["data"]))
        elif op == "exit":
            code = int(message["code"])
            if message.get("lost"):
                print(f"srun: error: task {message['task']}: its node was lost", file=sys.stderr)
            elif code != 0:
                print(
                    f"srun: error: task {message['task']}: exited with exit code {code}",
                    file=sys.stderr,
                )
            if code != 0 and kill_on_bad and not killed:
                killed = True
                await channel.send({"op": "signal", "signal": int(signal.SIGKILL)})
        elif op == "end":
            return int(message["code"])


def main(argv: Sequence[str] | None = None) -> None:
    words = sys.argv[1:] if argv is None else list(argv)
    if wire.HUB_ENV not in os.environ:  # no allocation: synctl's srun makes one
        python = sys.executable
        os.execv(python, [python, "-m", "synapse_ha.cli", "srun", *words])
    args = parser().parse_args(words)
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(run(args, os.environ)))
    sys.exit(130)


if __name__ == "__main__":
    main()
