"""The simulation loop: arrivals and completions on a simulated clock, each scheduling
pass planned by a policy and bound through the real ``apply``.

A pass runs at every moment something happened (arrivals, ends) while jobs wait, and
at the time a policy asks to plan again (a gang's locality wait ending).
Metrics, per policy:

* ``gpu_allocation``: time-weighted share of GPUs bound to gangs, first arrival to last
  event.
* ``queue_delay_s``: arrival until bound; ``queue_delay_big_gangs_s`` the same for gangs
  of at least 64 GPUs, ``queue_delay_rack_fitting_gangs_s`` for the rack-fitting gangs
  below (those a locality wait may hold back). ``job_completion_s``: arrival until the job ended.
* Locality, for multi-member gangs: ``multi_node_in_one_rack``/``_block`` is the share of
  gangs spread over several hosts that stayed in one rack/block.
  ``rack_fitting_gangs_in_one_rack`` judges against rack *size*: of the gangs no larger
  than the largest rack, the share placed in one rack (a gang bound while every rack was
  partly busy counts as a miss). ``gangs_with_rack_room_at_bind_in_one_rack`` judges
  against *free* capacity: of the gangs bound while some rack had room for all their
  members (ignoring reservations), the share placed in one rack.
* ``fragmentation_gpus``: time-weighted free GPUs on nodes whose free GPUs are fewer than
  the smallest per-member GPU request among waiting jobs (counted while jobs wait).
* ``scheduler_cpu_ms_per_decision``: process CPU time inside the policy divided by the
  number of pending jobs it considered, summed over passes.
"""

from __future__ import annotations

import heapq
import statistics
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterConfig, ClusterState, Job, JobState
from synapse_ha.core.reasons import render
from synapse_ha.sim.fairness import Loss, TenancyMeter, gpu_hours_lost, summary
from synapse_ha.sim.policies import Policy
from synapse_ha.sim.workload import Workload

ARRIVE, FINISH, EXPIRE, WAKE, STOP = 0, 1, 2, 3, 4
BIG_GANG_GPUS = 64
GRACE_MS = 30_000  # how long a preempted gang takes to stop (its whole grace period)
SIGTERM_EXIT = 143  # the exit code a member stopped by SIGTERM reports


@dataclass(slots=True)
class _Record:
    arrival_ms: int
    gpus: int
    members: int
    duration_ms: int
    start_ms: int | None = None
    end_ms: int | None = None
    racks: int = 0
    blocks: int = 0
    hosts: int = 0
    fits_one_rack: bool = False  # the gang is no larger than the largest rack
    rack_had_room: bool = False  # some rack had room for the whole gang when it was bound
    queue: str = ""
    topology: bool = False  # the spec names a required or preferred topology level
    starts: int = 0  # attempts bound (more than one when preempted and placed again)
    preempting_since_ms: int | None = None  # when it first made victims, as a preemptor
    preemptor_wait_ms: int | None = None  # first victims chosen until it was bound


