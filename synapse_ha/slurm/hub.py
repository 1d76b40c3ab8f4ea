"""The step hub on an allocation's first node: holders and ``srun`` connect to it; it
places each step's tasks (:func:`synapse_ha.slurm.plan.plan`), hands them to the holders
and relays what they say to that step's ``srun`` (docs/slurm.md, "Job steps")."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synapse_ha.slurm import wire
from synapse_ha.slurm.member import Member
from synapse_ha.slurm.plan import StepAsk, StepRefused, Task, plan, tasks_per_node_text

HOLDERS_WAIT_S = 120.0  # how long a step waits for the holders of its nodes to connect


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

    async def signal_steps(self, signum: int) -> None:
        """Signal every running step's tasks (sbatch ``--signal`` without ``B:``)."""
        for step in list(self.steps.values()):
            await self._signal(step, signum)

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
