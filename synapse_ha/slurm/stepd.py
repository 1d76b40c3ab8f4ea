"""The step daemon: what every member of an sbatch job runs (docs/slurm.md, "Job steps").

An sbatch job is an allocation: a gang of nodes, one member each. Every member runs this
program as its command, as the job's owner, under the member's supervision and fencing:

* **The holder** (every member) keeps a connection to the hub on the first node and runs
  the tasks of job steps there: each task is a child process of the member, so when the
  member is stopped or fenced its tasks go with it, and a step can never outlive its
  attempt. Output and exit statuses go back to the hub. The holder exits 0 only when the
  hub says the batch script ended well; a lost connection kills its tasks (their step
  counts them lost) and it connects again.
* **The hub** (rank 0) listens on the attempt's step port (:func:`wire.step_port`) for
  holders and for ``srun`` (:mod:`synapse_ha.slurm.srun`), places each step's tasks
  (:func:`synapse_ha.slurm.plan.plan`), hands them to the holders and relays what they
  say to that ``srun``. Every connection proves the job's step secret first
  (:mod:`synapse_ha.slurm.wire`); one from another attempt is refused.
* **The batch script** (rank 0) runs once, with the batch step's ``SLURM_*`` variables
  and ``srun`` and ``scontrol`` first on its ``PATH``; its output is the member's. When
  it exits the hub releases the holders (so the other members exit 0 when it succeeded)
  and the member exits with the script's status: the job's result.

    python -m synapse_ha.slurm.stepd [--ntasks N] [--tasks-per-node K] -- COMMAND...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synapse_ha.slurm import wire
from synapse_ha.slurm.plan import StepAsk, StepRefused, Task, plan, tasks_per_node_text

HUB_ENV = "SYNAPSE_STEP_HUB"  # host:port of the hub, for srun
HOLDERS_WAIT_S = 120.0  # how long a step waits for the holders of its nodes to connect
RECONNECT_S = 0.5
CHUNK = 64 * 1024
# What a task takes from its own node's member rather than from srun's environment.
NODE_LOCAL = (
    "CUDA_VISIBLE_DEVICES",
    "SYNAPSE_CHECKPOINT_FILE",
    "SYNAPSE_PREEMPT_FILE",
    "SYNAPSE_PROGRESS_FILE",
    "TMPDIR",
    "HOSTNAME",
)
SLURM_COMMANDS = ("srun", "scontrol")


@dataclass(frozen=True, slots=True)
class Member:
    """This member as its environment describes it (DESIGN §5's variables)."""

    job_id: str
    rank: int
    hosts: tuple[str, ...]
    token: int
    hub: tuple[str, int]
    secret: bytes

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Member:
        try:
            hosts = tuple(h for h in env["SYNAPSE_MEMBER_HOSTS"].split(",") if h)
            port = wire.step_port(int(env["MASTER_PORT"]))
            return cls(
                job_id=env["SYNAPSE_JOB_ID"],
                rank=int(env["RANK"]),
                hosts=hosts,
                token=int(env["SYNAPSE_FENCING_TOKEN"]),
                hub=(hosts[0] if hosts else env["MASTER_ADDR"], port),
                secret=env[wire.SECRET_ENV].encode(),
            )
        except (KeyError, ValueError, IndexError) as exc:
            raise SystemExit(f"stepd: not run as a member of an sbatch job ({exc})") from None


# ------------------------------------------------------------------------ the hub


@dataclass
class _Step:
    number: int
    tasks: list[Task]
    srun: wire.Channel
    left: set[int] = field(default_factory=set)  # tasks not exited yet
    worst: int = 0


class Hub:
    """The first node's step server (module docstring)."""

    def __init__(self, member: Member, tasks_per_node: int) -> None:
        self.member = member
        self.tasks_per_node = tasks_per_node
        self.holders: dict[int, wire.Channel] = {}
        self.arrived = asyncio.Condition()
        self.steps: dict[int, _Step] = {}
        self.next_step = 0
        self.server: asyncio.Server | None = None
        self.channels: set[wire.Channel] = set()
        self.handlers: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._accept, host=None, port=self.member.hub[1], limit=wire.MAX_LINE
        )

    async def release(self) -> None:
        """The batch script ended: tell every holder it may exit."""
        for channel in list(self.holders.values()):
            with contextlib.suppress(Exception):
                await channel.send({"op": "done"})

    async def close(self) -> None:
        """Stop listening and end every connection, each handler to its end (a handler
        cancelled by the loop's shutdown would be reported as an error)."""
        if self.server is not None:
            self.server.close()
        for channel in list(self.channels):
            channel.close()
        if self.handlers:
            await asyncio.wait(list(self.handlers), timeout=5.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = wire.Channel(reader, writer)
        me = asyncio.current_task()
        if me is not None:
            self.handlers.add(me)
            me.add_done_callback(self.handlers.discard)
        self.channels.add(channel)
        try:
            peer = await channel.hello(self.member.secret, "hub", self.member.token, 0)
            if peer.role == "holder":
                await self._holder(channel, peer.rank)
            elif peer.role == "srun":
                await self._srun(channel)
        except (wire.WireError, TimeoutError, OSError, KeyError, TypeError, ValueError):
            pass  # a peer that broke the protocol, or went away: its connection ends
        finally:
            self.channels.discard(channel)
            channel.close()

    async def _holder(self, channel: wire.Channel, rank: int) -> None:
        if not 0 <= rank < len(self.member.hosts):
            return
        async with self.arrived:
            self.holders[rank] = channel
            self.arrived.notify_all()
        try:
            while True:
                message = await channel.receive()
                step = self.steps.get(int(message.get("step", -1)))
                if step is None:
                    continue
                if message.get("op") == "exit":
                    await self._task_exited(step, int(message["task"]), int(message["code"]))
                else:
                    with contextlib.suppress(Exception):
                        await step.srun.send(message)
        finally:
            if self.holders.get(rank) is channel:
                del self.holders[rank]
            for step in list(self.steps.values()):  # its tasks are lost with it
                for task in step.tasks:
                    if task.node == rank and task.rank in step.left:
                        await self._task_exited(step, task.rank, 255, lost=True)

    async def _task_exited(self, step: _Step, task: int, code: int, lost: bool = False) -> None:
        if task not in step.left:
            return
        step.left.discard(task)
        step.worst = max(step.worst, code)
        with contextlib.suppress(Exception):
            await step.srun.send({"op": "exit", "task": task, "code": code, "lost": lost})
        if not step.left:
            self.steps.pop(step.number, None)
            with contextlib.suppress(Exception):
                await step.srun.send({"op": "end", "code": step.worst})

    async def _srun(self, channel: wire.Channel) -> None:
        request = await channel.receive()
        try:
            tasks = plan(self.member.hosts, self.tasks_per_node, _ask(request))
            await self._wait_for_holders({t.node for t in tasks})
        except StepRefused as refused:
            await channel.send({"op": "error", "message": str(refused)})
            return
        number, self.next_step = self.next_step, self.next_step + 1
        step = _Step(number, tasks, channel, left={t.rank for t in tasks})
        self.steps[number] = step
        nodes = sorted({t.node for t in tasks})
        await channel.send({"op": "started", "step": number, "tasks": len(tasks), "nodes": nodes})
        shared = _step_env(request, self.member, number, tasks)
        for task in tasks:
            run = {
                "op": "run",
                "step": number,
                "task": task.rank,
                "local": task.local,
                "argv": request["argv"],
                "cwd": request.get("cwd") or None,
                "env": {**shared, **_task_env(task, nodes)},
                "gpus_per_task": request.get("gpus_per_task"),
            }
            holder = self.holders.get(task.node)
            if holder is None:
                await self._task_exited(step, task.rank, 255, lost=True)
                continue
            try:
                await holder.send(run)
            except (OSError, ConnectionError):
                await self._task_exited(step, task.rank, 255, lost=True)
        try:
            while step.number in self.steps:  # srun may signal the step meanwhile
                message = await channel.receive()
                if message.get("op") == "signal":
                    await self._signal(step, int(message.get("signal", signal.SIGTERM)))
        except wire.WireError:  # srun went away: its step ends with it
            await self._signal(step, signal.SIGKILL)

    async def _signal(self, step: _Step, signum: int) -> None:
        for node in {t.node for t in step.tasks}:
            holder = self.holders.get(node)
            if holder is not None:
                with contextlib.suppress(Exception):
                    await holder.send({"op": "signal", "step": step.number, "signal": signum})

    async def _wait_for_holders(self, nodes: set[int]) -> None:
        async def all_here() -> None:
            async with self.arrived:
                await self.arrived.wait_for(lambda: nodes <= set(self.holders))

        try:
            await asyncio.wait_for(all_here(), HOLDERS_WAIT_S)
        except TimeoutError:
            missing = sorted(nodes - set(self.holders))
            raise StepRefused(
                f"the step daemons of node(s) {missing} did not connect in {HOLDERS_WAIT_S:.0f} s"
            ) from None


def _ask(request: Mapping[str, Any]) -> StepAsk:
    def number(key: str) -> int | None:
        value = request.get(key)
        return None if value is None else int(value)

    argv = request.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise StepRefused("no command given")
    return StepAsk(
        nodes=number("nodes"),
        ntasks=number("ntasks"),
        ntasks_per_node=number("ntasks_per_node"),
        nodelist=tuple(request.get("nodelist") or ()),
        exclude=tuple(request.get("exclude") or ()),
    )


def _step_env(
    request: Mapping[str, Any], member: Member, number: int, tasks: Sequence[Task]
) -> dict[str, str]:
    """What every task of the step sees besides its own rank: srun's exported
    environment, then the step's Slurm variables."""
    env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
    nodes = sorted({t.node for t in tasks})
    hosts = ",".join(member.hosts[n] for n in nodes)
    env.update(
        {
            "SLURM_STEP_ID": str(number),
            "SLURM_STEPID": str(number),
            "SLURM_NTASKS": str(len(tasks)),
            "SLURM_NPROCS": str(len(tasks)),
            "SLURM_STEP_NUM_TASKS": str(len(tasks)),
            "SLURM_NNODES": str(len(nodes)),
            "SLURM_STEP_NUM_NODES": str(len(nodes)),
            "SLURM_STEP_NODELIST": hosts,
            "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text(tasks),
            "SLURM_TASKS_PER_NODE": tasks_per_node_text(tasks),
            "WORLD_SIZE": str(len(tasks)),
        }
    )
    return env


def _task_env(task: Task, nodes: Sequence[int]) -> dict[str, str]:
    return {
        "SLURM_PROCID": str(task.rank),
        "SLURM_LOCALID": str(task.local),
        "SLURM_NODEID": str(nodes.index(task.node)),
        "RANK": str(task.rank),
        "LOCAL_RANK": str(task.local),
        "NODE_RANK": str(nodes.index(task.node)),
    }


# --------------------------------------------------------------------- the holder


class Holder:
    """Runs the tasks the hub hands this node (module docstring)."""

    def __init__(self, member: Member) -> None:
        self.member = member
        self.tasks: dict[tuple[int, int], asyncio.subprocess.Process] = {}
        self.bin_dir = ""  # this node's srun and scontrol, first on its tasks' PATH

    async def run(self) -> None:
        """Serve the hub until it releases this holder."""
        with tempfile.TemporaryDirectory(prefix="synapse-slurm-") as bin_dir:
            write_commands(Path(bin_dir), sys.executable)
            self.bin_dir = bin_dir
            await self._run()

    async def _run(self) -> None:
        while True:
            try:
                channel = await wire.connect(*self.member.hub)
            except OSError:
                await asyncio.sleep(RECONNECT_S)
                continue
            try:
                await channel.hello(
                    self.member.secret, "holder", self.member.token, self.member.rank
                )
                if await self._serve(channel):
                    return
            except (wire.WireError, TimeoutError, OSError, KeyError, TypeError, ValueError) as exc:
                print(f"stepd: the connection to the step hub ended: {exc}", file=sys.stderr)
            finally:
                channel.close()
                self._kill_all()
            await asyncio.sleep(RECONNECT_S)

    async def _serve(self, channel: wire.Channel) -> bool:
        running: set[asyncio.Task[None]] = set()
        while True:
            message = await channel.receive()
            op = message.get("op")
            if op == "done":
                return True
            if op == "signal":
                self._signal(int(message["step"]), int(message["signal"]))
            elif op == "run":
                job = asyncio.ensure_future(self._task(channel, message))
                running.add(job)
                job.add_done_callback(running.discard)

    async def _task(self, channel: wire.Channel, run: Mapping[str, Any]) -> None:
        step, task = int(run["step"]), int(run["task"])

        async def ended(code: int, why: str = "") -> None:
            if why:
                text = f"srun: error: {why}\n".encode()
                await channel.send(
                    {"op": "out", "step": step, "task": task, "fd": 2, "data": wire.encode(text)}
                )
            await channel.send({"op": "exit", "step": step, "task": task, "code": code})

        env = task_environment(os.environ, run["env"], run.get("gpus_per_task"), int(run["local"]))
        if not isinstance(env, str) and self.bin_dir:
            env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
        if isinstance(env, str):
            await ended(1, env)
            return
        try:
            process = await asyncio.create_subprocess_exec(
                *run["argv"],
                env=env,
                cwd=run.get("cwd"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            await ended(127 if exc.errno == 2 else 126, f"{run['argv'][0]}: {exc.strerror}")
            return
        self.tasks[(step, task)] = process
        assert process.stdout is not None and process.stderr is not None
        await asyncio.gather(
            _pump(channel, process.stdout, step, task, 1),
            _pump(channel, process.stderr, step, task, 2),
        )
        code = await process.wait()
        self.tasks.pop((step, task), None)
        await ended(status(code))

    def _signal(self, step: int, signum: int) -> None:
        for (s, _task), process in list(self.tasks.items()):
            if s == step:
                signal_tree(process.pid, signum)

    def _kill_all(self) -> None:
        for process in list(self.tasks.values()):
            signal_tree(process.pid, signal.SIGKILL)
        self.tasks.clear()


def signal_tree(pid: int, signum: int) -> None:
    """Signal a task and every process it started. Tasks stay in the member's process
    group (so that the member's stop or fencing takes them too), so a step's tasks are
    told apart by descent: ``/proc/PID/task/*/children``, read before the signal."""
    for each in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signum)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 100_000:
        parent = todo.pop()
        for path in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in path.read_text().split()]
                found.extend(children)
                todo.extend(children)
    return found


async def _pump(
    channel: wire.Channel, stream: asyncio.StreamReader, step: int, task: int, fd: int
) -> None:
    while chunk := await stream.read(CHUNK):
        await channel.send(
            {"op": "out", "step": step, "task": task, "fd": fd, "data": wire.encode(chunk)}
        )


def task_environment(
    node_env: Mapping[str, str], step_env: Mapping[str, str], gpus_per_task: int | None, local: int
) -> dict[str, str] | str:
    """A task's environment: the step's (srun's exported variables and the Slurm ones),
    with what belongs to this node taken from its member (its GPUs, its files), and with
    ``gpus_per_task`` the task's own share of the node's GPUs. A reason instead when the
    node has too few GPUs for it."""
    env = dict(step_env)
    for key in NODE_LOCAL:
        if key in node_env:
            env[key] = node_env[key]
        else:
            env.pop(key, None)
    gpus = [g for g in node_env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    if gpus_per_task:
        mine = gpus[local * gpus_per_task : (local + 1) * gpus_per_task]
        if len(mine) < gpus_per_task:
            return f"task {local} here needs {gpus_per_task} GPU(s) of the node's {len(gpus)}"
        gpus = mine
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    env["SLURM_GPUS_ON_NODE"] = str(len(gpus))
    return env


# --------------------------------------------------------------- the batch script


def batch_environment(
    env: Mapping[str, str], member: Member, ntasks: int, tasks_per_node: int, bin_dir: str
) -> dict[str, str]:
    """The batch script's environment: the member's, the batch step's Slurm variables,
    and ``srun``/``scontrol`` first on its PATH."""
    out = dict(env)
    nodes = len(member.hosts)
    out.update(
        {
            "SLURM_JOB_ID": member.job_id,
            "SLURM_JOBID": member.job_id,
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
            "SLURM_CPUS_PER_TASK": env.get("SYNAPSE_SBATCH_CPUS", "0"),
            "SLURM_GPUS_ON_NODE": str(
                len([g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g])
            ),
            HUB_ENV: f"{member.hub[0]}:{member.hub[1]}",
            "PATH": f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
        }
    )
    return out


def write_commands(bin_dir: Path, python: str) -> None:
    """``srun`` and ``scontrol`` in ``bin_dir``: this interpreter running ours."""
    modules = {"srun": "synapse_ha.slurm.srun", "scontrol": "synapse_ha.cli.scontrol"}
    for name in SLURM_COMMANDS:
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{python}" -m {modules[name]} "$@"\n')
        path.chmod(0o700)


async def _batch(member: Member, command: Sequence[str], ntasks: int, tasks_per_node: int) -> int:
    hub = Hub(member, tasks_per_node)
    try:
        await hub.start()
    except OSError as exc:
        print(f"stepd: cannot listen for job steps on port {member.hub[1]}: {exc}", file=sys.stderr)
        return 1
    holder = asyncio.ensure_future(Holder(member).run())
    with tempfile.TemporaryDirectory(prefix="synapse-slurm-") as bin_dir:
        write_commands(Path(bin_dir), sys.executable)
        env = batch_environment(os.environ, member, ntasks, tasks_per_node, bin_dir)
        process = await asyncio.create_subprocess_exec(*command, env=env)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            loop.add_signal_handler(signum, _forward, process, signum)
        code = await process.wait()
    await hub.release()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(holder, 5.0)
    await hub.close()
    return status(code)


def status(returncode: int) -> int:
    """An exit status as a shell gives it: 128+N for a process killed by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def _forward(process: asyncio.subprocess.Process, signum: int) -> None:
    """A signal to the member (a stop, a preemption notice) reaches the batch script."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="stepd", description=__doc__.splitlines()[0])
    parser.add_argument("--ntasks", type=int, default=0, help="the allocation's tasks")
    parser.add_argument("--tasks-per-node", type=int, default=1)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    member = Member.from_env(os.environ)
    if member.rank != 0:
        asyncio.run(Holder(member).run())
        sys.exit(0)
    if not command:
        parser.error("the batch command is missing after --")
    ntasks = args.ntasks or args.tasks_per_node * len(member.hosts)
    sys.exit(asyncio.run(_batch(member, command, ntasks, args.tasks_per_node)))


if __name__ == "__main__":
    main()