@dataclass(slots=True)
class Result:
    policy: str
    workload: str
    metrics: dict[str, Any]
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    delays_s: list[float] = field(default_factory=list)


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def simulate(
    workload: Workload,
    policy: Policy,
    purge_every: int = 500,
    config: ClusterConfig | None = None,
    grace_ms: int = GRACE_MS,
    pass_interval_ms: int = 0,
) -> Result:
    """Replay ``workload`` under ``policy``; every job runs to completion or its limit.

    ``config`` is the simulated cluster's configuration (default: the defaults, with
    finished jobs purged at once); a configuration ``apply`` refuses raises ValueError.
    The workload's queues are set through ``apply`` first (one refused raises ValueError).

    Preemption: the policy's ``Preempt`` commands are applied after its bind; every
    member of a victim exits (code 143, as after SIGTERM) ``grace_ms`` later, which
    confirms it stopped, unless its own end comes first. A requeued victim runs its whole
    duration again when placed again (no checkpoints).

    ``pass_interval_ms``: 0 plans at every instant something happened (and at the
    policy's wake time); otherwise passes run only at multiples of it, as a leader
    planning on a period does.
    """
    if not policy.topology_aware:
        workload = workload.without_topology()
    state = ClusterState()
    configured = apply(state, c.Configure(config or ClusterConfig(retention_ms=0)))
    if not configured.ok:
        raise ValueError(f"cluster configuration: {configured.message}")
    for queue in workload.queues:
        set_queue = apply(state, c.SetQueue(queue, 0, "sim"))
        if not set_queue.ok:
            raise ValueError(f"queue {queue.name}: {set_queue.message}")
    for info in workload.nodes:
        result = apply(state, c.RegisterNode(info, 0))
        if not result.ok:
            raise ValueError(f"node {info.node_id}: {result.message}")
    total_gpus = workload.total_gpus
    rack_gpus: dict[str, int] = {}
    rack_of = {n.node_id: dict(n.topology).get("rack", "-") for n in workload.nodes}
    block_of = {n.node_id: dict(n.topology).get("block", "-") for n in workload.nodes}
    for n in workload.nodes:
        rack_gpus[rack_of[n.node_id]] = rack_gpus.get(rack_of[n.node_id], 0) + n.capacity.gpu
    largest_rack = max(rack_gpus.values(), default=0)
    rack_nodes: dict[str, list[str]] = {}
    for n in workload.nodes:
        rack_nodes.setdefault(rack_of[n.node_id], []).append(n.node_id)

    events: list[tuple[int, int, int, str]] = []
    for i, job in enumerate(workload.jobs):
        heapq.heappush(events, (job.arrival_ms, i, ARRIVE, str(i)))
    seq = len(workload.jobs)
    records: dict[str, _Record] = {}
    index_of: dict[str, int] = {}
    allocated = 0
    last_t = 0
    alloc_area = 0.0
    frag_area = 0.0
    queue_area = 0.0
    series_alloc: list[tuple[float, float]] = []
    series_queue: list[tuple[float, float]] = []
    cpu_in_policy = 0.0
    decisions = 0
    passes = 0
    applied = 0
    pending: dict[str, int] = {}  # pending job id -> GPUs per member
    free = _FreeGpus(state)
    wakes: set[int] = set()  # times of WAKE events in the queue
    usage: Counter[str] = Counter()  # queue -> GPUs its live attempts hold
    nominal = {q.name: q.gpu for q in workload.queues if q.gpu}
    meter = TenancyMeter(workload.queues) if workload.queues else None
    losses: list[Loss] = []
    preempt_commands = 0
    preempt_rejected = 0
    victims_by_kind: Counter[str] = Counter()
    wall_start = time.perf_counter()

    def released(job_id: str) -> None:
        """The job's attempt stopped holding resources: free them; a requeued job waits
        again, any other has ended."""
        rec = records[job_id]
        nonlocal allocated
        allocated -= rec.gpus
        usage[rec.queue] -= rec.gpus
        job = state.jobs[job_id]
        free.update(state, job)
        if job.state is JobState.PENDING:
            pending[job_id] = job.spec.resources.gpu
        else:
            rec.end_ms = now

    while events:
        now = events[0][0]
        pending_count = len(pending)
        dt = now - last_t
        alloc_area += allocated * dt
        queue_area += pending_count * dt
        frag_area += free.unusable(pending.values()) * dt if pending_count else 0.0
        last_t = now
        while events and events[0][0] == now:
            _, _, kind, key = heapq.heappop(events)
            if kind == WAKE:
                wakes.discard(now)
            elif kind == ARRIVE:
                job = workload.jobs[int(key)]
                res = apply(state, c.SubmitJob(job.spec, f"sim-{key}", now, owner=job.user))
                if not res.ok:
                    raise ValueError(f"job {job.spec.name}: {res.message}")
                records[res.job_id] = _Record(
                    arrival_ms=now,
                    gpus=job.spec.resources.gpu * job.spec.replicas,
                    members=job.spec.replicas,
                    duration_ms=job.duration_ms,
                    fits_one_rack=job.spec.resources.gpu * job.spec.replicas <= largest_rack,
                    queue=job.spec.queue,
                    topology=bool(job.spec.topology_required or job.spec.topology_preferred),
                )
                index_of[res.job_id] = int(key)
                pending[res.job_id] = job.spec.resources.gpu
            else:
                job_id, token = key.rsplit("@", 1)
                record = state.jobs.get(job_id)
                if (
                    record is None
                    or record.fencing_token != int(token)
                    or not record.state.holds_resources
                ):
                    continue
                if kind == EXPIRE:
                    apply(state, c.ExpireTimeLimit(job_id, int(token), now))
                elif kind == STOP:
                    _report_all(
                        state, job_id, int(token), c.MemberEventKind.EXITED, now, SIGTERM_EXIT
                    )
                else:
                    _report_all(state, job_id, int(token), c.MemberEventKind.EXITED, now)
                if not state.jobs[job_id].state.holds_resources:
                    released(job_id)
            applied += 1
        off_period = pass_interval_ms > 0 and now % pass_interval_ms != 0
        if pending and off_period:
            tick = now - now % pass_interval_ms + pass_interval_ms
            if tick not in wakes:
                wakes.add(tick)
                seq += 1
                heapq.heappush(events, (tick, seq, WAKE, ""))
        elif pending:
            t0 = time.process_time()
            command = policy.plan(state, now)
            cpu_in_policy += time.process_time() - t0
            passes += 1
            decisions += pending_count
            if command is not None:
                bound = []
                # One placement at a time (as apply does within one plan), so that the
                # room each gang had is judged on the cluster it was bound into.
                for placement in command.placements:
                    rec = records[placement.job_id]
                    had_room = (
                        rec.members > 1
                        and rec.fits_one_rack
                        and _some_rack_has_room(state, placement.job_id, rack_nodes)
                    )
                    one = c.BindPlan((placement,), (), command.now_ms)
                    if apply(state, one).bound:
                        rec.rack_had_room = had_room
                        bound.append(placement.job_id)
                if command.reasons:
                    apply(state, c.BindPlan((), command.reasons, command.now_ms))
                for job_id in bound:
                    del pending[job_id]
                    free.update(state, state.jobs[job_id])
                    rec = records[job_id]
                    if rec.start_ms is None:
                        rec.start_ms = now
                    rec.starts += 1
                    if rec.preempting_since_ms is not None and rec.preemptor_wait_ms is None:
                        rec.preemptor_wait_ms = now - rec.preempting_since_ms
                    allocated += rec.gpus
                    usage[rec.queue] += rec.gpus
                    attempt = state.jobs[job_id].attempt
                    assert attempt is not None
                    nodes = {m.node_id for m in attempt.members}
                    rec.hosts = len(nodes)
                    rec.racks = len({rack_of[n] for n in nodes})
                    rec.blocks = len({block_of[n] for n in nodes})
                    _report_all(
                        state, job_id, attempt.fencing_token, c.MemberEventKind.STARTED, now
                    )
                    spec = state.jobs[job_id].spec
                    run = workload.jobs[index_of[job_id]].duration_ms
                    tag = f"{job_id}@{attempt.fencing_token}"
                    seq += 1
                    if spec.time_limit_ms and spec.time_limit_ms < run:
                        heapq.heappush(events, (now + spec.time_limit_ms, seq, EXPIRE, tag))
                    else:
                        heapq.heappush(events, (now + run, seq, FINISH, tag))
            # Preemptions go after the bind, as the leader proposes them.
            for preempt in policy.preempts:
                preempt_commands += 1
                victims = [
                    (v, state.jobs[v.job_id].attempt)
                    for v in preempt.victims
                    if v.job_id in state.jobs
                ]
                if not apply(state, preempt).ok:
                    preempt_rejected += 1
                    continue
                rec = records[preempt.preemptor]
                if rec.preempting_since_ms is None:
                    rec.preempting_since_ms = now
                for victim, attempt in victims:
                    assert attempt is not None
                    ran_from = attempt.started_at_ms or attempt.bound_at_ms
                    losses.append(Loss(records[victim.job_id].gpus, now - ran_from))
                    victims_by_kind[str(preempt.kind)] += 1
                    seq += 1
                    tag = f"{victim.job_id}@{victim.fencing_token}"
                    heapq.heappush(events, (now + grace_ms, seq, STOP, tag))
            wake = policy.wake_ms
            if wake is not None and wake > now and wake not in wakes:
                wakes.add(wake)
                seq += 1
                heapq.heappush(events, (wake, seq, WAKE, ""))
        if applied % purge_every == 0:
            apply(state, c.PurgeFinished(now))
        series_alloc.append((now / 3_600_000, allocated / total_gpus))
        series_queue.append((now / 3_600_000, float(pending_count)))
        if meter is not None:
            smallest: dict[str, int] = {}
            for job_id in pending:
                rec = records[job_id]
                if rec.gpus < smallest.get(rec.queue, rec.gpus + 1):
                    smallest[rec.queue] = rec.gpus
            starved = [
                q for q, g in smallest.items() if q in nominal and usage[q] + g <= nominal[q]
            ]
            meter.observe(now, usage, smallest, starved)

    wall = time.perf_counter() - wall_start
    span = max(last_t - min((r.arrival_ms for r in records.values()), default=0), 1)
    done = [r for r in records.values() if r.start_ms is not None]
    delays = [(r.start_ms - r.arrival_ms) / 1000 for r in done if r.start_ms is not None]
    big = [
        (r.start_ms - r.arrival_ms) / 1000
        for r in done
        if r.start_ms is not None and r.gpus >= BIG_GANG_GPUS
    ]
    could_rack = [r for r in done if r.members > 1 and r.fits_one_rack]
    jct = [(r.end_ms - r.arrival_ms) / 1000 for r in done if r.end_ms is not None]
    multi = [r for r in done if r.members > 1 and r.hosts > 1]
    rack_had_room = [r for r in done if r.rack_had_room]
    metrics: dict[str, Any] = {
        "jobs": len(records),
        "jobs_started": len(done),
        "gpu_allocation": round(alloc_area / (total_gpus * span), 4),
        "queue_delay_s": _summary(delays),
        "queue_delay_big_gangs_s": _summary(big),
        "queue_delay_rack_fitting_gangs_s": _summary(
            [(r.start_ms - r.arrival_ms) / 1000 for r in could_rack if r.start_ms is not None]
        ),
        "job_completion_s": _summary(jct),
        "mean_queue_length": round(queue_area / span, 2),
        "multi_node_gangs": len(multi),
        "multi_node_in_one_rack": _share(sum(1 for r in multi if r.racks == 1), len(multi)),
        "multi_node_in_one_block": _share(sum(1 for r in multi if r.blocks == 1), len(multi)),
        "rack_fitting_gangs": len(could_rack),
        "rack_fitting_gangs_in_one_rack": _share(
            sum(1 for r in could_rack if r.racks == 1), len(could_rack)
        ),
        "gangs_with_rack_room_at_bind": len(rack_had_room),
        "gangs_with_rack_room_at_bind_in_one_rack": _share(
            sum(1 for r in rack_had_room if r.racks == 1), len(rack_had_room)
        ),
        "fragmentation_gpus": round(frag_area / span, 2),
        "scheduler_cpu_ms_per_decision": round(1000 * cpu_in_policy / max(decisions, 1), 4),
        "scheduling_passes": passes,
        "wall_s": round(wall, 2),
        "never_started": sorted(
            f"{j.job_id}: {render(j.reason)}"
            for j in state.jobs.values()
            if j.state is JobState.PENDING
        )[:5],
    }
    series = {"allocation": series_alloc, "queue": series_queue}
    if meter is not None:
        metrics["tenancy"] = _tenancy_metrics(
            meter, last_t, records, losses, preempt_commands, preempt_rejected, victims_by_kind
        )
        series.update({f"share:{q}": points for q, points in meter.series.items()})
    return Result(policy.name, workload.name, metrics, series, delays)


