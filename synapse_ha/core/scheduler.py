"""Gang placement: a pure function from a state snapshot to a plan.

``schedule(state, now_ms)`` never changes ``state``. It walks the queue (priority, then
submission order) and places each gang whole or not at all:

* **Topology.** Levels are searched from the tightest (one host) outwards to the whole
  cluster; the first level with a domain that can hold the whole gang wins. A
  ``topology.required`` level caps the search; ``topology.preferred`` is satisfied by the
  same tightest-first search and only changes what the reason says when it is missed.
* **Best fit.** Among domains of a level that fit, the one left with the least free
  capacity is chosen, so large contiguous domains stay free for large gangs. Inside the
  domain, members go to the fewest hosts (fullest sub-domain first), the last host chosen
  by best fit.
* **NVLink.** Inside a node a member's GPUs come from one NVLink island when any island
  has enough free GPUs (the tightest such island), otherwise from the largest islands.
* **Reservation and backfill.** The first gang that cannot be placed gets a reservation:
  the earliest time enough capacity frees, from running jobs' time limits (jobs without
  one never end, for this purpose), and the nodes it would use then. Later gangs may use
  those nodes only if their own time limit ends before the reservation starts.

Every pending job left unplaced gets a sentence saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from synapse_ha.core.commands import BindPlan, GangPlacement
from synapse_ha.core.machine import FEATURE_IMAGES, time_limit_deadline, unconfirmed_members
from synapse_ha.core.model import (
    ClusterState,
    Job,
    JobSpec,
    JobState,
    MemberPlacement,
    MemberState,
    Resources,
    topology_path,
)
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
    reasons: dict[str, str] = field(default_factory=dict)  # every unplaced pending job
    changed_reasons: list[tuple[str, str]] = field(default_factory=list)
    reservation: Reservation | None = None

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
    cpu: int
    mem: int
    gpu: int
    islands: list[list[int]]  # free GPU indices per NVLink island
    island_of: dict[int, int]  # GPU index -> island position
    images: bool

    def slots(self, req: Resources, cap: int) -> int:
        """How many members of ``req`` fit here, at most ``cap``."""
        n = cap
        if req.gpu:
            n = min(n, self.gpu // req.gpu)
        if req.cpu_milli:
            n = min(n, self.cpu // req.cpu_milli)
        if req.memory_mib:
            n = min(n, self.mem // req.memory_mib)
        return max(n, 0)


class _View:
    """Free capacity per node with per-domain totals, kept in step as gangs are placed."""

    def __init__(self, levels: int) -> None:
        self.levels = levels  # number of topology levels above the host
        self.nodes: dict[str, _NodeFree] = {}
        self.order: list[str] = []  # node ids by topology path
        self.members: dict[Domain, list[str]] = {}  # domain -> node ids, in order
        self.totals: dict[Domain, list[int]] = {}  # domain -> [gpu, cpu, mem]
        self.by_free_gpu: dict[int, dict[str, None]] = {}  # free GPUs -> nodes (ordered)
        self.version = 0

    @classmethod
    def build(cls, state: ClusterState) -> _View:
        levels = state.config.topology_levels
        view = cls(len(levels))
        entries = []
        for node in state.nodes.values():
            if not node.schedulable():
                continue
            free = node.free
            used = node.allocated_gpus
            islands = [[g for g in island if g not in used] for island in node.info.gpu_islands]
            island_of = {g: i for i, island in enumerate(node.info.gpu_islands) for g in island}
            entries.append(
                _NodeFree(
                    node_id=node.node_id,
                    path=topology_path(node.info, levels),
                    cpu=free.cpu_milli,
                    mem=free.memory_mib,
                    gpu=free.gpu,
                    islands=islands,
                    island_of=island_of,
                    images=FEATURE_IMAGES in node.info.features,
                )
            )
        entries.sort(key=lambda e: e.path)
        for entry in entries:
            view._add(entry)
        return view

    def _add(self, n: _NodeFree) -> None:
        self.nodes[n.node_id] = n
        self.order.append(n.node_id)
        for depth in range(self.levels + 1):
            domain = n.path[:depth]
            self.members.setdefault(domain, []).append(n.node_id)
            t = self.totals.setdefault(domain, [0, 0, 0])
            t[0] += n.gpu
            t[1] += n.cpu
            t[2] += n.mem
        self.by_free_gpu.setdefault(n.gpu, {})[n.node_id] = None

    def copy_without(self, excluded: frozenset[str]) -> _View:
        view = _View(self.levels)
        for node_id in self.order:
            if node_id not in excluded:
                n = self.nodes[node_id]
                islands = [list(i) for i in n.islands]
                view._add(
                    _NodeFree(
                        n.node_id, n.path, n.cpu, n.mem, n.gpu, islands, n.island_of, n.images
                    )
                )
        return view

    def adjust(self, node_id: str, req: Resources, gpus: tuple[int, ...], sign: int) -> None:
        """Take (sign -1) or give back (sign +1) ``req`` and ``gpus`` on a node."""
        n = self.nodes.get(node_id)
        if n is None:
            return
        del self.by_free_gpu[n.gpu][node_id]
        n.gpu += sign * req.gpu
        n.cpu += sign * req.cpu_milli
        n.mem += sign * req.memory_mib
        self.by_free_gpu.setdefault(n.gpu, {})[node_id] = None
        for depth in range(self.levels + 1):
            t = self.totals[n.path[:depth]]
            t[0] += sign * req.gpu
            t[1] += sign * req.cpu_milli
            t[2] += sign * req.memory_mib
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

    def domains_at(self, depth: int) -> list[Domain]:
        return [d for d in self.members if len(d) == depth]


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


def _place(gang: _Gang, view: _View, depths: list[int]) -> list[tuple[str, int]] | None:
    """Choose hosts for the whole gang: [(node_id, members)], or None when it cannot fit."""
    req, n = gang.req, gang.n
    cluster_total = view.totals.get(())
    if cluster_total is None or not _fits_totals(cluster_total, req, n):
        return None
    for depth in depths:
        if depth == view.levels + 1:
            host = _best_single_host(gang, view)
            if host is not None:
                return [(host, n)]
            continue
        candidates = [d for d in view.domains_at(depth) if _fits_totals(view.totals[d], req, n)]
        candidates.sort(key=lambda d: (_leftover(view.totals[d], req, n), d))
        for domain in candidates:
            chosen = _fill_domain(gang, view, domain)
            if chosen is not None:
                return chosen
    return None


def _best_single_host(gang: _Gang, view: _View) -> str | None:
    req, n = gang.req, gang.n
    if req.gpu:
        for free in sorted(k for k in view.by_free_gpu if k >= req.gpu * n):
            for node_id in view.by_free_gpu[free]:
                node = view.nodes[node_id]
                if node.slots(req, n) >= n and _eligible(node, gang.spec):
                    return node_id
        return None
    best: tuple[tuple[int, int], str] | None = None
    for node_id in view.order:
        node = view.nodes[node_id]
        if node.slots(req, n) >= n and _eligible(node, gang.spec):
            key = (node.cpu - req.cpu_milli * n, node.mem - req.memory_mib * n)
            if best is None or key < best[0]:
                best = (key, node_id)
    return best[1] if best else None


def _fill_domain(gang: _Gang, view: _View, domain: Domain) -> list[tuple[str, int]] | None:
    """Fewest hosts inside ``domain``: fullest sub-domain first, last host by best fit."""
    req, n = gang.req, gang.n
    slots: dict[str, int] = {}
    room = 0
    for node_id in view.members[domain]:
        node = view.nodes[node_id]
        s = node.slots(req, n) if _eligible(node, gang.spec) else 0
        if s:
            slots[node_id] = s
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


def _commit(views: list[_View], req: Resources, members: tuple[MemberPlacement, ...]) -> None:
    for view in views:
        for m in members:
            view.adjust(m.node_id, req, m.gpus, -1)


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
) -> Plan:
    """Plan one scheduling pass over ``state`` at time ``now_ms``. Pure; never mutates.

    ``on_decision(job_id, placed)`` is called after each gang's decision; benchmarks
    use it to time decisions without the core reading a clock.
    """
    plan = Plan()
    view = _View.build(state)
    restricted: _View | None = None  # the view without the reserved nodes
    levels = len(state.config.topology_levels)
    explainer = _Explainer(state.config.levels_with_host())
    running = {
        job.job_id: _Running(time_limit_deadline(job), job.spec.resources, attempt.members)
        for job in state.live_jobs()
        if (attempt := job.attempt) is not None
    }

    for job in state.pending_jobs():
        spec = job.spec
        if now_ms < job.retry_not_before_ms:
            continue  # its reason was set when the attempt failed
        stopping = unconfirmed_members(job)
        if stopping:
            plan.reasons[job.job_id] = (
                f"retrying: waiting for {len(stopping)} member(s) of attempt "
                f"{job.attempts_made} to be confirmed stopped (ranks "
                f"{', '.join(map(str, stopping[:8]))}{', ...' if len(stopping) > 8 else ''})"
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
        hosts = _place(gang, target, depths)
        if hosts is not None:
            members = _members_for(gang, target, hosts)
            _commit([v for v in (view, restricted) if v is not None], spec.resources, members)
            plan.placements.append(GangPlacement(job.job_id, job.attempts_made, members))
            end = now_ms + spec.time_limit_ms if spec.time_limit_ms else None
            running[job.job_id] = _Running(end, spec.resources, members)
            if on_decision is not None:
                on_decision(job.job_id, True)
            continue
        if reservation is None:
            made = _reserve(gang, view, depths, running)
            if made is not None:
                plan.reservation = made
                restricted = view.copy_without(made.nodes)
            plan.reasons[job.job_id] = explainer.why_waiting(gang, view, depths, made, now_ms)
        else:
            blocked = _place(gang, view, depths) is not None
            plan.reasons[job.job_id] = explainer.why_waiting(
                gang, view, depths, None, now_ms, behind=reservation if blocked else None
            )
        if on_decision is not None:
            on_decision(job.job_id, False)

    plan.changed_reasons = [
        (job_id, reason)
        for job_id, reason in sorted(plan.reasons.items())
        if state.jobs[job_id].reason != reason
    ]
    return plan


def _reserve(
    gang: _Gang, view: _View, depths: list[int], running: dict[str, _Running]
) -> Reservation | None:
    """The earliest start for the head-of-line gang as running gangs end, and its nodes.

    Gangs are released in order of their end time; those without a time limit last
    (their end is unknown, so a reservation that needs them has no start time).
    """
    future = view.copy_without(frozenset())
    order = sorted(
        running.items(),
        key=lambda item: (item[1].end_ms is None, item[1].end_ms or 0, item[0]),
    )
    for i, (_, gone) in enumerate(order):
        for m in gone.members:
            future.adjust(m.node_id, gone.req, m.gpus, +1)
        nxt = order[i + 1][1] if i + 1 < len(order) else None
        if nxt is not None and nxt.end_ms == gone.end_ms:
            continue  # gangs ending at the same moment free their capacity together
        hosts = _place(gang, future, depths)
        if hosts is not None:
            return Reservation(gang.job.job_id, gone.end_ms, frozenset(h for h, _ in hosts))
    return None


# --------------------------------------------------------------------------- reasons


class _Explainer:
    """Sentences for people: why a gang waits, with the numbers that matter."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.cache: dict[tuple[Resources, int, int], tuple[int, Domain]] = {}

    def best_room(self, view: _View, req: Resources, depth: int) -> tuple[int, Domain]:
        """Roughly how many members of ``req`` the roomiest domain at ``depth`` holds now.

        Exact in GPUs for the whole cluster and for single hosts; for other domains an
        upper bound from the domain's free totals (fragmentation may lower it).
        """
        key = (req, depth, view.version)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        if depth == 0 and req.gpu:
            room = sum(len(nodes) * (free // req.gpu) for free, nodes in view.by_free_gpu.items())
            best: tuple[int, Domain] = (min(room, _bound(view.totals.get(()), req)), ())
        elif depth > view.levels:
            best = max(
                ((n.slots(req, _UNLIMITED), n.path) for n in view.nodes.values()),
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
    ) -> str:
        spec = gang.spec
        level = spec.topology_required
        where = f" in one {level}" if level else ""
        need = f"needs {gang.n} member(s) x ({spec.resources.describe()}){where}"
        if behind is not None:
            return (
                f"{need}; it would fit, but the nodes are reserved for {behind.job_id} "
                f"{_when(behind, now_ms)}; a time_limit ending before then would let it backfill"
            )
        room, domain = self.best_room(view, gang.req, min(depths) if level else 0)
        if domain:
            have = f"best {describe_domain(domain, self.names)} has room for {room}"
        else:
            have = f"the cluster has room for {room}"
        if spec.image:
            have += " (only nodes that run container images qualify)"
        if reservation is not None:
            return f"{need}; {have}; first in line, capacity reserved {_when(reservation, now_ms)}"
        if reservation is None and room < gang.n:
            return f"{need}; {have}; it waits for capacity to free or for nodes to join"
        return f"{need}; {have}, but not in a shape the gang can use; it waits for capacity"


def _bound(total: list[int] | None, req: Resources) -> int:
    if total is None:
        return 0
    bounds = [
        t // r
        for t, r in zip(total, (req.gpu, req.cpu_milli, req.memory_mib), strict=True)
        if r > 0
    ]
    return max(min(bounds, default=_UNLIMITED), 0)


def _when(reservation: Reservation, now_ms: int) -> str:
    if reservation.start_ms is None:
        return "until jobs without a time limit end"
    return f"from t+{max(reservation.start_ms - now_ms, 0) / 1000:.0f}s"


# --------------------------------------------------------------------------- explain


def explain(state: ClusterState, job_id: str, now_ms: int) -> str:
    """Why a job is where it is: its wait reason, or where each member runs."""
    job = state.jobs.get(job_id)
    if job is None:
        return f"no job {job_id!r}"
    if job.state is JobState.PENDING:
        if now_ms < job.retry_not_before_ms:
            return job.reason
        plan = schedule(state, now_ms)
        if job_id in plan.reasons:
            return plan.reasons[job_id]
        for p in plan.placements:
            if p.job_id == job_id:
                hosts = sorted({m.node_id for m in p.members})
                return f"fits now on {', '.join(hosts)}; it will be bound by the next pass"
        return job.reason
    attempt = job.attempt
    if attempt is None or job.state.finished:
        return f"{job.state.value}: {job.reason}"
    levels = state.config.topology_levels
    lines = [f"{job.state.value}, attempt {attempt.number} (token {attempt.fencing_token})"]
    for m, status in zip(attempt.members, attempt.member_status, strict=True):
        node = state.nodes.get(m.node_id)
        path = "/".join(topology_path(node.info, levels)) if node else m.node_id
        gpus = ",".join(map(str, m.gpus)) or "-"
        extra = f" exit {status.exit_code}" if status.state is MemberState.EXITED else ""
        lines.append(f"  rank {m.rank}: {path} gpus {gpus} {status.state.value}{extra}")
    return "\n".join(lines)
