"""Reservations and backfill for the first gangs that cannot be placed.

The first gang that cannot be placed gets a reservation: the earliest time enough
capacity frees, from running jobs' estimated ends (jobs without an estimate, or past
one, never end, for this purpose), and the nodes it would use then. Later gangs may use
those nodes, or preempt gangs on them, only if their own estimate ends before the
reservation starts. An estimate
is a job's time limit, else its queue's learned or default one
(:mod:`synapse_ha.core.queues.estimates`); only a time limit stops a job.

With ``ClusterConfig.reservations_per_pass`` above 1 (Slurm's ``bf_max_job_test``), the
first that many gangs that cannot be placed each get one (:class:`Reserved`), each on
nodes no earlier reservation of the pass holds, so a small gang that waits for a host
with CPU beside a free GPU does not leave the big gang behind it without one. A later
gang may use reserved nodes only if it ends before every reservation holding the nodes
it uses: it is placed on the pass's view without the nodes of each reservation it may
not backfill before. A gang that would fit but for reservations waits behind the first
of them whose nodes alone would let it fit (else the first it may not backfill before).
Below :data:`RESERVATIONS_FORMAT` a pass keeps one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.formats import NEW_FIELDS
from synapse_ha.core.model import ClusterState, Job, MemberPlacement, Resources
from synapse_ha.core.queues.estimates import Estimates
from synapse_ha.core.scheduler.capacity import Domain, NodeFree, View
from synapse_ha.core.scheduler.placement import Gang, fits_totals, place
from synapse_ha.core.scheduler.plan import Reservation
from synapse_ha.core.spec.member_limits import reserved_of

# From this format on a pass keeps up to ``reservations_per_pass`` reservations; below it, one.
RESERVATIONS_FORMAT = NEW_FIELDS[ClusterConfig]["reservations_per_pass"]


@dataclass(slots=True)
class Running:
    """A gang that holds capacity during this pass: its end time and what it holds."""

    end_ms: int | None  # None: no estimate, or past it
    req: Resources
    members: tuple[MemberPlacement, ...]


def running_gangs(state: ClusterState, placed: dict[str, Running]) -> dict[str, Running]:
    """Every gang holding capacity: live attempts, with their estimated ends
    (:meth:`Estimates.end`), and gangs placed earlier this pass."""
    estimates = Estimates(state)
    running = {
        job.job_id: Running(estimates.end(job), reserved_of(job), attempt.members)
        for job in state.live_jobs()
        if (attempt := job.attempt) is not None
    }
    running.update(placed)
    return running


def may_backfill(estimates: Estimates, job: Job, made: Reservation | None, now_ms: int) -> bool:
    """Whether ``job`` may use the nodes of the timed reservation ``made``: its estimate
    (a time limit, or its queue's learned or default one) ends before the reservation
    starts. A job without an estimate never may."""
    if made is None or made.start_ms is None:
        return False
    guess = estimates.of(job)
    return guess is not None and now_ms + guess.ms <= made.start_ms


def backfill_ends(
    estimates: Estimates, made: Sequence[Reservation], jobs: list[Job], now_ms: int
) -> int | None:
    """The first time after ``now_ms`` at which one of ``jobs`` that may backfill before
    one of the timed reservations ``made`` (:func:`may_backfill`) may no longer."""
    starts = sorted({r.start_ms for r in made if r.start_ms is not None})
    if not starts:
        return None
    guesses = [guess.ms for job in jobs if (guess := estimates.of(job)) is not None]
    return min(
        (start - ms + 1 for start in starts for ms in guesses if now_ms + ms <= start),
        default=None,
    )


def reserve(
    gang: Gang,
    view: View,
    depths: list[int],
    running: dict[str, Running],
    empty_view: Callable[[], View],
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
    unapplied: list[Running] = []
    mark = table.mark()
    try:
        for i, (end, _, gone) in enumerate(limited):
            for m in gone.members:
                node = table.nodes.get(m.node_id)
                if node is None or m.node_id in view.excluded:
                    continue  # gone, or not the view's (another reservation's): no room here
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
                fits_totals(bounds[d], req, n) and (not req.gpu or bounds[d][3] >= n)
                for d in touched
            ):
                continue
            touched.clear()
            for g in unapplied:
                for m in g.members:
                    table.adjust(m.node_id, g.req, m.gpus, +1)
            unapplied.clear()
            hosts = place(gang, view, depths)
            if hosts is not None:
                return Reservation(gang.job.job_id, end, frozenset(h for h, _ in hosts))
    finally:
        table.undo(mark)
    if len(limited) == len(running):
        return None
    hosts = place(gang, empty_view(), depths)
    if hosts is None:
        return None
    return Reservation(gang.job.job_id, None, frozenset(h for h, _ in hosts))


def start_by(
    gang: Gang,
    view: View,
    depths: list[int],
    running: dict[str, Running],
    now_ms: int,
    by_ms: int,
) -> tuple[Reservation, dict[str, int]] | None:
    """When ``gang`` starts without preempting anyone, if that is by ``by_ms``: the
    reservation :func:`reserve` makes counting only the gangs estimated to end from
    ``now_ms`` to ``by_ms`` (an end already past is not counted on: that gang runs late),
    and the gangs it waits for, with their ends: those on its nodes that end by its
    start (else those ending at its start). None when the estimates say it does not
    start by then. The table is left unchanged."""
    ends = {
        job_id: end
        for job_id, r in running.items()
        if (end := r.end_ms) is not None and now_ms <= end <= by_ms
    }
    if not ends:
        return None
    # Every gang counted has an end, so reserve never asks for the empty cluster.
    made = reserve(gang, view, depths, {j: running[j] for j in ends}, lambda: view)
    if made is None or made.start_ms is None:
        return None
    start = made.start_ms
    waits = {
        job_id: end
        for job_id, end in ends.items()
        if end <= start and any(m.node_id in made.nodes for m in running[job_id].members)
    }
    return made, waits or {job_id: end for job_id, end in ends.items() if end == start}


def _domain_bound(view: View, node: NodeFree, domain: Domain, req: Resources) -> list[int]:
    """[gpu, cpu, mem, members of ``req`` its free GPUs could hold] for ``domain``."""
    if len(domain) > view.levels:  # a single host
        slots = node.gpu // req.gpu if req.gpu else 0
        return [node.gpu, node.cpu, node.mem, slots]
    t = view.totals[domain]
    return [t[0], t[1], t[2], view.gpu_slots(domain, req.gpu) if req.gpu else 0]


def per_pass(state: ClusterState) -> int:
    """How many reservations a pass over ``state`` keeps (module doc)."""
    if state.format_floor < RESERVATIONS_FORMAT:
        return 1
    return state.config.reservations_per_pass


class Reserved:
    """One pass's reservations, in the order made (``made``: the plan's own list), and
    the views of the pass's view (``view``) without the nodes of some of them, made once
    per set of nodes and kept in step with the table (``views``)."""

    __slots__ = ("_empty", "estimates", "limit", "made", "now_ms", "view", "views")

    def __init__(self, state: ClusterState, now_ms: int, view: View, estimates: Estimates) -> None:
        self.limit = per_pass(state)
        self.now_ms = now_ms
        self.view = view
        self.estimates = estimates
        self.made: list[Reservation] = []
        self.views: dict[frozenset[str], View] = {}
        self._empty: tuple[View, dict[frozenset[str], View]] | None = None

    def full(self) -> bool:
        return len(self.made) >= self.limit

    def without(self, nodes: frozenset[str]) -> View:
        """The pass's view without ``nodes`` (itself when there are none)."""
        if not nodes:
            return self.view
        hit = self.views.get(nodes)
        if hit is None:
            hit = self.views[nodes] = self.view.without(nodes)
        return hit

    def barring(self, job: Job) -> list[Reservation]:
        """The reservations ``job`` may not backfill before (:func:`may_backfill`)."""
        estimates, now_ms = self.estimates, self.now_ms
        return [r for r in self.made if not may_backfill(estimates, job, r, now_ms)]

    def target(self, job: Job) -> View:
        """The view ``job`` is placed on: without the nodes of each reservation it may not
        backfill before."""
        if not self.made:
            return self.view
        return self.without(_nodes(self.barring(job)))

    def unreserved(self) -> View | None:
        """The pass's view without every reserved node; None while there is no reservation."""
        return self.without(_nodes(self.made)) if self.made else None

    def empty_unreserved(self, empty: View) -> View:
        """The empty cluster's view ``empty`` without every reserved node. The empty table
        never changes, so the view is detached from it at once."""
        nodes = _nodes(self.made)
        if not nodes:
            return empty
        if self._empty is None or self._empty[0] is not empty:
            self._empty = (empty, {})
        hit = self._empty[1].get(nodes)
        if hit is None:
            hit = self._empty[1][nodes] = empty.without(nodes)
            hit.detach()
        return hit

    def behind(self, job: Job, fits_on: Callable[[View], bool]) -> Reservation | None:
        """The reservation ``job``'s gang waits behind, when it fits the pass's view
        (``fits_on``: whether it fits a view): with more than one it may not backfill
        before, the first whose nodes alone keep it out, else the first of them."""
        if not self.made or not fits_on(self.view):
            return None
        barring = self.barring(job)
        if len(barring) > 1:
            for r in barring:
                if fits_on(self.without(_nodes([o for o in barring if o is not r]))):
                    return r
        return barring[0] if barring else self.made[0]


def _nodes(made: Sequence[Reservation]) -> frozenset[str]:
    if len(made) == 1:
        return made[0].nodes
    return frozenset().union(*(r.nodes for r in made))
