"""Placing one gang whole, or not at all, on a view of the free capacity.

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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from synapse_ha.core.health.fitness import unfit_owners
from synapse_ha.core.model import ClusterState, Job, JobSpec, MemberPlacement, Resources
from synapse_ha.core.scheduler.capacity import Domain, NodeFree, Table, View
from synapse_ha.core.topology import CLUSTER


class NodeRoom:
    """How many members of one gang each node may take under its owner's per-node cap
    (core/spec/member_limits.py): ``room`` for the nodes where the owner has members that
    leave less than the gang's size, ``most`` for every other node. Compared by identity:
    a pass keeps one per owner and cap until it places another gang of that owner."""

    __slots__ = ("most", "room")

    def __init__(self, most: int, room: dict[str, int]) -> None:
        self.most = most
        self.room = room

    def of(self, node_id: str) -> int:
        return self.room.get(node_id, self.most)


NO_CAP = NodeRoom(1 << 62, {})


@dataclass(slots=True)
class Gang:
    job: Job
    spec: JobSpec
    req: Resources  # per member, what its node reserves (core/spec/member_limits.py)
    n: int
    # Nodes this gang may not use now: they could not start its owner's members.
    avoid: frozenset[str] = frozenset()
    # How many of its members each node may take under its owner's per-node cap.
    room: NodeRoom = NO_CAP
    # Per name its node selector requires (core/node_selector.py), the nodes answering to
    # it: one of them holds a member (:func:`place_including`).
    must: tuple[tuple[str, ...], ...] = ()


NONE: frozenset[str] = frozenset()


def unfit_nodes(state: ClusterState, now_ms: int) -> dict[str, frozenset[str]]:
    """For each owner, the nodes that cannot run its members at ``now_ms``: they failed
    to start one of them within the back-off (:class:`~synapse_ha.core.health.fitness.Unfit`)."""
    out: dict[str, set[str]] = {}
    for node in state.nodes.values():
        if node.unfit:
            for owner in unfit_owners(node.unfit, now_ms):
                out.setdefault(owner, set()).add(node.node_id)
    return {owner: frozenset(nodes) for owner, nodes in out.items()}


def fits_totals(total: list[int], req: Resources, n: int) -> bool:
    return (
        total[0] >= req.gpu * n and total[1] >= req.cpu_milli * n and total[2] >= req.memory_mib * n
    )


def _leftover(total: list[int], req: Resources, n: int) -> tuple[int, int, int]:
    return (total[0] - req.gpu * n, total[1] - req.cpu_milli * n, total[2] - req.memory_mib * n)


def _slots(node: NodeFree, gang: Gang, n: int) -> int:
    """How many of the gang's members ``node`` may take, at most ``n``: none when it may
    not run them, else what its free capacity and the owner's per-node cap allow."""
    if not (node.images or not gang.spec.image) or node.node_id in gang.avoid:
        return 0
    room = gang.room
    if room is not NO_CAP:
        n = min(n, room.of(node.node_id))
    return node.slots(gang.req, n)


def search_depths(state: ClusterState, spec: JobSpec, levels: int) -> list[int]:
    """Domain depths to try, tightest first: host (levels+1) ... cluster (0)."""
    names = state.config.levels_with_host()
    deepest = levels + 1
    shallowest = 0
    if spec.topology_required and spec.topology_required != CLUSTER:
        shallowest = names.index(spec.topology_required) + 1
    return list(range(deepest, shallowest - 1, -1))


def locality_depths(state: ClusterState, spec: JobSpec, depths: list[int]) -> list[int] | None:
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


def place(
    gang: Gang, view: View, depths: list[int], within: Domain = ()
) -> list[tuple[str, int]] | None:
    """Choose hosts for the whole gang: [(node_id, members)], or None when it cannot fit.
    With ``within``, only inside that domain (``depths`` no shallower than it)."""
    req, n = gang.req, gang.n
    cluster_total = view.totals.get(within)
    if cluster_total is None or not fits_totals(cluster_total, req, n):
        return None
    if req.gpu and view.gpu_slots(within, req.gpu) < n:
        return None
    if gang.must:
        return place_including(gang, view, depths, within)
    k = len(within)
    for depth in depths:
        if depth == view.levels + 1:
            host = _best_single_host(gang, view, within)
            if host is not None:
                return [(host, n)]
            continue
        candidates = [
            d
            for d in view.domains_at(depth)
            if d[:k] == within
            and fits_totals(view.totals[d], req, n)
            and (not req.gpu or view.gpu_slots(d, req.gpu) >= n)
        ]
        candidates.sort(key=lambda d: (_leftover(view.totals[d], req, n), d))
        for domain in candidates:
            chosen = _fill_domain(gang, view, domain)
            if chosen is not None:
                return chosen
    return None


