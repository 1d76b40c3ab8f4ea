"""A holder: on every node of an allocation, runs the tasks of job steps the hub hands it,
as children of its member (so they are stopped and fenced with it), and sends back their
output and exit statuses (docs/slurm.md, "Job steps")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from synapse_ha.slurm import wire
from synapse_ha.slurm.commands import write_commands
from synapse_ha.slurm.member import Member

RECONNECT_S = 0.5
CHUNK = 64 * 1024
# What a task takes from its own node's member rather than from srun's environment.
# What a task takes from its own node's member rather than from srun's environment.
NODE_LOCAL = (
    "CUDA_VISIBLE_DEVICES",
    "SYNAPSE_CHECKPOINT_FILE",
    "SYNAPSE_PREEMPT_FILE",
    "SYNAPSE_PROGRESS_FILE",
    "TMPDIR",
    "HOSTNAME",
)


class Holder:
    """Runs the tasks the hub hands this node (module docstring)."""

    def __init__(self, member: Member) -> None:
        self.member = member
        self.tasks: dict[tuple[int, int], asyncio.subprocess.Process] = {}
        # Steps killed (srun -K, a cancel): a task of one that starts after the kill is
        # killed as it starts, not left to run.
        self.killed: set[int] = set()
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
        if step in self.killed:  # the kill came while it was being started
            signal_tree(process.pid, signal.SIGKILL)
        assert process.stdout is not None and process.stderr is not None
        await asyncio.gather(
            _pump(channel, process.stdout, step, task, 1),
            _pump(channel, process.stderr, step, task, 2),
        )
        code = await process.wait()
        self.tasks.pop((step, task), None)
        await ended(status(code))

    def _signal(self, step: int, signum: int) -> None:
        if signum == signal.SIGKILL:
            self.killed.add(step)
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


def status(returncode: int) -> int:
    """An exit status as a shell gives it: 128+N for a process killed by signal N."""
    return returncode if returncode >= 0 else 128 - returncode
