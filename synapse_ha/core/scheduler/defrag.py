"""Defragmentation: hosts drained for a gang whose free GPUs are scattered.

A pending gang of a starved queue (one that stays within its nominal GPU quota with the
gang; any gang where there are no quotas), that found neither a placement nor victims,
while the free GPUs of the nodes it may use add up to what it needs, waits only because
they are scattered. A pass then holds for it the cheapest set of hosts, inside one domain,
whose draining would give it room (Slurm's reservation for a maintenance drain, without
an operator):

* **Where.** The tightest level at which one domain could hold the gang once some of its
  hosts are empty (a host, then a rack, ... never wider than its ``topology.required``
  level). In each domain of that level, hosts are taken cheapest first (then those that
  gain the most room, then by id) until the gang would fit; the domain whose hosts cost
  least wins (then the fewest hosts, then the domain's path).
* **Cost** of a host: the work that must end there. Per gang on it, its GPUs there times
  its remaining estimated time (:mod:`synapse_ha.core.queues.estimates`), or, for a gang
  with no estimate (or past it), times the time it has run, as a penalty. A host with a
  gang of a higher priority than the waiting gang's is never drained.
* **Hold.** The pass's later gangs are not placed on held hosts, except one whose
  estimate ends by the time the drain completes (the latest estimated end of the gangs
  on them; none may when one has no estimate). The gang itself is placed wherever it fits,
  on its drained hosts once they are free.
* **Bound.** At most ``ClusterConfig.defrag_share_pct`` percent of the schedulable nodes
  (rounded down) are held in one pass; a gang whose cheapest set would go past that gets
  none. 0 (the default) turns drains off, and so does a cluster whose format floor is below
  :data:`DEFRAG_FORMAT` (a replica of an older release could not read the gang's reason).
  No drain takes a reservation's nodes (:mod:`.reservation`). A gang
  whose reservation has no start (a gang it needs gone has no estimate: the reservation
  is the best fit on the empty cluster, whatever runs there) gets its reservation placed
  as a drain instead, on the cheapest hosts, and a start when every gang there has an
  estimate; a timed reservation is kept as it is.

**Recomputed by every pass, not replicated** (as the reservation is): a drain is a
function of the replicated state and the pass's time, so every leader makes the same one,
and it ends by itself when its gang binds, is cancelled, preempts, fits elsewhere or is no
longer short only of contiguous room. It holds still from pass to pass because holding it
keeps it cheap: its hosts take only gangs that end before it completes, while the other
hosts keep taking new work. It moves when another set becomes cheaper by itself (its
gangs end sooner), where the gang would start sooner anyway. Apply has nothing to check
of it: a drain only withholds placements, and every bind is verified as always.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.codec.formats import NEW_ENUM_VALUES
from synapse_ha.core.model import ClusterState, Job, MemberPlacement, Resources
from synapse_ha.core.queues.estimates import Estimates
from synapse_ha.core.queues.quota import QueueUsage
from synapse_ha.core.reasons import Reason, ReasonCode, reason
from synapse_ha.core.scheduler.capacity import Domain, NodeFree, View
from synapse_ha.core.scheduler.placement import NO_CAP, Gang, fits
from synapse_ha.core.scheduler.plan import Drain, Plan, Reservation
from synapse_ha.core.scheduler.reservation import Running
from synapse_ha.core.spec.member_limits import reserved_of
from synapse_ha.core.topology import describe_domain

# From this format on every replica reads a drained-for gang's reason; below it, no drains.
DEFRAG_FORMAT = NEW_ENUM_VALUES[ReasonCode.DEFRAGMENTING]
_SHOWN = 4  # hosts and gangs named in a reason


@dataclass(slots=True)
class _Load:
    """What runs on one host: the work that must end for it to be empty."""

    cost: int = 0  # GPU-ms: remaining estimated time, else time run (a penalty)
    done_ms: int | None = 0  # the latest estimated end; None: a gang has none
    priority: int = -(1 << 62)  # the highest priority of a gang on it
    gpu: int = 0  # what the gangs on it hold
    cpu: int = 0
    mem: int = 0
    jobs: dict[str, int | None] | None = None  # job id -> estimated end

    def add(self, job_id: str, req: Resources, members: int, end: int | None, cost: int) -> None:
        self.cost += cost
        self.done_ms = None if end is None or self.done_ms is None else max(self.done_ms, end)
        self.gpu += req.gpu * members
        self.cpu += req.cpu_milli * members
        self.mem += req.memory_mib * members
        if self.jobs is None:
            self.jobs = {}
        self.jobs[job_id] = end


class Defrag:
    """One pass's drains: which hosts are held, for whom, and which view a gang is placed
    on because of them. ``placed`` is the pass's own dict of the gangs it placed (read as
    it grows); ``estimates`` and ``usage`` (None: no quotas) the pass's."""

    __slots__ = ("_loads", "_seen", "_tried", "_views", "budget", "estimates", "held", "now_ms",
                 "on", "placed", "share", "state", "usage")  # fmt: skip

    def __init__(
        self,
        state: ClusterState,
        now_ms: int,
        estimates: Estimates,
        placed: dict[str, Running],
        usage: QueueUsage | None,
    ) -> None:
        self.state = state
        self.usage = usage
        self.now_ms = now_ms
        self.estimates = estimates
        self.placed = placed
        self.share = state.config.defrag_share_pct
        self.on = self.share > 0 and state.format_floor >= DEFRAG_FORMAT
        self.budget: int | None = None  # nodes that may be held, from the pass's table
        self.held: dict[str, Drain] = {}  # node id -> the drain holding it
        self._loads: dict[str, _Load] | None = None
        self._seen = 0  # gangs of ``placed`` counted in the loads
        self._tried: set[tuple[object, ...]] = set()  # shapes that found no drain
        self._views: dict[tuple[int, frozenset[str]], tuple[View, View]] = {}

    def target(self, job: Job, view: View) -> View:
        """``view`` without the held hosts ``job`` may not use: those of every drain it
        would not end before (by its estimate; one without an estimate ends never)."""
        if not self.held:
            return view
        guess = self.estimates.of(job)
        return self._without(view, job.job_id, None if guess is None else self.now_ms + guess.ms)

    def _without(self, view: View, job_id: str, end_ms: int | None) -> View:
        barred = frozenset(
            node_id
            for node_id, drain in self.held.items()
            if drain.job_id != job_id
            and (end_ms is None or drain.done_ms is None or end_ms > drain.done_ms)
        )
        if not barred:
            return view
        key = (id(view), barred)
        hit = self._views.get(key)
        if hit is None or hit[0] is not view:
            hit = self._views[key] = (view, view.without(barred))
        return hit[1]

    def consider(
        self, gang: Gang, depths: list[int], restricted: View | None, view: View, plan: Plan
    ) -> None:
        """Hold hosts for ``gang``, which found no room, when its free GPUs are scattered
        on ``restricted`` (the pass's view without every reserved node), or in place of its
        own reservation (the plan's last) when that has no start, on ``view`` (the pass's
        view without the nodes of the reservations before it) (module doc): the drain goes
        to ``plan.drains``, its reason to ``plan.reasons``, and its hosts to the
        reservation it replaces."""
        job = gang.job
        made = plan.reservations[-1] if plan.reservations else None
        if not self.on or not gang.req.gpu or gang.spec.nodes is not None or gang.must:
            return
        own = made is not None and made.job_id == job.job_id
        if made is not None and own and made.start_ms is not None:
            return  # it starts at a known time there
        usage = self.usage
        if usage is not None and not usage.within_nominal(gang.spec.queue, gang.req.gpu * gang.n):
            return  # a borrower: draining for it would starve others
        if self.budget is None:
            self.budget = len(view.table.nodes) * self.share // 100
        left = self.budget - len(self.held)
        if left <= 0:
            return
        base = self._without(view if own or restricted is None else restricted, "", None)
        free = base.totals.get(())
        if not own and (
            free is None or free[0] < gang.req.gpu * gang.n or fits(gang, base, depths)
        ):
            return  # short of GPUs, not of where they are; or only held out
        key = (gang.req, gang.n, min(depths), gang.avoid, gang.room, bool(gang.spec.image),
               gang.spec.priority, len(self.held), base.version)  # fmt: skip
        if key in self._tried:
            return
        found = self._cheapest(gang, depths, base, left)
        if found is None:
            self._tried.add(key)
            return
        domain, hosts = found
        loads = self._loads_now()
        ends = {j: e for h in hosts for j, e in (loads[h].jobs or {}).items()}
        known = [e for e in ends.values() if e is not None]
        done = max(known, default=0) if len(known) == len(ends) else None
        last = sorted(j for j, e in ends.items() if e == done)
        drain = Drain(job.job_id, frozenset(hosts), done, tuple(last))
        plan.drains.append(drain)
        for h in hosts:
            self.held[h] = drain
        plan.reasons[job.job_id] = self._reason(gang, domain, sorted(hosts), drain)
        if own:
            plan.reservations[-1] = Reservation(job.job_id, done, drain.nodes)

    def _reason(self, gang: Gang, domain: Domain, hosts: list[str], drain: Drain) -> Reason:
        names = self.state.config.levels_with_host()
        spec = gang.spec
        shown = drain.waits_for[:_SHOWN]
        return reason(
            ReasonCode.DEFRAGMENTING,
            members=gang.n,
            request=spec.resources.describe(),
            level=spec.topology_required or None,
            hosts=", ".join(hosts[:_SHOWN]) + (", ..." if len(hosts) > _SHOWN else ""),
            count=len(hosts),
            domain=describe_domain(domain, names) if domain else None,
            jobs=(", ".join(shown) + (", ..." if len(drain.waits_for) > _SHOWN else "")) or None,
            until_ms=drain.done_ms,
        )

    def _cheapest(
        self, gang: Gang, depths: list[int], base: View, left: int
    ) -> tuple[Domain, list[str]] | None:
        """The domain and hosts to drain (module doc), at most ``left`` hosts."""
        loads = self._loads_now()
        best: tuple[int, int, Domain, list[str]] | None = None
        for depth in sorted(depths, reverse=True):
            for domain, members in _domains(base, depth):
                chosen = self._hosts_in(gang, base, members, loads, left)
                if chosen is None:
                    continue
                cost = sum(loads[h].cost for h in chosen if h in loads)
                if best is None or (cost, len(chosen), domain) < best[:3]:
                    best = (cost, len(chosen), domain, chosen)
            if best is not None:
                return best[2], best[3]
        return None

    def _hosts_in(
        self, gang: Gang, base: View, members: list[str], loads: dict[str, _Load], left: int
    ) -> list[str] | None:
        """The cheapest hosts of one domain whose draining gives ``gang`` room in it, or
        None when no such set of at most ``left`` hosts exists."""
        req, n = gang.req, gang.n
        room = 0
        gains: list[tuple[int, int, str]] = []
        for node_id in members:
            node = base.nodes[node_id]
            if node_id in gang.avoid or (gang.spec.image and not node.images):
                continue
            cap = n if gang.room is NO_CAP else min(n, gang.room.of(node_id))
            now = node.slots(req, cap)
            room += now
            load = loads.get(node_id)
            if load is None or load.priority > gang.spec.priority:
                continue
            gain = _emptied(node, load, req, cap) - now
            if gain > 0:
                gains.append((load.cost, -gain, node_id))
        chosen: list[str] = []
        for _, less, node_id in sorted(gains):
            if room >= n or len(chosen) >= left:
                break
            room -= less
            chosen.append(node_id)
        return chosen if room >= n and chosen else None

    def _loads_now(self) -> dict[str, _Load]:
        """Every host's load: the live attempts', then the gangs the pass placed (those
        placed since the last call added)."""
        loads = self._loads
        now = self.now_ms
        if loads is None:
            loads = self._loads = {}
            for job in self.state.live_jobs():
                attempt = job.attempt
                if attempt is None:
                    continue
                end = self.estimates.end(job)
                start = attempt.started_at_ms
                ran = now - (attempt.bound_at_ms if start is None else start)
                _count(loads, job.job_id, job.spec.priority, reserved_of(job), attempt.members,
                       end, now, ran)  # fmt: skip
        placed = list(self.placed.items())
        for job_id, running in placed[self._seen :]:
            priority = self.state.jobs[job_id].spec.priority
            _count(loads, job_id, priority, running.req, running.members, running.end_ms, now, 0)
        self._seen = len(placed)
        return loads