def _candidates(view: View, domain: Domain, req: Resources) -> Iterator[NodeFree]:
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


def fits(gang: Gang, view: View, depths: list[int]) -> bool:
    """Whether ``place`` would find room for the whole gang, without choosing where.

    The gang fits exactly when some domain at its widest allowed level has room for
    every member: any placement lies inside one such domain, and ``place`` fills any
    domain with enough room.
    """
    req, n = gang.req, gang.n
    widest = min(depths)
    if gang.must:
        return place_including(gang, view, [widest]) is not None
    if widest > view.levels:
        return _best_single_host(gang, view) is not None
    for domain in view.domains_at(widest):
        if not fits_totals(view.totals[domain], req, n):
            continue
        if req.gpu and view.gpu_slots(domain, req.gpu) < n:
            continue
        room = 0
        for node in _candidates(view, domain, req):
            room += _slots(node, gang, n)
            if room >= n:
                return True
    return False


def _best_single_host(gang: Gang, view: View, within: Domain = ()) -> str | None:
    req, n = gang.req, gang.n
    k = len(within)
    if req.gpu:
        # Best fit on GPUs; among equally good hosts, the one in the fullest rack (the
        # innermost level above hosts), so that empty racks stay whole for gangs.
        if view.levels > 0 and k <= view.levels:
            return _best_gpu_host_by_rack(gang, view, within)
        return _best_gpu_host_scan(gang, view, within)
    best: tuple[tuple[int, int], str] | None = None
    for node in view.table.at:
        if node.node_id in view.excluded or node.path[:k] != within:
            continue
        if _slots(node, gang, n) >= n:
            key = (node.cpu - req.cpu_milli * n, node.mem - req.memory_mib * n)
            if best is None or key < best[0]:
                best = (key, node.node_id)
    return best[1] if best else None


def _best_gpu_host_scan(gang: Gang, view: View, within: Domain) -> str | None:
    """:func:`_best_single_host` for a GPU gang by looking at every host with enough free
    GPUs (fewest free GPUs first; then the fullest rack, then path order)."""
    req, n = gang.req, gang.n
    k = len(within)
    at = view.table.at
    totals = view.totals
    for free in sorted(k for k in view.by_free_gpu if k >= req.gpu * n):
        best_key: tuple[int, int] | None = None
        best_id = ""
        for pos in view.by_free_gpu[free]:
            node = at[pos]
            if (
                node.node_id not in view.excluded
                and node.path[:k] == within
                and _slots(node, gang, n) >= n
            ):
                key = (totals[node.domains[-1]][0], pos)
                if best_key is None or key < best_key:
                    best_key, best_id = key, node.node_id
        if best_key is not None:
            return best_id
    return None


def _best_gpu_host_by_rack(gang: Gang, view: View, within: Domain) -> str | None:
    """:func:`_best_single_host` for a GPU gang on a cluster with topology levels, without
    looking at every host: the same answer from the innermost domains' counts.

    The answer is the eligible host with the fewest free GPUs (at least the gang's),
    then the fewest free GPUs in its innermost domain (the rack), then the first in path
    order. Per free-GPU count, the racks that have a host with that count (``hist``) are
    tried in the order of (their free GPUs, their place in path order); racks hold
    contiguous positions, so the first rack with an eligible host holds the answer, its
    first eligible host with that count. A rack costs its hosts, not the cluster's."""
    req, n = gang.req, gang.n
    k = len(within)
    depth = view.levels
    racks = view.domains_at(depth)
    if k:
        racks = [d for d in racks if d[:k] == within]
    inside = view.hist.get(within)  # the free GPU counts of the racks' hosts, together
    if not racks or inside is None:
        return None
    hist, totals, members, nodes = view.hist, view.totals, view.members, view.nodes
    first = view.table.first
    excluded = view.excluded
    need = req.gpu * n
    counts = sorted(free for free in inside if free >= need)
    for free in counts:
        holding = [d for d in racks if hist[d].get(free)]
        holding.sort(key=lambda d: (totals[d][0], first[d]))
        for rack in holding:
            for node_id in members[rack]:
                node = nodes[node_id]
                if node.gpu == free and node_id not in excluded and _slots(node, gang, n) >= n:
                    return node_id
    return None


