"""Where a job step's tasks run: Slurm's rules for ``srun -N/-n/--ntasks-per-node/-w/-x``
inside an allocation, as a pure function.

The allocation is the job's nodes in rank order (a node is a member: two members on one
host are two nodes). A step uses the first ``-N`` nodes that ``-w`` names and ``-x`` does
not exclude (every node by default; with ``-n`` alone, as many as the tasks need, at
most every node). Its task count is ``-n``, else ``--ntasks-per-node`` (the step's, else
the allocation's) times its nodes. Tasks are numbered in block order: node by node, each
node holding ``ceil`` or ``floor`` of tasks/nodes, the larger shares first, as Slurm's
default distribution does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class StepRefused(ValueError):
    """A step the allocation cannot hold, with the option at fault."""


@dataclass(frozen=True, slots=True)
class StepAsk:
    """What ``srun`` asked for (None: not given)."""

    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Task:
    """One task: its rank in the step (``SLURM_PROCID``), the allocation node it runs on
    and its index among the step's tasks there (``SLURM_LOCALID``)."""

    rank: int
    node: int
    local: int


def plan(hosts: Sequence[str], tasks_per_node: int, ask: StepAsk) -> list[Task]:
    """The tasks of a step ``ask`` on the allocation ``hosts`` (rank order) whose batch
    options gave ``tasks_per_node``; raises :class:`StepRefused`."""
    for name, value in (
        ("-N", ask.nodes),
        ("-n", ask.ntasks),
        ("--ntasks-per-node", ask.ntasks_per_node),
    ):
        if value is not None and value < 1:
            raise StepRefused(f"{name} {value}: give 1 or more")
    candidates = [i for i, host in enumerate(hosts) if host not in ask.exclude]
    named = _named(hosts, candidates, ask.nodelist)
    count = ask.nodes
    if count is None:
        count = len(named) if named else len(candidates)
        if ask.ntasks is not None and not named and ask.ntasks_per_node is None:
            count = min(count, ask.ntasks)
    if count > len(candidates):
        raise StepRefused(
            f"-N {count}: the allocation has {len(candidates)} node(s) this step may use"
        )
    if count < len(named):
        raise StepRefused(f"-N {count}: -w names {len(named)} nodes")
    chosen = sorted(named + [i for i in candidates if i not in named][: count - len(named)])
    per_node = ask.ntasks_per_node or tasks_per_node
    ntasks = ask.ntasks if ask.ntasks is not None else per_node * count
    if ntasks < count:
        raise StepRefused(f"-n {ntasks}: fewer tasks than the step's {count} node(s)")
    if ask.ntasks_per_node is not None and ntasks > ask.ntasks_per_node * count:
        raise StepRefused(
            f"-n {ntasks}: more than --ntasks-per-node {ask.ntasks_per_node} on {count} node(s)"
        )
    base, extra = divmod(ntasks, count)
    tasks: list[Task] = []
    for k, node in enumerate(chosen):
        for local in range(base + (1 if k < extra else 0)):
            tasks.append(Task(len(tasks), node, local))
    return tasks


def _named(hosts: Sequence[str], candidates: list[int], nodelist: Sequence[str]) -> list[int]:
    """The allocation nodes ``-w`` names: for each name, the first node of that host not
    named yet (a host holding two members is two nodes)."""
    out: list[int] = []
    for name in nodelist:
        free = [i for i in candidates if hosts[i] == name and i not in out]
        if not free:
            raise StepRefused(f"-w {name}: not a node of this allocation (or named too often)")
        out.append(free[0])
    return out


def tasks_per_node_text(tasks: Sequence[Task]) -> str:
    """``SLURM_TASKS_PER_NODE``: counts in node order, runs written ``N(xK)``."""
    counts: list[int] = []
    last = None
    for task in tasks:
        if task.node != last:
            counts.append(0)
            last = task.node
        counts[-1] += 1
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(out)
