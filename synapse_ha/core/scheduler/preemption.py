"""Choosing preemption victims for one gang that fits neither the free capacity nor its
reservation (DESIGN §8). Pure; works on the pass's capacity table and undoes every
tentative change before it returns.

Who may be a victim (the kinds; ``apply`` verifies the same rules again):

* ``PRIORITY``: the gang's class ``preempts``; victims are live gangs of its own queue
  with strictly lower priority. Their GPUs count towards the queue's quota too.
* ``RECLAIM``: the gang's queue has a quota in a cohort and stays within its nominal
  after taking the gang (counting its gangs already waiting for victims); victims are
  live gangs of the other queues of the cohort that are borrowing, and no victim queue
  is taken below its nominal.

Victims are whole gangs, never already being preempted, never placed by this pass.

How the set is chosen:

* ``TOPOLOGY``: for each domain at the gang's required level (else its preferred level,
  else the whole cluster), candidates with a member in it are added cheapest first
  until the gang can be placed there (within its topology), then each one that turns
  out unneeded is dropped again. The cheapest set over the domains wins: least GPU-time
  lost (GPUs x time since the victim's attempt was bound), then lower highest priority,
  then fewer gangs, then job ids. Only the most promising domains (by a lower bound of
  their cost) are tried, which keeps the search cheap at 10,000 nodes.
* ``BLIND``: candidates lowest priority first, newest first, until enough GPUs are free
  in the whole cluster, wherever they are (the Kueue / Volcano baseline). The gang may
  still not fit afterwards; it waits, with its claim, like any preemptor.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.model import Attempt, ClusterState, Job, PreemptionKind, PreemptionMode
from synapse_ha.core.quota import QueueUsage, gang_request
from synapse_ha.core.scheduler.capacity import Domain, Table, View
from synapse_ha.core.scheduler.placement import Gang, place

MAX_DOMAINS = 8  # domains tried exactly per search, the best by their cost's lower bound


@dataclass(slots=True)
class Candidate:
    """A live gang that might be preempted."""

    job: Job
    attempt: Attempt
    gpus: int  # the whole gang's
    lost_ms: int  # GPU-milliseconds lost if it is preempted now
    priority: int
    queue: str
    nodes: frozenset[str]

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
        gpus = gang_request(job.spec).gpu
        out.append(
            Candidate(
                job,
                attempt,
                gpus,
                gpus * max(now_ms - attempt.bound_at_ms, 0),
                job.spec.priority,
                job.spec.queue,
                frozenset(m.node_id for m in attempt.members),
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
        self, kind: PreemptionKind, allowed: list[Candidate], room: dict[str, int], quota_gap: int
    ) -> None:
        self.kind = kind
        self.allowed = allowed
        # RECLAIM: GPUs each victim queue may lose (what it borrows). Absent: no limit.
        self.room = room
        # PRIORITY: GPUs of victims needed for the gang to fit its own queue's quota.
        self.quota_gap = quota_gap

    def admits(self, chosen: list[Candidate], extra: Candidate) -> bool:
        if extra.queue not in self.room:
            return True
        taken = sum(v.gpus for v in chosen if v.queue == extra.queue) + extra.gpus
        return taken <= self.room[extra.queue]

    def quota_met(self, chosen: list[Candidate]) -> bool:
        return sum(v.gpus for v in chosen) >= self.quota_gap


def rules_for(
    state: ClusterState,
    gang: Gang,
    candidates: list[Candidate],
    usage: QueueUsage | None,
    keeps: QueueUsage,
    claimed: set[str],
) -> list[Rules]:
    """The kinds of preemption open to ``gang``, priority first (it stays within the
    queue), each with its allowed victims. ``keeps``: usage without gangs already being
    preempted, plus the claims of gangs waiting for victims. ``claimed``: victims of
    this pass."""
    spec = gang.spec
    out: list[Rules] = []
    need = gang_request(spec).gpu
    cls = next((p for p in state.config.priority_classes if p.name == spec.priority_class), None)
    if cls is not None and cls.preempts:
        allowed = [
            c
            for c in candidates
            if c.queue == spec.queue and c.priority < spec.priority and c.job_id not in claimed
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
        room: dict[str, int] = {}
        for name in sorted(state.queues):
            other = state.queues[name]
            if name != spec.queue and other.cohort == queue.cohort and other.gpu is not None:
                borrowed = keeps.borrowed(name)
                if borrowed > 0:
                    room[name] = borrowed
        allowed = [
            c for c in candidates if c.queue in room and c.job_id not in claimed and c.gpus > 0
        ]
        if allowed:
            out.append(Rules(PreemptionKind.RECLAIM, allowed, room, 0))
    return out


def choose(
    state: ClusterState,
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    rules: Rules,
    mode: PreemptionMode,
) -> Choice | None:
    """The victims to preempt for ``gang`` under ``rules``, or None when none will do."""
    if mode is PreemptionMode.BLIND:
        return _blind(gang, view, rules)
    return _topology(state, gang, table, view, depths, rules)


def _blind(gang: Gang, view: View, rules: Rules) -> Choice | None:
    free = view.totals.get((), [0, 0, 0])[0]
    need = gang.req.gpu * gang.n
    order = sorted(rules.allowed, key=lambda c: (c.priority, -c.attempt.bound_at_ms, c.job_id))
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


def _search_depth(state: ClusterState, gang: Gang, depths: list[int]) -> int:
    names = state.config.levels_with_host()
    spec = gang.spec
    for level in (spec.topology_required, spec.topology_preferred):
        if level and level in names:
            return names.index(level) + 1
    return min(depths)


def _topology(
    state: ClusterState,
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    rules: Rules,
) -> Choice | None:
    depth = _search_depth(state, gang, depths)
    tries = [depth] if gang.spec.topology_required or depth == min(depths) else [depth, 0]
    need = gang.req.gpu * gang.n
    for d in tries:
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
            cands.sort(key=_sort_key)
            bound, have = 0, free
            for c in cands:
                if have >= need:
                    break
                bound += c.lost_ms
                have += c.gpus
            if have >= need:
                ranked.append((bound, domain))
        ranked.sort()
        best: Choice | None = None
        best_cost: tuple[int, int, int, tuple[str, ...]] | None = None
        for _, domain in ranked[:MAX_DOMAINS]:
            found = _fill(gang, table, view, depths, domains[domain], rules, d, domain)
            if found is None:
                continue
            cost = _cost(list(found.victims))
            if best_cost is None or cost < best_cost:
                best, best_cost = found, cost
        if best is not None:
            return best
    return None


def fits_with(
    gang: Gang, table: Table, view: View, depths: list[int], victims: list[Candidate]
) -> list[tuple[str, int]] | None:
    """Where the gang would go were ``victims`` gone (the table is left unchanged)."""
    mark = table.mark()
    for v in victims:
        for m in v.attempt.members:
            table.adjust(m.node_id, v.job.spec.resources, m.gpus, +1)
    try:
        return place(gang, view, depths)
    finally:
        table.undo(mark)


def _within(hosts: list[tuple[str, int]], table: Table, depth: int, domain: Domain) -> bool:
    return all(table.nodes[h].path[:depth] == domain for h, _ in hosts)


def _fill(
    gang: Gang,
    table: Table,
    view: View,
    depths: list[int],
    cands: list[Candidate],
    rules: Rules,
    depth: int,
    domain: Domain,
) -> Choice | None:
    usable = [d for d in depths if d >= depth]
    chosen: list[Candidate] = []
    hosts: list[tuple[str, int]] | None = None
    # GPUs the domain would have free: a placement is tried only once they suffice.
    have = view.totals.get(domain, [0, 0, 0])[0]
    need = gang.req.gpu * gang.n
    for c in cands:
        if not rules.admits(chosen, c):
            continue
        chosen.append(c)
        have += sum(len(m.gpus) for m in c.attempt.members if m.node_id in table.nodes)
        if not rules.quota_met(chosen) or have < need:
            continue
        hosts = fits_with(gang, table, view, usable, chosen)
        if hosts is not None and _within(hosts, table, depth, domain):
            break
        hosts = None
    if hosts is None:
        return None
    # Drop victims that turn out unneeded, the costliest first.
    for c in sorted(chosen, key=_sort_key, reverse=True):
        if len(chosen) == 1:
            break
        trial = [v for v in chosen if v is not c]
        if not rules.quota_met(trial):
            continue
        again = fits_with(gang, table, view, usable, trial)
        if again is not None and _within(again, table, depth, domain):
            chosen, hosts = trial, again
    return Choice(tuple(chosen), rules.kind, hosts)