def _count(
    loads: dict[str, _Load],
    job_id: str,
    priority: int,
    req: Resources,
    members: tuple[MemberPlacement, ...],
    end: int | None,
    now_ms: int,
    ran_ms: int,
) -> None:
    """Add one gang's members to the loads of their hosts."""
    per_host: dict[str, int] = {}
    for m in members:
        per_host[m.node_id] = per_host.get(m.node_id, 0) + 1
    for node_id, count in per_host.items():
        load = loads.get(node_id)
        if load is None:
            load = loads[node_id] = _Load()
        held = max(end - now_ms, 0) if end is not None else max(ran_ms, 0)
        load.add(job_id, req, count, end, req.gpu * count * held)
        load.priority = max(load.priority, priority)


def _emptied(node: NodeFree, load: _Load, req: Resources, cap: int) -> int:
    """How many members of ``req`` ``node`` holds once the gangs on it end, at most ``cap``."""
    have = (node.gpu + load.gpu, node.cpu + load.cpu, node.mem + load.mem)
    asked = (req.gpu, req.cpu_milli, req.memory_mib)
    return max(min([cap, *(h // a for h, a in zip(have, asked, strict=True) if a)]), 0)


def _domains(base: View, depth: int) -> list[tuple[Domain, list[str]]]:
    """The domains of ``base`` at ``depth`` with their hosts in the view (a host's own
    path below the innermost level)."""
    excluded = base.excluded
    if depth > base.levels:
        return [(n.path, [n.node_id]) for n in base.table.at if n.node_id not in excluded]
    return [(d, [h for h in base.members[d] if h not in excluded]) for d in base.domains_at(depth)]


def draining_for(plan: Plan | None, node_id: str) -> Reason | None:
    """A node's reason while a drain of the leader's newest pass (``plan``) holds it: the
    gang it is held for, and until when (None: not held)."""
    for drain in plan.drains if plan is not None else ():
        if node_id in drain.nodes:
            return reason(ReasonCode.DRAINING_FOR, job=drain.job_id, until_ms=drain.done_ms)
    return None
