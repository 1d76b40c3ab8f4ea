"""The free-capacity table of one pass, the views planning reads it through, and the
cache that keeps it between passes.

**Cost.** The free-capacity table can be kept between passes in a ``CapacityCache`` that
the planner owns, and is then brought up to date from the nodes whose allocation changed
(see ``CachedTable``); a pass's own changes are journalled and undone. Searches skip
domains whose free GPUs cannot hold the gang, and the reservation search tries a
placement only when a release may have made room. A pass also keeps, per gang shape and
table version, the answers that changed nothing (no room, no reservation, why it waits:
``answers.Answers``), so a long queue of alike gangs costs one search per shape. None of
this changes a plan: ``schedule`` without a cache or without recall works everything out
afresh, and tests compare them.
"""

from __future__ import annotations

import itertools
import operator
from bisect import bisect_left, insort
from dataclasses import dataclass
from itertools import compress

from synapse_ha.core.health.fitness import unhealthy_gpus
from synapse_ha.core.model import FEATURE_IMAGES, ClusterState, Node, Resources, topology_path
from synapse_ha.core.spares import NONE, spare_nodes

Domain = tuple[str, ...]
UNLIMITED = 1 << 40


@dataclass(slots=True)
class NodeFree:
    node_id: str
    path: Domain
    pos: int  # position in topology-path order
    cpu: int
    mem: int
    gpu: int
    islands: list[list[int]]  # free GPU indices per NVLink island, each sorted
    island_of: dict[int, int]  # GPU index -> island position
    images: bool
    domains: tuple[Domain, ...]  # the path's prefixes above the host, cluster first

    def slots(self, req: Resources, cap: int) -> int:
        """How many members of ``req`` fit here, at most ``cap``."""
        n = cap
        if req.gpu:
            k = self.gpu // req.gpu
            if k < n:
                n = k
        if req.cpu_milli:
            k = self.cpu // req.cpu_milli
            if k < n:
                n = k
        if req.memory_mib:
            k = self.mem // req.memory_mib
            if k < n:
                n = k
        return n if n > 0 else 0


def _node_free(node: Node, path: Domain, pos: int, empty: bool = False) -> NodeFree:
    """A node's free capacity; with ``empty``, as if nothing were bound to it."""
    free = node.info.capacity if empty else node.free
    used: set[int] = set() if empty else node.allocated_gpus
    if node.gpu_faults:  # never offered, even as if the node were empty
        sick = unhealthy_gpus(node.gpu_faults)
        used = used | sick
        if empty:
            free = Resources(free.cpu_milli, free.memory_mib, free.gpu - len(sick))
    islands = [[g for g in island if g not in used] for island in node.info.gpu_islands]
    return NodeFree(
        node_id=node.node_id,
        path=path,
        pos=pos,
        cpu=free.cpu_milli,
        mem=free.memory_mib,
        gpu=free.gpu,
        islands=islands,
        island_of={g: i for i, island in enumerate(node.info.gpu_islands) for g in island},
        images=FEATURE_IMAGES in node.info.features,
        domains=tuple(path[:depth] for depth in range(len(path))),
    )