def _fill_domain(gang: Gang, view: View, domain: Domain) -> list[tuple[str, int]] | None:
    """Fewest hosts inside ``domain``: fullest sub-domain first, last host by best fit."""
    req, n = gang.req, gang.n
    slots: dict[str, int] = {}
    room = 0
    for node in _candidates(view, domain, req):
        s = _slots(node, gang, n)
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


def place_including(
    gang: Gang, view: View, depths: list[int], within: Domain = ()
) -> list[tuple[str, int]] | None:
    """:func:`place` for a gang that names nodes it must include (``gang.must``): for each
    name, the first of its nodes (in path order) with room for a member takes one; the
    rest go first to those nodes, then to the roomiest others of the tightest domain of
    ``depths`` that holds them all, or None."""
    chosen: list[NodeFree] = []
    for answering in gang.must:
        if any(node.node_id in answering for node in chosen):
            continue
        found = [
            node
            for node_id in answering
            if node_id not in view.excluded
            and (node := view.nodes.get(node_id)) is not None
            and node.path[: len(within)] == within
            and _slots(node, gang, 1)
        ]
        if not found:
            return None
        chosen.append(min(found, key=lambda node: node.pos))
    if len(chosen) > gang.n:
        return None
    for depth in depths:
        domain = chosen[0].path[:depth]
        if any(node.path[:depth] != domain for node in chosen):
            continue
        hosts = _fill_including(gang, view, domain, chosen)
        if hosts is not None:
            return hosts
    return None


def _fill_including(
    gang: Gang, view: View, domain: Domain, chosen: list[NodeFree]
) -> list[tuple[str, int]] | None:
    counts = {node.node_id: 1 for node in chosen}
    left = gang.n - len(chosen)
    for node in sorted(chosen, key=lambda node: node.pos):
        extra = min(left, _slots(node, gang, gang.n) - 1)
        counts[node.node_id] += extra
        left -= extra
    if left and len(domain) < view.levels + 1:
        others = sorted(
            (-slots, node.pos, node.node_id, slots)
            for node in _candidates(view, domain, gang.req)
            if node.node_id not in counts and (slots := _slots(node, gang, gang.n))
        )
        for _, _, node_id, slots in others:
            take = min(left, slots)
            counts[node_id] = take
            left -= take
            if not left:
                break
    if left:
        return None
    return sorted(counts.items(), key=lambda item: view.nodes[item[0]].pos)


def pick_gpus(islands: list[list[int]], count: int) -> tuple[int, ...]:
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


def members_for(
    gang: Gang, view: View, hosts: list[tuple[str, int]]
) -> tuple[MemberPlacement, ...]:
    """Turn host choices into ranked members with GPUs, taking them from ``view``."""
    hosts = sorted(hosts, key=lambda h: view.nodes[h[0]].path)
    members: list[MemberPlacement] = []
    for node_id, count in hosts:
        islands = [list(island) for island in view.nodes[node_id].islands]
        for _ in range(count):
            gpus = pick_gpus(islands, gang.req.gpu)
            members.append(MemberPlacement(rank=len(members), node_id=node_id, gpus=gpus))
            taken = set(gpus)
            for island in islands:
                island[:] = [g for g in island if g not in taken]
    return tuple(members)


def commit(table: Table, req: Resources, members: tuple[MemberPlacement, ...]) -> None:
    """Take the members' resources from the table: one change per host (its members are
    consecutive), not one per member."""
    i = 0
    while i < len(members):
        node_id = members[i].node_id
        j = i + 1
        while j < len(members) and members[j].node_id == node_id:
            j += 1
        if j - i == 1:
            table.adjust(node_id, req, members[i].gpus, -1)
        else:
            gpus = tuple(g for m in members[i:j] for g in m.gpus)
            table.adjust(node_id, req.times(j - i), gpus, -1)
        i = j
