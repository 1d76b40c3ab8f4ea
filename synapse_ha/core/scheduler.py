"""Gang placement: a pure function from a state snapshot to a plan.

``schedule(state, now_ms)`` never changes ``state``. It walks the queue (priority, then
submission order) and places each gang whole or not at all:

* **Topology.** Levels are searched from the tightest (one host) outwards to the whole
  cluster; the first level with a domain that can hold the whole gang wins. A
  ``topology.required`` level caps the search; ``topology.preferred`` is satisfied by the
  same tightest-first search and names the level a gang waits for (below).
* **Locality wait.** A gang of several members that could fit inside one domain of its
  ``topology.preferred`` level (by default the innermost level, the rack) but finds no
  such domain with room waits for one, at most ``ClusterConfig.locality_wait_ms``
  counted from when it was queued (submitted, or due for a retry); after that it takes
  the tightest fit across domains. This departs on purpose from a pure "tightest fit
  now" (DESIGN §3): a short wait for a whole rack is worth more to a training job than
  starting at once across racks. A waiting gang holds no reservation and blocks no one;
  a gang that does not fit even across domains is handled as any gang that cannot fit.
* **Best fit.** Among domains of a level that fit, the one left with the least free
  capacity is chosen, so large contiguous domains stay free for large gangs. Inside the
  domain, members go to the fewest hosts (fullest sub-domain first), the last host chosen
  by best fit. A gang that fits on one host takes the host left with the fewest free
  GPUs; among equally good hosts, the one in the rack (innermost level) with the fewest
  free GPUs, so that empty racks stay whole.
* **NVLink.** Inside a node a member's GPUs come from one NVLink island when any island
  has enough free GPUs (the tightest such island), otherwise from the largest islands.
* **Reservation and backfill.** The first gang that cannot be placed gets a reservation:
  the earliest time enough capacity frees, from running jobs' time limits (jobs without
  one never end, for this purpose), and the nodes it would use then. Later gangs may use
  those nodes only if their own time limit ends before the reservation starts.

Every pending job left unplaced gets a :class:`~synapse_ha.core.reasons.Reason` saying
why, with the numbers as fields (rendered to a sentence only at the edges).

**Cost.** The free-capacity table can be kept between passes in a ``CapacityCache`` that
the planner owns, and is then brought up to date from the nodes whose allocation changed
(see ``_CachedTable``); a pass's own changes are journalled and undone. Searches skip
domains whose free GPUs cannot hold the gang, and the reservation search tries a
placement only when a release may have made room. None of this changes a plan:
``schedule`` without a cache builds everything afresh and tests compare the two.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import compress

from synapse_ha.core.commands import BindPlan, GangPlacement
from synapse_ha.core.machine import FEATURE_IMAGES, time_limit_deadline, unconfirmed_members
from synapse_ha.core.model import (
    ClusterState,
    Job,
    JobSpec,
    JobState,
    MemberPlacement,
    MemberState,
    Node,
    Resources,
    topology_path,
)
from synapse_ha.core.reasons import Reason, ReasonCode, ranks_text, reason, render
from synapse_ha.core.topology import CLUSTER, describe_domain

Domain = tuple[str, ...]
_UNLIMITED = 1 << 40


# ------------------------------------------------------------------------------ plan


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    start_ms: int | None  # None: only once jobs without a time limit end
    nodes: frozenset[str]


@dataclass(slots=True)
class Plan:
    """What one scheduling pass decided."""

    placements: list[GangPlacement] = field(default_factory=list)
    reasons: dict[str, Reason] = field(default_factory=dict)  # every unplaced pending job
    changed_reasons: list[tuple[str, Reason]] = field(default_factory=list)
    reservation: Reservation | None = None
    # The earliest later time at which time alone may change a decision (a locality
    # wait ending); a caller that plans only on events should plan again then.
    wake_ms: int | None = None

    def command(self, now_ms: int) -> BindPlan | None:
        """The command to propose, or None when the pass changes nothing."""
        if not self.placements and not self.changed_reasons:
            return None
        return BindPlan(
            placements=tuple(self.placements),
            reasons=tuple(self.changed_reasons),
            now_ms=now_ms,
        )


# ---------------------------------------------------------------------- free capacity


@dataclass(slots=True)
class _NodeFree:
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


def _node_free(node: Node, path: Domain, pos: int, empty: bool = False) -> _NodeFree:
    """A node's free capacity; with ``empty``, as if nothing were bound to it."""
    free = node.info.capacity if empty else node.free
    used: set[int] = set() if empty else node.allocated_gpus
    islands = [[g for g in island if g not in used] for island in node.info.gpu_islands]
    return _NodeFree(
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


class _Table:
    """Free capacity of every schedulable node, shared by the views of one pass.

    Its indexes (nodes in path order, domain membership, nodes by free GPU count in path
    order) depend only on the nodes' current free capacity, never on the order in which
    changes arrived, so an updated table equals a freshly built one. Changes made during
    a pass are journalled and undone at its end (``mark``/``undo``).
    """

    def __init__(self, levels: int) -> None:
        self.levels = levels  # number of topology levels above the host
        self.nodes: dict[str, _NodeFree] = {}
        self.at: list[_NodeFree] = []  # by position (topology-path order)
        self.members: dict[Domain, list[str]] = {}  # domain -> node ids, in path order
        self.domains: list[list[Domain]] = [[] for _ in range(levels + 1)]  # by depth
        self.by_free_gpu: dict[int, list[int]] = {}  # free GPUs -> sorted positions
        self.views: list[_View] = []  # views kept in step with every change
        self.journal: list[tuple[str, Resources, tuple[int, ...], int]] = []
        self.version = 0

    @classmethod
    def build(cls, state: ClusterState, empty: bool = False) -> _Table:
        """The table of ``state``'s schedulable nodes; with ``empty``, as if no gang held
        any capacity."""
        levels = state.config.topology_levels
        table = cls(len(levels))
        ready = [
            (topology_path(node.info, levels), node)
            for node in state.nodes.values()
            if node.schedulable()
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
                members.append(n.node_id)
            table.by_free_gpu.setdefault(n.gpu, []).append(pos)
        return table

    def _move(self, n: _NodeFree, gpu: int) -> None:
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
        self.version += 1

    def adjust(self, node_id: str, req: Resources, gpus: tuple[int, ...], sign: int) -> None:
        """Take (sign -1) or give back (sign +1) ``req`` and ``gpus`` on a node."""
        n = self.nodes.get(node_id)
        if n is None:
            return
        self.journal.append((node_id, req, gpus, sign))
        self._change(n, req, gpus, sign)

    def _change(self, n: _NodeFree, req: Resources, gpus: tuple[int, ...], sign: int) -> None:
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
        self.version += 1

    def mark(self) -> int:
        return len(self.journal)

    def undo(self, mark: int) -> None:
        """Revert every change since ``mark``, newest first (islands stay sorted, so the
        result equals the table before the changes)."""
        while len(self.journal) > mark:
            node_id, req, gpus, sign = self.journal.pop()
            self._change(self.nodes[node_id], req, gpus, -sign)


class _View:
    """The table seen without some nodes (``excluded``), with per-domain free totals
    and, per domain, how many nodes have each free GPU count."""

    def __init__(self, table: _Table) -> None:
        self.table = table
        self.levels = table.levels
        self.nodes = table.nodes
        self.members = table.members
        self.by_free_gpu = table.by_free_gpu
        self.excluded: frozenset[str] = frozenset()
        self.totals: dict[Domain, list[int]] = {}  # domain -> [gpu, cpu, mem]
        self.hist: dict[Domain, dict[int, int]] = {}  # domain -> {free GPUs: nodes}
        for n in table.at:
            self._count(n, +1)
        table.views.append(self)

    def _count(self, n: _NodeFree, sign: int) -> None:
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

    def without(self, excluded: frozenset[str]) -> _View:
        """This view without ``excluded`` nodes, kept in step with the table."""
        view = _View.__new__(_View)
        view.table, view.levels, view.nodes = self.table, self.levels, self.nodes
        view.members, view.by_free_gpu = self.members, self.by_free_gpu
        view.excluded = self.excluded | excluded
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
        """Domains at ``depth`` with at least one node in this view."""
        return [d for d in self.table.domains[depth] if d in self.totals]

    def gpu_slots(self, domain: Domain, gpu: int) -> int:
        """Members of ``gpu`` GPUs each that the domain's free GPUs could hold (an upper
        bound on its room: CPU, memory and images may allow fewer)."""
        hist = self.hist.get(domain)
        if hist is None:
            return 0
        return sum(count * (free // gpu) for free, count in hist.items())


class _CachedTable:
    """A table kept between passes and brought up to date from the state.

    For each node it keeps the immutable values the table was built from (info, status,
    allocated resources) and a copy of its allocated GPUs. Holding them keeps their
    identities unique, so an identity match proves the value is unchanged; a node whose
    capacity changed is updated in place; any other change (a node added, removed,
    re-registered or changing status, or new topology levels) rebuilds the table. The
    refreshed table therefore always equals ``_Table.build(state)``. Snapshots
    (:mod:`synapse_ha.core.snapshot`) copy changed node records but share these values.
    """

    def __init__(self, state: ClusterState) -> None:
        self.levels = state.config.topology_levels
        self.table = _Table.build(state)
        self.view = _View(self.table)
        self.node_ids = list(state.nodes)
        self.node_list = list(state.nodes.values())
        self.infos = [node.info for node in self.node_list]
        self.statuses = [node.status for node in self.node_list]
        self.allocated = [node.allocated for node in self.node_list]
        self.gpus = [frozenset(node.allocated_gpus) for node in self.node_list]
        self._empty: _View | None = None

    def empty_view(self, state: ClusterState) -> _View:
        """The schedulable nodes as if no gang held anything (rebuilt with the table)."""
        if self._empty is None:
            self._empty = _View(_Table.build(state, empty=True))
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
        self._cached: _CachedTable | None = None

    def borrow(self, state: ClusterState) -> _CachedTable:
        cached, self._cached = self._cached, None
        if cached is None or not cached.refresh(state):
            cached = _CachedTable(state)
        return cached

    def give_back(self, cached: _CachedTable) -> None:
        self._cached = cached


# ---------------------------------------------------------------------------- placing


@dataclass(slots=True)
class _Gang:
    job: Job
    spec: JobSpec
    req: Resources
    n: int


def _fits_totals(total: list[int], req: Resources, n: int) -> bool:
    return (
        total[0] >= req.gpu * n and total[1] >= req.cpu_milli * n and total[2] >= req.memory_mib * n
    )


def _leftover(total: list[int], req: Resources, n: int) -> tuple[int, int, int]:
    return (total[0] - req.gpu * n, total[1] - req.cpu_milli * n, total[2] - req.memory_mib * n)


def _eligible(node: _NodeFree, spec: JobSpec) -> bool:
    return node.images or not spec.image


def _search_depths(state: ClusterState, spec: JobSpec, levels: int) -> list[int]:
    """Domain depths to try, tightest first: host (levels+1) ... cluster (0)."""
    names = state.config.levels_with_host()
    deepest = levels + 1
    shallowest = 0
    if spec.topology_required and spec.topology_required != CLUSTER:
        shallowest = names.index(spec.topology_required) + 1
    return list(range(deepest, shallowest - 1, -1))


def _locality_depths(state: ClusterState, spec: JobSpec, depths: list[int]) -> list[int] | None:
    """The depths a gang searches while it waits for locality, or None when it never
    waits: its ``topology.preferred`` level, else the innermost configured level, when
    that is tighter than what the gang already requires."""
    names = state.config.levels_with_host()
    level = spec.topology_preferred or (names[-2] if len(names) > 1 else "")
    if not level or level not in names:
        return None
    deepest = names.index(level) + 1
    local = [d for d in depths if d >= deepest]
    if not local or len(local) == len(depths):
        return None
    return local


def _pending_since(job: Job) -> int:
    """When the job joined the queue for its next attempt."""
    return max(job.submitted_at_ms, job.retry_not_before_ms)


def _place(gang: _Gang, view: _View, depths: list[int]) -> list[tuple[str, int]] | None:
    """Choose hosts for the whole gang: [(node_id, members)], or None when it cannot fit."""
    req, n = gang.req, gang.n
    cluster_total = view.totals.get(())
    if cluster_total is None or not _fits_totals(cluster_total, req, n):
        return None
    if req.gpu and view.gpu_slots((), req.gpu) < n:
        return None
    for depth in depths:
        if depth == view.levels + 1:
            host = _best_single_host(gang, view)
            if host is not None:
                return [(host, n)]
            continue
        candidates = [
            d
            for d in view.domains_at(depth)
            if _fits_totals(view.totals[d], req, n)
            and (not req.gpu or view.gpu_slots(d, req.gpu) >= n)
        ]
        candidates.sort(key=lambda d: (_leftover(view.totals[d], req, n), d))
        for domain in candidates:
            chosen = _fill_domain(gang, view, domain)
            if chosen is not None:
                return chosen
    return None


def _candidates(view: _View, domain: Domain, req: Resources) -> Iterator[_NodeFree]:
    """The view's nodes in ``domain`` that may hold a member of ``req`` (for the whole
    cluster, only nodes with enough free GPUs; the order is not significant)."""
    excluded = view.excluded
    if not domain and req.gpu:
        at = view.table.at
        for free, positions in view.by_free_gpu.items():
            if free >= req.gpu:
                for pos in positions:
                    node = at[pos]
                    if node.node_id not in excluded:
                        yield node
        return
    for node_id in view.members[domain]:
        if node_id not in excluded:
            yield view.nodes[node_id]


def _fits(gang: _Gang, view: _View, depths: list[int]) -> bool:
    """Whether ``_place`` would find room for the whole gang, without choosing where.

    The gang fits exactly when some domain at its widest allowed level has room for
    every member: any placement lies inside one such domain, and ``_place`` fills any
    domain with enough room.
    """
    req, n = gang.req, gang.n
    widest = min(depths)
    if widest > view.levels:
        return _best_single_host(gang, view) is not None
    for domain in view.domains_at(widest):
        if not _fits_totals(view.totals[domain], req, n):
            continue
        if req.gpu and view.gpu_slots(domain, req.gpu) < n:
            continue
        room = 0
        for node in _candidates(view, domain, req):
            if _eligible(node, gang.spec):
                room += node.slots(req, n)
                if room >= n:
                    return True
    return False


def _best_single_host(gang: _Gang, view: _View) -> str | None:
    req, n = gang.req, gang.n
    if req.gpu:
        # Best fit on GPUs; among equally good hosts, the one in the fullest rack (the
        # innermost level above hosts), so that empty racks stay whole for gangs.
        at = view.table.at
        totals = view.totals
        for free in sorted(k for k in view.by_free_gpu if k >= req.gpu * n):
            best_key: tuple[int, int] | None = None
            best_id = ""
            for pos in view.by_free_gpu[free]:
                node = at[pos]
                if (
                    node.slots(req, n) >= n
                    and _eligible(node, gang.spec)
                    and node.node_id not in view.excluded
                ):
                    key = (totals[node.domains[-1]][0], pos)
                    if best_key is None or key < best_key:
                        best_key, best_id = key, node.node_id
            if best_key is not None:
                return best_id
        return None
    best: tuple[tuple[int, int], str] | None = None
    for node in view.table.at:
        if node.node_id in view.excluded:
            continue
        if node.slots(req, n) >= n and _eligible(node, gang.spec):
            key = (node.cpu - req.cpu_milli * n, node.mem - req.memory_mib * n)
            if best is None or key < best[0]:
                best = (key, node.node_id)
    return best[1] if best else None


def _fill_domain(gang: _Gang, view: _View, domain: Domain) -> list[tuple[str, int]] | None:
    """Fewest hosts inside ``domain``: fullest sub-domain first, last host by best fit."""
    req, n = gang.req, gang.n
    slots: dict[str, int] = {}
    room = 0
    for node in _candidates(view, domain, req):
        s = node.slots(req, n) if _eligible(node, gang.spec) else 0
        if s:
            slots[node.node_id] = s
            room += s
    if room < n:
        return None
    depth = len(domain) + 1
    child_room: dict[Domain, int] = {}
    for node_id, s in slots.items():
        child = view.nodes[node_id].path[:depth]
        child_room[child] = child_room.get(child, 0) + s
    ranked = sorted(
        slots,
        key=lambda nid: (
            -child_room[view.nodes[nid].path[:depth]],
            view.nodes[nid].path[:depth],
            -slots[nid],
            view.nodes[nid].path,
        ),
    )
    chosen: list[tuple[str, int]] = []
    remaining = n
    for i, node_id in enumerate(ranked):
        s = slots[node_id]
        if s >= remaining:
            # Best fit for the last host: the smallest room that still covers the rest.
            _, _, last = min(
                (slots[nid], pos, nid)
                for pos, nid in enumerate(ranked[i:])
                if slots[nid] >= remaining
            )
            chosen.append((last, remaining))
            return chosen
        chosen.append((node_id, s))
        remaining -= s
    return None


def _pick_gpus(islands: list[list[int]], count: int) -> tuple[int, ...]:
    """``count`` free GPUs, from one NVLink island when possible (the tightest that fits)."""
    if count == 0:
        return ()
    fitting = [isl for isl in islands if len(isl) >= count]
    if fitting:
        island = min(fitting, key=lambda isl: (len(isl), isl[0]))
        return tuple(island[:count])
    picked: list[int] = []
    for island in sorted(islands, key=lambda isl: (-len(isl), isl[0] if isl else 0)):
        picked.extend(island[: count - len(picked)])
        if len(picked) == count:
            break
    return tuple(sorted(picked))


def _members_for(
    gang: _Gang, view: _View, hosts: list[tuple[str, int]]
) -> tuple[MemberPlacement, ...]:
    """Turn host choices into ranked members with GPUs, taking them from ``view``."""
    hosts = sorted(hosts, key=lambda h: view.nodes[h[0]].path)
    members: list[MemberPlacement] = []
    for node_id, count in hosts:
        islands = [list(island) for island in view.nodes[node_id].islands]
        for _ in range(count):
            gpus = _pick_gpus(islands, gang.req.gpu)
            members.append(MemberPlacement(rank=len(members), node_id=node_id, gpus=gpus))
            taken = set(gpus)
            for island in islands:
                island[:] = [g for g in island if g not in taken]
    return tuple(members)


def _commit(table: _Table, req: Resources, members: tuple[MemberPlacement, ...]) -> None:
    for m in members:
        table.adjust(m.node_id, req, m.gpus, -1)


# ------------------------------------------------------------------------- the pass


@dataclass(slots=True)
class _Running:
    """A gang that holds capacity during this pass: its end time and what it holds."""

    end_ms: int | None  # None: no time limit
    req: Resources
    members: tuple[MemberPlacement, ...]


def schedule(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None = None,
    *,
    cache: CapacityCache | None = None,
) -> Plan:
    """Plan one scheduling pass over ``state`` at time ``now_ms``. Pure; never mutates.

    ``on_decision(job_id, placed)`` is called after each gang's decision; benchmarks
    use it to time decisions without the core reading a clock.

    With a ``cache``, the free-capacity table is kept between passes and updated from
    the nodes that changed, which makes a pass cost what changed rather than the
    cluster's size. The plan is the same without one (a table built from scratch).
    """
    cached = cache.borrow(state) if cache is not None else _CachedTable(state)
    table = cached.table
    # Should _plan raise, the table may be mid-change: it is dropped, never reused.
    plan = _plan(state, now_ms, on_decision, cached.view, cached.empty_view)
    for extra in table.views[1:]:
        extra.detach()
    table.undo(0)
    if cache is not None:
        cache.give_back(cached)
    return plan


def _plan(
    state: ClusterState,
    now_ms: int,
    on_decision: Callable[[str, bool], None] | None,
    view: _View,
    empty_view: Callable[[ClusterState], _View],
) -> Plan:
    plan = Plan()
    table = view.table
    restricted: _View | None = None  # the view without the reserved nodes
    levels = len(state.config.topology_levels)
    explainer = _Explainer(state.config.levels_with_host())
    placed: dict[str, _Running] = {}  # gangs placed by this pass
    wait_ms = state.config.locality_wait_ms
    fits_local: dict[tuple[Resources, int, bool, int], bool] = {}  # on an empty cluster
    running: dict[str, _Running] | None = None  # every gang holding capacity; on first need

    for job in state.pending_jobs():
        spec = job.spec
        if now_ms < job.retry_not_before_ms:
            continue  # its reason was set when the attempt failed
        stopping = unconfirmed_members(job)
        if stopping:
            plan.reasons[job.job_id] = reason(
                ReasonCode.WAITING_STOP_CONFIRMED,
                attempt=job.attempts_made,
                count=len(stopping),
                ranks=ranks_text(stopping),
            )
            continue
        gang = _Gang(job, spec, spec.resources, spec.replicas)
        depths = _search_depths(state, spec, levels)
        reservation = plan.reservation
        backfill_ok = (
            reservation is not None
            and reservation.start_ms is not None
            and spec.time_limit_ms > 0
            and now_ms + spec.time_limit_ms <= reservation.start_ms
        )
        target = restricted if restricted is not None and not backfill_ok else view
        local = _locality_depths(state, spec, depths) if wait_ms and gang.n > 1 else None
        deadline = _pending_since(job) + wait_ms
        if local is not None and now_ms < deadline:
            key = (gang.req, gang.n, bool(spec.image), local[-1])
            possible = fits_local.get(key)
            if possible is None:
                possible = fits_local[key] = _fits(gang, empty_view(state), local)
            if not possible:
                local = None
        else:
            local = None
        hosts = _place(gang, target, local if local is not None else depths)
        if hosts is None and local is not None and _fits(gang, target, depths):
            plan.reasons[job.job_id] = explainer.why_waiting_for_locality(
                gang, target, local, wait_ms
            )
            if plan.wake_ms is None or deadline < plan.wake_ms:
                plan.wake_ms = deadline
            if on_decision is not None:
                on_decision(job.job_id, False)
            continue
        if hosts is not None:
            members = _members_for(gang, target, hosts)
            _commit(table, spec.resources, members)
            plan.placements.append(GangPlacement(job.job_id, job.attempts_made, members))
            end = now_ms + spec.time_limit_ms if spec.time_limit_ms else None
            placed[job.job_id] = _Running(end, spec.resources, members)
            if running is not None:
                running[job.job_id] = placed[job.job_id]
            if on_decision is not None:
                on_decision(job.job_id, True)
            continue
        if reservation is None:
            if running is None:
                running = _running(state, placed)
            made = _reserve(gang, view, depths, running, lambda: empty_view(state))
            if made is not None:
                plan.reservation = made
                restricted = view.without(made.nodes)
            plan.reasons[job.job_id] = explainer.why_waiting(gang, view, depths, made, now_ms)
        else:
            blocked = _fits(gang, view, depths)
            plan.reasons[job.job_id] = explainer.why_waiting(
                gang, view, depths, None, now_ms, behind=reservation if blocked else None
            )
        if on_decision is not None:
            on_decision(job.job_id, False)

    # A gang queued again after an attempt ended says how that attempt ended (a
    # disruption that requeued it, or a failure being retried).
    for job_id, why in plan.reasons.items():
        last = state.jobs[job_id].attempt
        if why.cause is None and last is not None and last.outcome is not None:
            plan.reasons[job_id] = Reason(why.code, why.params, last.outcome)
    plan.changed_reasons = [
        (job_id, why)
        for job_id, why in sorted(plan.reasons.items())
        if state.jobs[job_id].reason != why
    ]
    return plan


def _running(state: ClusterState, placed: dict[str, _Running]) -> dict[str, _Running]:
    """Every gang holding capacity: live attempts, and gangs placed earlier this pass."""
    running = {
        job.job_id: _Running(time_limit_deadline(job), job.spec.resources, attempt.members)
        for job in state.live_jobs()
        if (attempt := job.attempt) is not None
    }
    running.update(placed)
    return running


def _reserve(
    gang: _Gang,
    view: _View,
    depths: list[int],
    running: dict[str, _Running],
    empty_view: Callable[[], _View],
) -> Reservation | None:
    """The earliest start for the head-of-line gang as running gangs end, and its nodes.

    Gangs with a time limit are released in order of their end time, gangs ending at
    the same moment together; the reservation is the first release after which the gang
    fits, placed on the capacity free at that moment. Gangs without a time limit end at
    an unknown time, after all the others: a reservation that needs them has no start
    time and is placed on the cluster as it is once every running gang has ended, with
    nothing bound. (Every bound member belongs to a live attempt, so that is the
    capacity left after releasing them all.)

    Releases are applied to the pass's table only when a cheap bound says the gang may
    fit, and undone before returning. The bound is exact in what it skips: whether a
    gang fits only grows as capacity frees, it fits exactly when some domain at its
    widest allowed level has room for all members, and the room of a domain untouched
    since the last failed try has not changed.
    """
    table = view.table
    req, n = gang.req, gang.n
    widest = min(depths)
    limited = sorted((r.end_ms, job_id, r) for job_id, r in running.items() if r.end_ms is not None)
    light: dict[str, list[int]] = {}  # node id -> its free [gpu, cpu, mem] once released
    bounds: dict[Domain, list[int]] = {}  # domain -> [gpu, cpu, mem, members by GPUs]
    touched: set[Domain] = set()  # domains whose room grew since the last try
    unapplied: list[_Running] = []
    mark = table.mark()
    try:
        for i, (end, _, gone) in enumerate(limited):
            for m in gone.members:
                node = table.nodes.get(m.node_id)
                if node is None:
                    continue
                domain = node.path[:widest]
                free = light.get(m.node_id)
                if free is None:
                    free = light[m.node_id] = [node.gpu, node.cpu, node.mem]
                bound = bounds.get(domain)
                if bound is None:
                    bound = bounds[domain] = _domain_bound(view, node, domain, req)
                if req.gpu:
                    bound[3] += (free[0] + gone.req.gpu) // req.gpu - free[0] // req.gpu
                free[0] += gone.req.gpu
                free[1] += gone.req.cpu_milli
                free[2] += gone.req.memory_mib
                bound[0] += gone.req.gpu
                bound[1] += gone.req.cpu_milli
                bound[2] += gone.req.memory_mib
                touched.add(domain)
            unapplied.append(gone)
            if i + 1 < len(limited) and limited[i + 1][0] == end:
                continue  # gangs ending at the same moment free their capacity together
            if not any(
                _fits_totals(bounds[d], req, n) and (not req.gpu or bounds[d][3] >= n)
                for d in touched
            ):
                continue
            touched.clear()
            for g in unapplied:
                for m in g.members:
                    table.adjust(m.node_id, g.req, m.gpus, +1)
            unapplied.clear()
            hosts = _place(gang, view, depths)
            if hosts is not None:
                return Reservation(gang.job.job_id, end, frozenset(h for h, _ in hosts))
    finally:
        table.undo(mark)
    if len(limited) == len(running):
        return None
    hosts = _place(gang, empty_view(), depths)
    if hosts is None:
        return None
    return Reservation(gang.job.job_id, None, frozenset(h for h, _ in hosts))


def _domain_bound(view: _View, node: _NodeFree, domain: Domain, req: Resources) -> list[int]:
    """[gpu, cpu, mem, members of ``req`` its free GPUs could hold] for ``domain``."""
    if len(domain) > view.levels:  # a single host
        slots = node.gpu // req.gpu if req.gpu else 0
        return [node.gpu, node.cpu, node.mem, slots]
    t = view.totals[domain]
    return [t[0], t[1], t[2], view.gpu_slots(domain, req.gpu) if req.gpu else 0]


# --------------------------------------------------------------------------- reasons


class _Explainer:
    """Sentences for people: why a gang waits, with the numbers that matter."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        # Keyed by the view itself too (the views of one pass share a version); holding
        # the view keeps its identity from being reused by a later one in the pass.
        self.cache: dict[tuple[Resources, int, int, _View], tuple[int, Domain]] = {}

    def best_room(self, view: _View, req: Resources, depth: int) -> tuple[int, Domain]:
        """Roughly how many members of ``req`` the roomiest domain at ``depth`` holds now.

        Exact in GPUs for the whole cluster and for single hosts; for other domains an
        upper bound from the domain's free totals (fragmentation may lower it).
        """
        key = (req, depth, view.version, view)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        if depth == 0 and req.gpu:
            room = sum(len(nodes) * (free // req.gpu) for free, nodes in view.by_free_gpu.items())
            best: tuple[int, Domain] = (min(room, _bound(view.totals.get(()), req)), ())
        elif depth > view.levels:
            best = max(
                (
                    (n.slots(req, _UNLIMITED), n.path)
                    for n in view.table.at
                    if n.node_id not in view.excluded
                ),
                key=lambda item: (item[0], [-ord(c) for c in "/".join(item[1])]),
                default=(0, ()),
            )
        else:
            best = (0, ())
            for domain in sorted(view.domains_at(depth)):
                room = _bound(view.totals[domain], req)
                if room > best[0] or not best[1]:
                    best = (room, domain)
        self.cache[key] = best
        return best

    def why_waiting(
        self,
        gang: _Gang,
        view: _View,
        depths: list[int],
        reservation: Reservation | None,
        now_ms: int,
        behind: Reservation | None = None,
    ) -> Reason:
        spec = gang.spec
        need = _need(gang)
        if behind is not None:
            return reason(
                ReasonCode.RESERVED_FOR_OTHER,
                holder=behind.job_id,
                start_in_ms=_start_in(behind, now_ms),
                **need,
            )
        room, domain = self.best_room(view, gang.req, min(depths) if spec.topology_required else 0)
        have: dict[str, int | str | None] = {
            "room": room,
            "domain": describe_domain(domain, self.names) if domain else None,
            "images": 1 if spec.image else None,
        }
        if reservation is not None:
            return reason(
                ReasonCode.FIRST_IN_LINE_RESERVED,
                start_in_ms=_start_in(reservation, now_ms),
                **need,
                **have,
            )
        if room < gang.n:
            return reason(ReasonCode.WAITING_CAPACITY, **need, **have)
        return reason(ReasonCode.WAITING_SHAPE, **need, **have)

    def why_waiting_for_locality(
        self, gang: _Gang, view: _View, local: list[int], wait_ms: int
    ) -> Reason:
        depth = min(local)
        room, domain = self.best_room(view, gang.req, depth)
        return reason(
            ReasonCode.WAITING_LOCALITY,
            wait_level=self.names[depth - 1],
            wait_ms=wait_ms,
            room=room if domain else None,
            domain=describe_domain(domain, self.names) if domain else None,
            **_need(gang),
        )


def _need(gang: _Gang) -> dict[str, int | str | None]:
    """The fields every wait reason carries: the gang's size, request and required level."""
    return {
        "members": gang.n,
        "request": gang.spec.resources.describe(),
        "level": gang.spec.topology_required or None,
    }


def _bound(total: list[int] | None, req: Resources) -> int:
    if total is None:
        return 0
    bounds = [
        t // r
        for t, r in zip(total, (req.gpu, req.cpu_milli, req.memory_mib), strict=True)
        if r > 0
    ]
    return max(min(bounds, default=_UNLIMITED), 0)


def _start_in(reservation: Reservation, now_ms: int) -> int | None:
    """How long until the reservation starts; None: once jobs without a time limit end."""
    if reservation.start_ms is None:
        return None
    return max(reservation.start_ms - now_ms, 0)


# --------------------------------------------------------------------------- explain


def why_pending(
    state: ClusterState, job_id: str, now_ms: int, last_plan: Plan | None = None
) -> Reason | None:
    """Why a pending job waits now; None when the job is not pending.

    The answer comes from ``last_plan``, the leader's newest scheduling pass, never from
    planning again: a pass over a large cluster is far too costly to run per question.
    ``FITS_NOW`` when that pass placed the job (its bind is on its way); the job's
    replicated reason when the pass did not consider it (submitted since, or planned by
    an earlier leader) or while it waits out a retry back-off.
    """
    job = state.jobs.get(job_id)
    if job is None or job.state is not JobState.PENDING:
        return None
    if now_ms < job.retry_not_before_ms or last_plan is None:
        return job.reason
    if job_id in last_plan.reasons:
        return last_plan.reasons[job_id]
    for p in last_plan.placements:
        if p.job_id == job_id and p.attempts_made == job.attempts_made:
            hosts = sorted({m.node_id for m in p.members})
            last = job.attempt.outcome if job.attempt is not None else None
            return reason(ReasonCode.FITS_NOW, last, nodes=", ".join(hosts))
    return job.reason


def explain(state: ClusterState, job_id: str, now_ms: int, last_plan: Plan | None = None) -> str:
    """Why a job is where it is, for people: its wait reason (see :func:`why_pending`),
    or where each member runs."""
    job = state.jobs.get(job_id)
    if job is None:
        return f"no job {job_id!r}"
    if job.state is JobState.PENDING:
        return render(why_pending(state, job_id, now_ms, last_plan))
    attempt = job.attempt
    if attempt is None or job.state.finished:
        return f"{job.state.value}: {render(job.reason)}"
    levels = state.config.topology_levels
    lines = [f"{job.state.value}, attempt {attempt.number} (token {attempt.fencing_token})"]
    if job.requeues:
        lines[0] += f", {job.requeues} requeue(s) after disruptions"
    for m, status in zip(attempt.members, attempt.member_status, strict=True):
        node = state.nodes.get(m.node_id)
        path = "/".join(topology_path(node.info, levels)) if node else m.node_id
        gpus = ",".join(map(str, m.gpus)) or "-"
        extra = f" exit {status.exit_code}" if status.state is MemberState.EXITED else ""
        lines.append(f"  rank {m.rank}: {path} gpus {gpus} {status.state.value}{extra}")
    return "\n".join(lines)