class Table:
    """Free capacity of every schedulable node but the hot spares (``spares``, left out
    of normal placement: core/spares.py), shared by the views of one pass.

    Its indexes (nodes in path order, domain membership, nodes by free GPU count in path
    order) depend only on the nodes' current free capacity, never on the order in which
    changes arrived, so an updated table equals a freshly built one. Changes made during
    a pass are journalled and undone at its end (``mark``/``undo``).

    ``version`` names the table's content: every change gives it a number never used
    before, and an undo gives back the number the content had at the mark. Equal
    versions of one table therefore mean equal free capacity, so a pass may keep what it
    worked out on a version (a gang that found no room) until the version changes.
    """

    def __init__(self, levels: int) -> None:
        self.levels = levels  # number of topology levels above the host
        self.nodes: dict[str, NodeFree] = {}
        self.at: list[NodeFree] = []  # by position (topology-path order)
        self.members: dict[Domain, list[str]] = {}  # domain -> node ids, in path order
        self.first: dict[Domain, int] = {}  # domain -> position of its first node
        self.domains: list[list[Domain]] = [[] for _ in range(levels + 1)]  # by depth
        self.by_free_gpu: dict[int, list[int]] = {}  # free GPUs -> sorted positions
        self.views: list[View] = []  # views kept in step with every change
        # (node id, request, GPUs, sign, the version before the change)
        self.journal: list[tuple[str, Resources, tuple[int, ...], int, int]] = []
        self.version = 0
        self._versions = itertools.count(1)
        self.spares: frozenset[str] = NONE  # the spares left out

    @classmethod
    def build(
        cls, state: ClusterState, empty: bool = False, spares: frozenset[str] = NONE
    ) -> Table:
        """The table of ``state``'s schedulable nodes but ``spares``; with ``empty``, as
        if no gang held any capacity."""
        levels = state.config.topology_levels
        table = cls(len(levels))
        table.spares = spares
        ready = [
            (topology_path(node.info, levels), node)
            for node in state.nodes.values()
            if node.schedulable() and node.node_id not in spares
        ]
        ready.sort(key=lambda item: item[0])
        for pos, (path, node) in enumerate(ready):
            n = _node_free(node, path, pos, empty)
            table.nodes[n.node_id] = n
            table.at.append(n)
            for depth in range(table.levels + 1):
                domain = path[:depth]
                members = table.members.get(domain)
                if members is None:
                    members = table.members[domain] = []
                    table.domains[depth].append(domain)
                    table.first[domain] = pos
                members.append(n.node_id)
            table.by_free_gpu.setdefault(n.gpu, []).append(pos)
        return table

    def _move(self, n: NodeFree, gpu: int) -> None:
        """Give ``n`` a new free GPU count, keeping every index and view in step."""
        bucket = self.by_free_gpu[n.gpu]
        del bucket[bisect_left(bucket, n.pos)]
        if not bucket:
            del self.by_free_gpu[n.gpu]
        insort(self.by_free_gpu.setdefault(gpu, []), n.pos)
        for view in self.views:
            if n.node_id not in view.excluded:
                view.move_hist(n.domains, n.gpu, gpu)
        n.gpu = gpu

    def set_free(self, node: Node) -> None:
        """Take a node's free capacity from the state (outside a pass; not journalled)."""
        n = self.nodes[node.node_id]
        fresh = _node_free(node, n.path, n.pos)
        for view in self.views:
            if n.node_id not in view.excluded:
                view.add_totals(n.domains, fresh.gpu - n.gpu, fresh.cpu - n.cpu, fresh.mem - n.mem)
        self._move(n, fresh.gpu)
        n.cpu, n.mem, n.islands = fresh.cpu, fresh.mem, fresh.islands
        self.version = next(self._versions)

    def adjust(self, node_id: str, req: Resources, gpus: tuple[int, ...], sign: int) -> None:
        """Take (sign -1) or give back (sign +1) ``req`` and ``gpus`` on a node."""
        n = self.nodes.get(node_id)
        if n is None:
            return
        self.journal.append((node_id, req, gpus, sign, self.version))
        self._change(n, req, gpus, sign)

    def _change(self, n: NodeFree, req: Resources, gpus: tuple[int, ...], sign: int) -> None:
        node_id = n.node_id
        for view in self.views:
            if node_id not in view.excluded:
                view.add_totals(
                    n.domains, sign * req.gpu, sign * req.cpu_milli, sign * req.memory_mib
                )
        self._move(n, n.gpu + sign * req.gpu)
        n.cpu += sign * req.cpu_milli
        n.mem += sign * req.memory_mib
        if sign < 0:
            taken = set(gpus)
            for island in n.islands:
                island[:] = [g for g in island if g not in taken]
        else:
            for gpu in gpus:
                island = n.islands[n.island_of[gpu]]
                island.append(gpu)
                island.sort()
        self.version = next(self._versions)

    def mark(self) -> int:
        return len(self.journal)

    def undo(self, mark: int) -> None:
        """Revert every change since ``mark``, newest first (islands stay sorted, so the
        result equals the table before the changes, and has its version)."""
        while len(self.journal) > mark:
            node_id, req, gpus, sign, before = self.journal.pop()
            self._change(self.nodes[node_id], req, gpus, -sign)
            self.version = before


