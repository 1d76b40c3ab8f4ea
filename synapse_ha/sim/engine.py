"""The simulation loop: arrivals and completions on a simulated clock, each scheduling
pass planned by a policy and bound through the real ``apply``."""

from __future__ import annotations

import heapq
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterConfig, ClusterState, JobState
from synapse_ha.sim.policies import Policy
from synapse_ha.sim.workload import Workload

ARRIVE, FINISH, EXPIRE = 0, 1, 2
BIG_GANG_GPUS = 64


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
    fits_one_rack: bool = False


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


def simulate(workload: Workload, policy: Policy, purge_every: int = 500) -> Result:
    """Replay ``workload`` under ``policy``; every job runs to completion or its limit."""
    if not policy.topology_aware:
        workload = workload.without_topology()
    state = ClusterState()
    apply(state, c.Configure(ClusterConfig(retention_ms=0)))
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
    wall_start = time.perf_counter()

    while events:
        now = events[0][0]
        pending_count = sum(1 for j in state.jobs.values() if j.state is JobState.PENDING)
        dt = now - last_t
        alloc_area += allocated * dt
        queue_area += pending_count * dt
        frag_area += _unusable_free_gpus(state) * dt if pending_count else 0.0
        last_t = now
        while events and events[0][0] == now:
            _, _, kind, key = heapq.heappop(events)
            if kind == ARRIVE:
                job = workload.jobs[int(key)]
                res = apply(state, c.SubmitJob(job.spec, f"sim-{key}", now))
                records[res.job_id] = _Record(
                    arrival_ms=now,
                    gpus=job.spec.resources.gpu * job.spec.replicas,
                    members=job.spec.replicas,
                    duration_ms=job.duration_ms,
                    fits_one_rack=job.spec.resources.gpu * job.spec.replicas <= largest_rack,
                )
                index_of[res.job_id] = int(key)
            else:
                job_id, token = key.rsplit("@", 1)
                record = state.jobs.get(job_id)
                if record is None or record.fencing_token != int(token):
                    continue
                before = record.state
                if kind == EXPIRE:
                    apply(state, c.ExpireTimeLimit(job_id, int(token), now))
                else:
                    _report_all(state, job_id, int(token), c.MemberEventKind.EXITED, now)
                if before.holds_resources and not state.jobs[job_id].state.holds_resources:
                    allocated -= records[job_id].gpus
                    records[job_id].end_ms = now
            applied += 1
        if any(j.state is JobState.PENDING for j in state.jobs.values()):
            t0 = time.process_time()
            command = policy.plan(state, now)
            cpu_in_policy += time.process_time() - t0
            passes += 1
            decisions += pending_count
            if command is not None:
                result = apply(state, command)
                for job_id in result.bound:
                    rec = records[job_id]
                    rec.start_ms = now
                    allocated += rec.gpus
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
        if applied % purge_every == 0:
            apply(state, c.PurgeFinished(now))
        series_alloc.append((now / 3_600_000, allocated / total_gpus))
        series_queue.append((now / 3_600_000, float(pending_count)))

    wall = time.perf_counter() - wall_start
    span = max(last_t - min((r.arrival_ms for r in records.values()), default=0), 1)
    done = [r for r in records.values() if r.start_ms is not None]
    delays = [(r.start_ms - r.arrival_ms) / 1000 for r in done if r.start_ms is not None]
    big = [
        (r.start_ms - r.arrival_ms) / 1000
        for r in done
        if r.start_ms is not None and r.gpus >= BIG_GANG_GPUS
    ]
    jct = [(r.end_ms - r.arrival_ms) / 1000 for r in done if r.end_ms is not None]
    multi = [r for r in done if r.members > 1 and r.hosts > 1]
    could_rack = [r for r in done if r.members > 1 and r.fits_one_rack]
    metrics: dict[str, Any] = {
        "jobs": len(records),
        "jobs_started": len(done),
        "gpu_allocation": round(alloc_area / (total_gpus * span), 4),
        "queue_delay_s": _summary(delays),
        "queue_delay_big_gangs_s": _summary(big),
        "job_completion_s": _summary(jct),
        "mean_queue_length": round(queue_area / span, 2),
        "multi_node_gangs": len(multi),
        "multi_node_in_one_rack": _share(sum(1 for r in multi if r.racks == 1), len(multi)),
        "multi_node_in_one_block": _share(sum(1 for r in multi if r.blocks == 1), len(multi)),
        "rack_fitting_gangs_in_one_rack": _share(
            sum(1 for r in could_rack if r.racks == 1), len(could_rack)
        ),
        "fragmentation_gpus": round(frag_area / span, 2),
        "scheduler_cpu_ms_per_decision": round(1000 * cpu_in_policy / max(decisions, 1), 4),
        "scheduling_passes": passes,
        "wall_s": round(wall, 2),
        "never_started": sorted(
            f"{j.job_id}: {j.reason}" for j in state.jobs.values() if j.state is JobState.PENDING
        )[:5],
    }
    return Result(
        policy.name,
        workload.name,
        metrics,
        {"allocation": series_alloc, "queue": series_queue},
        delays,
    )


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


def _unusable_free_gpus(state: ClusterState) -> int:
    """Free GPUs on nodes where no waiting gang could place even one member."""
    waiting = [j.spec.resources.gpu for j in state.jobs.values() if j.state is JobState.PENDING]
    smallest = min((g for g in waiting if g > 0), default=0)
    if smallest == 0:
        return 0
    return sum(
        n.free.gpu for n in state.nodes.values() if n.schedulable() and 0 < n.free.gpu < smallest
    )


def _report_all(
    state: ClusterState, job_id: str, token: int, kind: c.MemberEventKind, now: int
) -> None:
    """Report every member of the attempt started (or exited 0), node by node."""
    attempt = state.jobs[job_id].attempt
    assert attempt is not None
    by_node: dict[str, list[c.MemberEvent]] = {}
    for m in attempt.members:
        by_node.setdefault(m.node_id, []).append(c.MemberEvent(job_id, token, m.rank, kind, 0))
    for node_id, events in sorted(by_node.items()):
        apply(state, c.ReportMembers(node_id, tuple(events), now_ms=now))
