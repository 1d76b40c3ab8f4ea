"""Why a gang waits, and answers to "why is my job where it is".

Every pending job left unplaced gets a :class:`~synapse_ha.core.reasons.Reason` saying
why, with the numbers as fields (rendered to a sentence only at the edges).
"""

from __future__ import annotations

from synapse_ha.core.feasibility import REFUSES_AT_FORMAT, shortfall
from synapse_ha.core.model import (
    ClusterState,
    JobSpec,
    JobState,
    MemberState,
    Resources,
    topology_path,
)
from synapse_ha.core.node_selector import describe
from synapse_ha.core.queues import estimates as run_estimates
from synapse_ha.core.reasons import Reason, ReasonCode, reason, render
from synapse_ha.core.scheduler.capacity import UNLIMITED, Domain, View
from synapse_ha.core.scheduler.placement import Gang
from synapse_ha.core.scheduler.plan import Plan, Reservation
from synapse_ha.core.topology import describe_domain


class Explainer:
    """Sentences for people: why a gang waits, with the numbers that matter."""

    def __init__(
        self, names: tuple[str, ...], recall: bool = True, state: ClusterState | None = None
    ) -> None:
        self.names = names
        self.state = state
        self.known_unhealthy: int | None = None  # counted once per pass, when first needed
        # Keyed by the view itself too (the views of one pass share a version); holding
        # the view keeps its identity from being reused by a later one in the pass.
        self.cache: dict[tuple[Resources, int, int, View], tuple[int, Domain]] = {}
        # why_waiting's answers: the same for every gang of one shape while the view's
        # capacity (its version) and the reservation stay the same. Off with ``recall``.
        self.recall = recall
        self.reasons: dict[tuple[object, ...], Reason] = {}
        # How long the pass's jobs are expected to run, learned ones worked out once,
        # when first needed (core/queues/estimates.py).
        self.estimates = run_estimates.Estimates(state if state is not None else ClusterState())

    def best_room(self, view: View, req: Resources, depth: int) -> tuple[int, Domain]:
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
                    (n.slots(req, UNLIMITED), n.path)
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
        gang: Gang,
        view: View,
        depths: list[int],
        reservation: Reservation | None,
        now_ms: int,
        behind: Reservation | None = None,
        ahead: int = 0,
    ) -> Reason:
        """Why ``gang`` waits: ``reservation`` is the one it holds (after ``ahead`` others
        of the pass), ``behind`` the one it would fit but for."""
        spec = gang.spec
        req, asked = gang.req, spec.resources
        if not self.recall:
            return self._why_waiting(gang, view, depths, reservation, now_ms, behind, ahead)
        key = (  # plain ints rather than the Resources value: no Python code to hash
            req.gpu,
            req.cpu_milli,
            req.memory_mib,
            asked.cpu_milli,
            asked.memory_mib,
            gang.n,
            spec.topology_required,
            bool(spec.image),
            gang.avoid,
            spec.nodes,
            gang.room,
            min(depths) if spec.topology_required else 0,
            view,
            view.version,
            reservation,
            behind,
            ahead,
            now_ms,
        )
        hit = self.reasons.get(key)
        if hit is None:
            hit = self.reasons[key] = self._why_waiting(
                gang, view, depths, reservation, now_ms, behind, ahead
            )
        return hit

    def _why_waiting(
        self,
        gang: Gang,
        view: View,
        depths: list[int],
        reservation: Reservation | None,
        now_ms: int,
        behind: Reservation | None,
        ahead: int,
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
        depth = min(depths) if spec.topology_required else 0
        room, domain = (
            self.best_room(view, gang.req, depth)
            if spec.nodes is None
            else _selected_room(view, gang.req, depth, gang.avoid)
        )
        have: dict[str, int | str | None] = {
            "room": room,
            "domain": describe_domain(domain, self.names) if domain else None,
            "images": 1 if spec.image else None,
        }
        if spec.resources.gpu:
            have["unhealthy"] = self.unhealthy_gpus() or None
        if view.table.spares:  # left out of the table: say so (core/spares.py)
            have["spares"] = len(view.table.spares)
        if reservation is not None:
            return reason(
                ReasonCode.FIRST_IN_LINE_RESERVED,
                start_in_ms=_start_in(reservation, now_ms),
                ahead=ahead or None,
                **need,
                **have,
            )
        missing = self.never_fits(spec)  # only a gang with no room now may never fit
        if missing is not None:
            return reason(ReasonCode.WAITING_FOR_NODES, missing=missing, **need)
        if room < gang.n:
            return reason(ReasonCode.WAITING_CAPACITY, **need, **have)
        return reason(ReasonCode.WAITING_SHAPE, **need, **have)

    def never_fits(self, spec: JobSpec) -> str | None:
        """What no set of the cluster's nodes has for ``spec``, as a job waiting for nodes
        reads it (None when some set could hold it, or the cluster's format predates the
        reason: a replica of an older release could not read it)."""
        state = self.state
        if state is None or state.format_floor < REFUSES_AT_FORMAT:
            return None
        short = shortfall(state, spec)
        return short.waiting() if short is not None else None

    def unhealthy_gpus(self) -> int:
        """How many GPUs of schedulable nodes are unhealthy: capacity the gang is not
        offered until an operator repairs them (``synctl nodes repair``)."""
        if self.known_unhealthy is None:
            nodes = self.state.nodes.values() if self.state is not None else ()
            self.known_unhealthy = sum(len(n.gpu_faults) for n in nodes if n.schedulable())
        return self.known_unhealthy

    def why_waiting_for_locality(
        self, gang: Gang, view: View, local: list[int], wait_ms: int
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


def _need(gang: Gang) -> dict[str, int | str | None]:
    """The fields every wait reason carries: the gang's size, request, required level and
    node selector, and what a node reserves per member when that is more than the request
    (the floor and the supervisor's share, core/spec/member_limits.py)."""
    asked = gang.spec.resources
    selector = gang.spec.nodes
    return {
        "members": gang.n,
        "request": asked.describe(),
        "reserved": gang.req.describe() if gang.req != asked else None,
        "level": gang.spec.topology_required or None,
        "nodes": describe(selector) if selector is not None else None,
    }


def _selected_room(
    view: View, req: Resources, depth: int, avoid: frozenset[str]
) -> tuple[int, Domain]:
    """:meth:`Explainer.best_room` of a gang with a node selector, on the nodes it may use
    (not in ``avoid``): exact per node, summed per domain (the first in path order of the
    roomiest)."""
    rooms: dict[Domain, int] = {}
    for n in view.table.at:
        if n.node_id not in view.excluded and n.node_id not in avoid:
            domain = n.path[:depth]
            rooms[domain] = rooms.get(domain, 0) + n.slots(req, UNLIMITED)
    best = min(rooms.items(), key=lambda item: (-item[1], item[0]), default=((), 0))
    return best[1], best[0]


def _bound(total: list[int] | None, req: Resources) -> int:
    if total is None:
        return 0
    bounds = [
        t // r
        for t, r in zip(total, (req.gpu, req.cpu_milli, req.memory_mib), strict=True)
        if r > 0
    ]
    return max(min(bounds, default=UNLIMITED), 0)


def _start_in(reservation: Reservation, now_ms: int) -> int | None:
    """How long until the reservation starts; None: once jobs without a time limit end."""
    if reservation.start_ms is None:
        return None
    return max(reservation.start_ms - now_ms, 0)


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
    if now_ms < job.retry_not_before_ms or last_plan is None or job.waiting_for:
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
    or where each member runs. A pending job without a time limit whose queue gives it
    an estimate says so (``backfill estimate: 2h10m (p90 of 12 runs of alice/train in
    gpu)``): what backfill and reservations count on, never a limit."""
    job = state.jobs.get(job_id)
    if job is None:
        return f"no job {job_id!r}"
    if job.state is JobState.PENDING:
        said = render(why_pending(state, job_id, now_ms, last_plan))
        guess = run_estimates.estimate_of(state, job)
        if guess is None or guess.trusted_past_end:
            return said
        return f"{said}\nbackfill estimate: {run_estimates.describe(guess, job)}"
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
