"""Choosing preemption victims for one gang that fits neither the free capacity nor its
reservation (DESIGN §8). Pure; works on the pass's capacity table and undoes every
tentative change before it returns.

Who may be a victim (the kinds; ``apply`` verifies the same rules again):

* ``PRIORITY``: the gang's class ``preempts``; victims are live gangs of its own queue
  with strictly lower priority. Their GPUs count towards the queue's quota too.
* ``RECLAIM``: the gang's queue has a quota in a cohort and stays within its nominal
  after taking the gang (counting its gangs already waiting for victims); victims are
  live gangs of the other queues of its cohort tree that are borrowing, and no victim
  queue is taken below its nominal. The nearest first: the queues of its own cohort
  (siblings), and only if they do not do, those of the cohorts one level up (cousins,
  whose branch of the tree borrows too), and so on (:mod:`synapse_ha.core.queues.cohort_tree`).
* ``FAIR_SHARE``: where a cohort has ``fair_sharing_preemption`` on, live gangs of borrowing
  queues that stay at or above the gang's queue's share, and their nominal, once they have
  lost them (:mod:`synapse_ha.core.queues.fair_preemption`); tried after a reclaim.

Victims are whole gangs (an elastic gang above its ``min`` may be offered as its top ranks
instead: :mod:`.shrink_victims`), never already being preempted, never placed by this pass, and
never within their minimum run time, unless the gang reclaims and has waited past
``reclaim_wait_max_ms`` (:mod:`synapse_ha.core.queues.victim_rules`, which also states the cost).

How the set is chosen:

* ``TOPOLOGY``: for each domain at the gang's required level (else its preferred level,
  else the whole cluster), candidates with a member in it are added cheapest first
  until the gang can be placed there (within its topology), then each one that turns
  out unneeded is dropped again. The cheapest set over the domains wins: least GPU-time
  lost (GPUs x time since the victim's checkpoint mark, or its bind without one), then
  lower highest priority,
  then fewer gangs, then job ids. Only the most promising domains (by a lower bound of
  their cost) are tried, which keeps the search cheap at 10,000 nodes.
* ``BLIND``: candidates lowest priority first, newest first, until enough GPUs are free
  in the whole cluster, wherever they are (the Kueue / Volcano baseline). The gang may
  still not fit afterwards; it waits, with its claim, like any preemptor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from synapse_ha.core.cluster_config import PreemptionKind, PreemptionMode
from synapse_ha.core.model import Attempt, ClusterState, Job, Resources
from synapse_ha.core.queues.cohort_tree import branch
from synapse_ha.core.queues.cohort_tree import distance as tree_distance
from synapse_ha.core.queues.fair_preemption import FairShares
from synapse_ha.core.queues.quota import QueueUsage, gang_request, held_request
from synapse_ha.core.queues.victim_rules import lost_gpu_ms, protected_until_ms, reclaim_overdue
from synapse_ha.core.scheduler.capacity import Domain, Table, View
from synapse_ha.core.scheduler.placement import Gang, place
from synapse_ha.core.spec.member_limits import reserved_of

MAX_DOMAINS = 8  # domains tried exactly per search, the best by their cost's lower bound


@dataclass(slots=True)
class Candidate:
    """A live gang that might be preempted."""

    job: Job
    attempt: Attempt
    gpus: int  # the whole gang's
    lost_ms: int  # GPU-milliseconds lost if it is preempted now (since its mark)
    priority: int
    queue: str
    nodes: frozenset[str]
    protected_until_ms: int = 0  # its minimum run time ends then
    # A shrink (core/scheduler/shrink_victims.py): the members it keeps; its attempt here
    # holds only the top ranks it gives back. 0: the whole gang.
    shrink_to: int = 0

    @property
    def job_id(self) -> str:
        return self.job.job_id


def live_candidates(state: ClusterState, now_ms: int) -> list[Candidate]:
    """Every live gang not already being preempted, in job id order."""
    out = []
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        attempt = job.live_attempt()
        if attempt is None or attempt.preempted_by:
            continue
        gpus = held_request(job, attempt, counting_leaving=False).gpu  # what its queue keeps
        out.append(
            Candidate(
                job,
                attempt,
                gpus,
                lost_gpu_ms(attempt, gpus, now_ms),
                job.spec.priority,
                job.spec.queue,
                frozenset(m.node_id for m in attempt.members),
                protected_until_ms(state, job, attempt),
            )
        )
    return out


def _cost(victims: list[Candidate]) -> tuple[int, int, int, tuple[str, ...]]:
    return (
        sum(v.lost_ms for v in victims),
        max((v.priority for v in victims), default=0),
        len(victims),
        tuple(sorted(v.job_id for v in victims)),
    )


def _sort_key(c: Candidate) -> tuple[int, int, str]:
    return (c.lost_ms, c.priority, c.job_id)


@dataclass(frozen=True, slots=True)
class Choice:
    victims: tuple[Candidate, ...]
    kind: PreemptionKind
    hosts: list[tuple[str, int]] | None  # where the gang goes once they stop (TOPOLOGY)


class Rules:
    """Which candidates a gang may preempt, and the per-queue limits (reclaim)."""

    def __init__(
        self,
        kind: PreemptionKind,
        allowed: list[Candidate],
        room: dict[str, int],
        quota_gap: int,
        distance: dict[str, int] | None = None,
        fair: FairShares | None = None,
    ) -> None:
        self.kind = kind
        self.allowed = allowed
        # RECLAIM: GPUs each victim queue may lose (what it borrows). Absent: no limit.
        self.room = room
        # PRIORITY: GPUs of victims needed for the gang to fit its own queue's quota.
        self.quota_gap = quota_gap
        # RECLAIM: each victim queue's distance in the cohort tree (0: a sibling).
        self.distance = distance or {}
        # FAIR_SHARE: the share, nominal and quota rules every victim set must pass.
        self.fair = fair

    def key(self, c: Candidate) -> tuple[int, int, int, str]:
        """Candidates nearest in the cohort tree first, then cheapest first."""
        return (self.distance.get(c.queue, 0), *_sort_key(c))

    def admits(self, chosen: list[Candidate], extra: Candidate) -> bool:
        if self.fair is not None:
            return not self.fair.problem(_taken([*chosen, extra]))
        if extra.queue not in self.room:
            return True
        taken = sum(v.gpus for v in chosen if v.queue == extra.queue) + extra.gpus
        return taken <= self.room[extra.queue]

    def quota_met(self, chosen: list[Candidate]) -> bool:
        if self.fair is not None:
            return not self.fair.quota_problem(_taken(chosen))
        return sum(v.gpus for v in chosen) >= self.quota_gap


def _taken(victims: list[Candidate]) -> list[tuple[str, Resources]]:
    """What each victim's queue gives up: what its attempt is charged for (an elastic
    gang's members, or a shrink's members given back), as apply counts it."""
    return [(v.queue, held_request(v.job, v.attempt, counting_leaving=False)) for v in victims]


def rules_for(
    state: ClusterState,
    gang: Gang,
    candidates: list[Candidate],
    usage: QueueUsage | None,
    keeps: QueueUsage,
    claimed: set[str],
    now_ms: int,
) -> list[Rules]:
    """The kinds of preemption open to ``gang``, priority first (it stays within the
    queue), each with its allowed victims. ``keeps``: usage without gangs already being
    preempted, plus the claims of gangs waiting for victims. ``claimed``: victims of
    this pass. Gangs within their minimum run time at ``now_ms`` are left out, but for
    a reclaim that has waited past its limit."""
    spec = gang.spec
    overdue = reclaim_overdue(state, gang.job, now_ms)
    candidates = [c for c in candidates if c.protected_until_ms <= now_ms or overdue]
    out: list[Rules] = []
    need = gang_request(spec).gpu
    cls = next((p for p in state.config.priority_classes if p.name == spec.priority_class), None)
    if cls is not None and cls.preempts:
        allowed = [
            c
            for c in candidates
            if c.queue == spec.queue
            and c.priority < spec.priority
            and c.job_id not in claimed
            and c.protected_until_ms <= now_ms
        ]
        headroom = usage.headroom_gpu(spec.queue) if usage is not None else None
        gap = 0 if headroom is None else max(0, need - headroom)
        if allowed:
            out.append(Rules(PreemptionKind.PRIORITY, allowed, {}, gap))
    queue = state.queues.get(spec.queue)
    if (
        queue is not None
        and queue.gpu is not None
        and queue.cohort
        and keeps.within_nominal(spec.queue, need)
    ):
        room, distance = _reclaim_room(state, queue.name, queue.cohort, keeps)
        allowed = [
            c for c in candidates if c.queue in room and c.job_id not in claimed and c.gpus > 0
        ]
        # Siblings' borrowing first; a farther level only if the nearer ones do not do.
        for level in sorted({distance[c.queue] for c in allowed}):
            near = [c for c in allowed if distance[c.queue] <= level]
            out.append(Rules(PreemptionKind.RECLAIM, near, room, 0, distance))
    fair = FairShares.for_gang(state, keeps, now_ms, spec.queue, gang_request(spec))
    if fair is not None:
        allowed = [
            c
            for c in candidates
            if c.job_id not in claimed
            and c.gpus > 0
            and c.protected_until_ms <= now_ms  # a reclaim's overdue exception is not its
            and not fair.open_to(c.queue)
        ]
        if allowed:
            out.append(Rules(PreemptionKind.FAIR_SHARE, allowed, {}, 0, fair=fair))
    return out


def _reclaim_room(
    state: ClusterState, name: str, cohort: str, keeps: QueueUsage
) -> tuple[dict[str, int], dict[str, int]]:
    """The queues a reclaim for queue ``name`` (of ``cohort``) may take from, each with
    the GPUs it borrows and its distance in the cohort tree (the levels from the farther
    of the two cohorts up to their nearest common one: 0 for a sibling): every other
    queue of the tree that borrows, where for a queue below the common cohort the
    branch just below it borrows too (what the queue holds came from above; a queue
    that sits in the common cohort itself is its own branch)."""
    room: dict[str, int] = {}
    distance: dict[str, int] = {}
    for other_name in sorted(state.queues):
        other = state.queues[other_name]
        if other_name == name or other.gpu is None or not other.cohort:
            continue
        level = tree_distance(cohort, other.cohort, state.cohorts)
        borrowed = keeps.borrowed(other_name)
        if level is None or borrowed <= 0:
            continue
        up = _depth_to(other.cohort, cohort, state)
        if up > 0:
            below = branch(other.cohort, up - 1, state.cohorts)
            if not below or keeps.tree.cohort_figures(below)[1] <= 0:
                continue
        room[other_name] = borrowed
        distance[other_name] = max(level, up)
    return room, distance


def _depth_to(cohort: str, other: str, state: ClusterState) -> int:
    """Levels from ``cohort`` up to its nearest common cohort with ``other``."""
    level = tree_distance(cohort, other, state.cohorts)
    return level if level is not None else 0


def protected_blockers(
    candidates: list[Candidate], now_ms: int, rules_at: Callable[[int], list[Rules]]
) -> tuple[list[Candidate], PreemptionKind | None]:
    """The gangs a gang may preempt but for their minimum run time at ``now_ms`` (as
    ``rules_at``, the gang's :func:`rules_for` at a time, allows them once every
    protection has ended), with the kind."""
    later = max((c.protected_until_ms for c in candidates), default=now_ms)
    if later <= now_ms:
        return [], None
    for rules in rules_at(later):
        protected = [c for c in rules.allowed if c.protected_until_ms > now_ms]
        if protected:
            return protected, rules.kind
    return [], None


def choose(
    state: ClusterState,
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    rules: Rules,
    mode: PreemptionMode,
    budget: Budget | None = None,
) -> Choice | None:
    """The victims to preempt for ``gang`` under ``rules``, or None when none will do.
    ``budget`` bounds the placement attempts (shared by the searches of a pass)."""
    if mode is PreemptionMode.BLIND:
        return _blind(gang, view, rules)
    return _topology(state, gang, table, view, depths, rules, budget or Budget(MAX_TRIALS_PER_PASS))


def _blind(gang: Gang, view: View, rules: Rules) -> Choice | None:
    free = view.totals.get((), [0, 0, 0])[0]
    need = gang.req.gpu * gang.n
    order = sorted(
        rules.allowed,
        key=lambda c: (
            rules.distance.get(c.queue, 0),
            c.priority,
            -c.attempt.bound_at_ms,
            c.job_id,
        ),
    )
    chosen: list[Candidate] = []
    for c in order:
        if free >= need and rules.quota_met(chosen):
            break
        if not rules.admits(chosen, c):
            continue
        chosen.append(c)
        free += c.gpus
    if not chosen or free < need or not rules.quota_met(chosen):
        return None
    return Choice(tuple(chosen), rules.kind, None)


def _search_levels(state: ClusterState, gang: Gang, depths: list[int]) -> list[int]:
    """Domain depths searched for victims, in order: the required level alone; else the
    preferred level, then the whole cluster; a gang with no topology tries the tightest
    levels above the host first (rack, block, ...) and the whole cluster last, so its
    victims come from one domain, as its placement would, not from anywhere."""
    names = state.config.levels_with_host()
    spec = gang.spec
    if spec.topology_required and spec.topology_required in names:
        return [names.index(spec.topology_required) + 1]
    shallowest = min(depths)
    if spec.topology_preferred and spec.topology_preferred in names:
        depth = names.index(spec.topology_preferred) + 1
        return [depth] if depth == shallowest else [depth, shallowest]
    deepest_domain = len(names) - 1  # the innermost level above hosts
    return [d for d in range(deepest_domain, shallowest - 1, -1) if d >= shallowest]


class Budget:
    """Placement attempts left for the victim searches of one pass (a count, so the
    plan never depends on time)."""

    def __init__(self, trials: int) -> None:
        self.trials = trials

    def take(self) -> bool:
        if self.trials <= 0:
            return False
        self.trials -= 1
        return True


MAX_TRIALS_PER_PASS = 400  # placement attempts for victim searches in one pass
MAX_TRIALS_PER_SEARCH = 48  # of which one gang's search may use


def _topology(
    state: ClusterState,
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    rules: Rules,
    budget: Budget,
) -> Choice | None:
    need = gang.req.gpu * gang.n
    allowance = min(MAX_TRIALS_PER_SEARCH, budget.trials)
    own = Budget(allowance)
    try:
        for d in _search_levels(state, gang, depths):
            best = _best_at(gang, table, view, depths, rules, d, need, own)
            if best is not None:
                return best
        return None
    finally:
        budget.trials -= allowance - own.trials


def _best_at(
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    rules: Rules,
    d: int,
    need: int,
    budget: Budget,
) -> Choice | None:
    """The cheapest victim set over the most promising domains at depth ``d``."""
    domains: dict[Domain, list[Candidate]] = {}
    for c in rules.allowed:
        seen: set[Domain] = set()
        for node_id in c.nodes:
            n = table.nodes.get(node_id)
            if n is not None and n.path[:d] not in seen:
                seen.add(n.path[:d])
                domains.setdefault(n.path[:d], []).append(c)
    ranked: list[tuple[int, Domain]] = []
    for domain, cands in domains.items():
        free = view.totals.get(domain, [0, 0, 0])[0]
        cands.sort(key=rules.key)
        bound, have = 0, free
        for c in cands:
            if have >= need:
                break
            bound += c.lost_ms
            have += _gpus_in(c, table, d, domain)
        if have >= need:
            ranked.append((bound, domain))
    ranked.sort()
    best: Choice | None = None
    best_cost: tuple[int, int, int, tuple[str, ...]] | None = None
    for _, domain in ranked[:MAX_DOMAINS]:
        found = _fill(gang, table, view, depths, domains[domain], rules, d, domain, budget)
        if found is None:
            continue
        cost = _cost(list(found.victims))
        if best_cost is None or cost < best_cost:
            best, best_cost = found, cost
    return best


def _gpus_in(c: Candidate, table: Table, depth: int, domain: Domain) -> int:
    """GPUs a victim would free inside ``domain``."""
    return sum(
        len(m.gpus)
        for m in c.attempt.members
        if m.node_id in table.nodes and table.nodes[m.node_id].path[:depth] == domain
    )


def _release(table: Table, victims: list[Candidate]) -> None:
    for v in victims:
        for m in v.attempt.members:
            if m.node_id in table.nodes:
                table.adjust(m.node_id, reserved_of(v.job), m.gpus, +1)


def fits_with(
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    victims: list[Candidate],
    within: Domain = (),
) -> list[tuple[str, int]] | None:
    """Where the gang would go were ``victims`` gone (the table is left unchanged);
    with ``within``, only inside that domain."""
    mark = table.mark()
    _release(table, victims)
    try:
        return place(gang, view, depths, within)
    finally:
        table.undo(mark)


def _fill(
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    cands: list[Candidate],
    rules: Rules,
    depth: int,
    domain: Domain,
    budget: Budget,
) -> Choice | None:
    usable = [d for d in depths if d >= depth]
    chosen: list[Candidate] = []
    hosts: list[tuple[str, int]] | None = None
    need = gang.req.gpu * gang.n
    mark = table.mark()
    try:
        # Victims are released one by one, cheapest first; a placement is tried only
        # once the domain's free GPUs and GPU slots (members of the gang's size the
        # free GPUs of its nodes could hold) suffice: both are necessary conditions.
        for c in cands:
            if not rules.admits(chosen, c):
                continue
            chosen.append(c)
            _release(table, [c])
            if not rules.quota_met(chosen):
                continue
            if view.totals.get(domain, [0, 0, 0])[0] < need:
                continue
            if gang.req.gpu and view.gpu_slots(domain, gang.req.gpu) < gang.n:
                continue
            if not budget.take():
                return None
            hosts = place(gang, view, usable, domain)
            if hosts is not None:
                break
    finally:
        table.undo(mark)
    if hosts is None:
        return None
    # Drop victims that turn out unneeded, the costliest first.
    for c in sorted(chosen, key=rules.key, reverse=True):
        if len(chosen) == 1:
            break
        trial = [v for v in chosen if v is not c]
        if not rules.quota_met(trial) or not budget.take():
            continue
        again = fits_with(gang, table, view, usable, trial, domain)
        if again is not None:
            chosen, hosts = trial, again
    return Choice(tuple(chosen), rules.kind, hosts)