class View:
    """The table seen without some nodes (``excluded``), with per-domain free totals
    and, per domain, how many nodes have each free GPU count."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.levels = table.levels
        self.nodes = table.nodes
        self.members = table.members
        self.by_free_gpu = table.by_free_gpu
        self.excluded: frozenset[str] = frozenset()
        self.totals: dict[Domain, list[int]] = {}  # domain -> [gpu, cpu, mem]
        self.hist: dict[Domain, dict[int, int]] = {}  # domain -> {free GPUs: nodes}
        self.at_depth: dict[int, list[Domain]] = {}  # domains_at, once asked
        for n in table.at:
            self._count(n, +1)
        table.views.append(self)

    def _count(self, n: NodeFree, sign: int) -> None:
        for depth in range(self.levels + 1):
            domain = n.path[:depth]
            t = self.totals.get(domain)
            if t is None:
                t = self.totals[domain] = [0, 0, 0]
                self.hist[domain] = {}
            t[0] += sign * n.gpu
            t[1] += sign * n.cpu
            t[2] += sign * n.mem
            h = self.hist[domain]
            left = h.get(n.gpu, 0) + sign
            if left:
                h[n.gpu] = left
            else:
                del h[n.gpu]
            if sign < 0 and not h:  # no node of this view left in the domain
                del self.totals[domain], self.hist[domain]

    def without(self, excluded: frozenset[str]) -> View:
        """This view without ``excluded`` nodes, kept in step with the table."""
        view = View.__new__(View)
        view.table, view.levels, view.nodes = self.table, self.levels, self.nodes
        view.members, view.by_free_gpu = self.members, self.by_free_gpu
        view.excluded = self.excluded | excluded
        view.at_depth = {}
        view.totals = {d: list(t) for d, t in self.totals.items()}
        view.hist = {d: dict(h) for d, h in self.hist.items()}
        for node_id in sorted(excluded - self.excluded):
            n = self.nodes.get(node_id)
            if n is not None:
                view._count(n, -1)
        self.table.views.append(view)
        return view

    def detach(self) -> None:
        self.table.views.remove(self)

    @property
    def version(self) -> int:
        return self.table.version

    def add_totals(self, domains: tuple[Domain, ...], gpu: int, cpu: int, mem: int) -> None:
        for domain in domains:
            t = self.totals[domain]
            t[0] += gpu
            t[1] += cpu
            t[2] += mem

    def move_hist(self, domains: tuple[Domain, ...], old: int, new: int) -> None:
        for domain in domains:
            h = self.hist[domain]
            left = h[old] - 1
            if left:
                h[old] = left
            else:
                del h[old]
            h[new] = h.get(new, 0) + 1

    def domains_at(self, depth: int) -> list[Domain]:
        """Domains at ``depth`` with at least one node in this view. Which domains have
        one is fixed once the view is made (its nodes are), so the list is kept; callers
        do not change it."""
        found = self.at_depth.get(depth)
        if found is None:
            totals = self.totals
            found = self.at_depth[depth] = [d for d in self.table.domains[depth] if d in totals]
        return found

    def gpu_slots(self, domain: Domain, gpu: int) -> int:
        """Members of ``gpu`` GPUs each that the domain's free GPUs could hold (an upper
        bound on its room: CPU, memory and images may allow fewer)."""
        hist = self.hist.get(domain)
        if hist is None:
            return 0
        return sum(count * (free // gpu) for free, count in hist.items())


class CachedTable:
    """A table kept between passes and brought up to date from the state.

    For each node it keeps the immutable values the table was built from (info, status,
    allocated resources) and a copy of its allocated GPUs. Holding them keeps their
    identities unique, so an identity match proves the value is unchanged; a node whose
    capacity changed is updated in place; any other change (a node added, removed,
    re-registered or changing status, new topology levels, or another set of hot spares)
    rebuilds the table. The refreshed table therefore always equals
    ``Table.build(state, spares=spare_nodes(state))``. Snapshots
    (:mod:`synapse_ha.core.snapshot`) copy changed node records but share these values.
    """

    def __init__(self, state: ClusterState) -> None:
        self.levels = state.config.topology_levels
        self.spares = spare_nodes(state)
        self.table = Table.build(state, spares=self.spares)
        self.view = View(self.table)
        self.node_ids = list(state.nodes)
        self.node_list = list(state.nodes.values())
        self.infos = [node.info for node in self.node_list]
        self.statuses = [node.status for node in self.node_list]
        self.allocated = [node.allocated for node in self.node_list]
        self.gpus = [frozenset(node.allocated_gpus) for node in self.node_list]
        self.faults = [node.gpu_faults for node in self.node_list]
        self._empty: View | None = None

    def empty_view(self, state: ClusterState) -> View:
        """The schedulable nodes as if no gang held anything (rebuilt with the table)."""
        if self._empty is None:
            self._empty = View(Table.build(state, empty=True, spares=self.spares))
        return self._empty

    def refresh(self, state: ClusterState) -> bool:
        """Bring the table up to date; False when it must be rebuilt instead."""
        nodes = list(state.nodes.values())
        if (
            state.config.topology_levels != self.levels
            or len(nodes) != len(self.node_list)
            or list(state.nodes) != self.node_ids
            or not all(map(operator.is_, [n.info for n in nodes], self.infos))
            or not all(map(operator.is_, [n.status for n in nodes], self.statuses))
            or not all(map(operator.is_, [n.gpu_faults for n in nodes], self.faults))
            or spare_nodes(state) != self.spares
        ):
            return False
        allocated = [n.allocated for n in nodes]
        changed = set(compress(range(len(nodes)), map(operator.is_not, allocated, self.allocated)))
        changed.update(
            compress(
                range(len(nodes)),
                map(operator.ne, [n.allocated_gpus for n in nodes], self.gpus),
            )
        )
        for i in sorted(changed):
            node = nodes[i]
            self.allocated[i] = node.allocated
            self.gpus[i] = frozenset(node.allocated_gpus)
            if node.node_id in self.table.nodes:
                self.table.set_free(node)
        return True


class CapacityCache:
    """The free-capacity table kept from one scheduling pass to the next.

    Owned by whoever plans (the leader loop, the simulator) and passed to
    :func:`schedule`; a pass borrows the table and leaves it as it found it. Not
    thread-safe: one planner at a time. Planning without one builds the table afresh,
    with the same plan.
    """

    def __init__(self) -> None:
        self._cached: CachedTable | None = None

    def borrow(self, state: ClusterState, unchanged: bool = False) -> CachedTable:
        """The table of ``state``. ``unchanged``: the caller knows that the nodes and
        the configuration equal those of the state the table was last borrowed for
        (the incremental planner compares its snapshots), so it is not refreshed."""
        cached, self._cached = self._cached, None
        if cached is not None and unchanged:
            return cached
        if cached is None or not cached.refresh(state):
            cached = CachedTable(state)
        return cached

    def give_back(self, cached: CachedTable) -> None:
        self._cached = cached