def _tenancy_metrics(
    meter: TenancyMeter,
    end_ms: int,
    records: dict[str, _Record],
    losses: list[Loss],
    commands: int,
    rejected: int,
    victims_by_kind: Counter[str],
) -> dict[str, Any]:
    """Multi-tenancy figures (see :mod:`synapse_ha.sim.fairness`)."""
    out = meter.finish(end_ms)
    delays: dict[str, list[float]] = {}
    for r in records.values():
        if r.start_ms is not None:
            delays.setdefault(r.queue, []).append((r.start_ms - r.arrival_ms) / 1000)
    preemptors = [r for r in records.values() if r.preempting_since_ms is not None]
    placed = [r for r in preemptors if r.preemptor_wait_ms is not None]
    with_topology = [r for r in placed if r.topology and r.members > 1 and r.fits_one_rack]
    out.update(
        {
            "preemptions": sum(victims_by_kind.values()),
            "preemptions_by_kind": dict(sorted(victims_by_kind.items())),
            "preempt_commands": commands,
            "preempt_commands_rejected": rejected,
            "requeued_jobs": sum(1 for r in records.values() if r.starts > 1),
            "gpu_hours_lost": round(gpu_hours_lost(losses), 3),
            "preemptors": len(preemptors),
            "preemptors_placed": len(placed),
            "preemptor_wait_s": summary(
                [r.preemptor_wait_ms / 1000 for r in placed if r.preemptor_wait_ms is not None]
            ),
            "preemptors_with_topology": len(with_topology),
            "preemptors_with_topology_in_one_rack": _share(
                sum(1 for r in with_topology if r.racks == 1), len(with_topology)
            ),
            "queue_delay_by_queue_s": {q: summary(d) for q, d in sorted(delays.items())},
        }
    )
    return out


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 1),
        "p50": round(_pct(values, 0.50), 1),
        "p95": round(_pct(values, 0.95), 1),
        "p99": round(_pct(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


class _FreeGpus:
    """Free GPUs per schedulable node, kept in step with binds and releases."""

    def __init__(self, state: ClusterState) -> None:
        self.by_node = {nid: n.free.gpu for nid, n in state.nodes.items() if n.schedulable()}
        self.count: Counter[int] = Counter(self.by_node.values())  # free GPUs -> nodes

    def update(self, state: ClusterState, job: Job) -> None:
        """Re-read the free GPUs of the nodes ``job``'s attempt was bound to."""
        attempt = job.attempt
        assert attempt is not None
        for node_id in {m.node_id for m in attempt.members}:
            old = self.by_node.get(node_id)
            if old is None:
                continue
            new = state.nodes[node_id].free.gpu
            self.count[old] -= 1
            self.count[new] += 1
            self.by_node[node_id] = new

    def unusable(self, waiting_gpus: Iterable[int]) -> int:
        """Free GPUs on nodes where no waiting gang could place even one member."""
        smallest = min((g for g in waiting_gpus if g > 0), default=0)
        return sum(free * nodes for free, nodes in self.count.items() if 0 < free < smallest)


def _some_rack_has_room(state: ClusterState, job_id: str, rack_nodes: dict[str, list[str]]) -> bool:
    """Whether one rack's free capacity could hold every member of the pending job now."""
    spec = state.jobs[job_id].spec
    req, n = spec.resources, spec.replicas
    for node_ids in rack_nodes.values():
        room = 0
        for node_id in node_ids:
            node = state.nodes[node_id]
            if not node.schedulable():
                continue
            free = node.free
            fit = [
                have // need
                for have, need in (
                    (free.gpu, req.gpu),
                    (free.cpu_milli, req.cpu_milli),
                    (free.memory_mib, req.memory_mib),
                )
                if need
            ]
            room += min(fit, default=n)
            if room >= n:
                return True
    return False


def _report_all(
    state: ClusterState,
    job_id: str,
    token: int,
    kind: c.MemberEventKind,
    now: int,
    exit_code: int = 0,
) -> None:
    """Report every member of the attempt started (or exited with ``exit_code``), node
    by node."""
    attempt = state.jobs[job_id].attempt
    assert attempt is not None
    by_node: dict[str, list[c.MemberEvent]] = {}
    for m in attempt.members:
        by_node.setdefault(m.node_id, []).append(
            c.MemberEvent(job_id, token, m.rank, kind, exit_code)
        )
    for node_id, events in sorted(by_node.items()):
        apply(state, c.ReportMembers(node_id, tuple(events), now_ms=now))
