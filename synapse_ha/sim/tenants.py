"""Multi-tenant workloads: several queues of one cohort with their own quotas and arrival
patterns, and workloads made from a trace (:mod:`synapse_ha.sim.trace`)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from synapse_ha.core.cluster_config import Cohort, Queue
from synapse_ha.core.model import NodeInfo
from synapse_ha.sim.trace import TraceJob
from synapse_ha.sim.workload import SimJob, Workload, gang_spec, synthetic_cluster

COHORT = "research"
# The multi-tenant jobs' checkpoint intervals: log-uniform between these, minutes.
CHECKPOINT_MINUTES = (10.0, 60.0)


@dataclass(frozen=True, slots=True)
class Tenant:
    """One queue's share of the generated workload.

    ``pattern``: ``steady`` (Poisson arrivals over the whole horizon), ``bursty`` (bursts
    of ``burst`` jobs within a minute, the bursts Poisson) or ``late`` (idle until
    ``start_h``, then steady: the queue that comes back to reclaim its quota).
    ``load``: the GPU demand it offers while arriving, as a multiple of its nominal quota.
    ``rack_gangs``: the share of its jobs that are whole-rack gangs (one member per host
    of a rack, ``topology.required: rack``). ``high`` / ``low``: the shares of its jobs in
    the ``high`` (may preempt within the queue) and ``low`` priority classes.
    """

    name: str
    gpu: int
    pattern: str = "steady"
    load: float = 1.2
    start_h: float = 0.0
    burst: int = 12
    rack_gangs: float = 0.0
    high: float = 0.0
    low: float = 0.0


DEFAULT_TENANTS: tuple[Tenant, ...] = (
    Tenant("team-a", 64, "steady", load=1.3, high=0.1),
    Tenant("team-b", 64, "bursty", load=1.3, burst=10),
    Tenant("team-c", 64, "steady", load=1.3, rack_gangs=0.05),
    Tenant("team-d", 64, "late", load=1.3, start_h=2.0, rack_gangs=0.25),
)


@dataclass(frozen=True, slots=True)
class _Draw:
    gpus: int
    per_member: int
    required: str
    preferred: str
    duration_ms: int


# A heavy-tailed workload (the preemption targets' long trace): eight queues of unequal
# demand, 1.3x the cluster's GPUs in all, jobs of median 10 h, for three weeks.
HEAVY_TAILED_TENANTS: tuple[Tenant, ...] = (
    Tenant("q1", 32, "steady", load=2.2, high=0.05),
    Tenant("q2", 32, "bursty", load=1.8, burst=6),
    Tenant("q3", 32, "steady", load=1.6, rack_gangs=0.05),
    Tenant("q4", 32, "steady", load=1.3),
    Tenant("q5", 32, "bursty", load=1.1, burst=4),
    Tenant("q6", 32, "late", load=0.9, start_h=48.0, rack_gangs=0.1),
    Tenant("q7", 32, "steady", load=0.8),
    Tenant("q8", 32, "steady", load=0.7),
)


def heavy_tailed(seed: int = 1, weeks: float = 3.0, hosts: int = 32) -> Workload:
    """The long, heavy-tailed workload: :data:`HEAVY_TAILED_TENANTS` on ``hosts`` 8-GPU
    hosts, arrivals for ``weeks``, durations log-normal with a median of 10 h (capped at
    a week), checkpoints every 10-60 min."""
    return multi_tenant(
        seed=seed,
        hours=weeks * 168,
        tenants=HEAVY_TAILED_TENANTS,
        hosts=hosts,
        median_minutes=600.0,
        max_hours=168.0,
    )


def _draw(
    rng: random.Random, tenant: Tenant, rack_gpus: int, median_ms: float, max_ms: int
) -> _Draw:
    duration = min(int(rng.lognormvariate(math.log(median_ms), 1.0)), max_ms)
    if rng.random() < tenant.rack_gangs:
        return _Draw(rack_gpus, 8, "rack", "", duration)
    if rng.random() < 0.6:
        g = rng.choice([1, 2, 4, 8])
        return _Draw(g, g, "", "", duration)
    preferred = "rack" if rng.random() < 1 / 3 else ""
    return _Draw(rng.choice([16, 32]), 8, "", preferred, duration)


def multi_tenant(
    seed: int = 1,
    hours: float = 6.0,
    tenants: Sequence[Tenant] = DEFAULT_TENANTS,
    hosts: int = 32,
    hosts_per_rack: int = 8,
    median_minutes: float = 20.0,
    checkpoint_minutes: tuple[float, float] | None = CHECKPOINT_MINUTES,
    max_hours: float = 4.0,
    organisations: int = 0,
) -> Workload:
    """A seeded multi-tenant workload on ``hosts`` 8-GPU hosts, ``hosts_per_rack`` to a
    rack (2 racks to a block), with one queue per tenant, all in cohort ``research``.
    With ``organisations`` (N >= 1), the cohort is a tree: ``research`` with N
    organisation cohorts ``org-1``..``org-N`` below it, the tenants dealt to them in
    turn (the same jobs: only the queues' cohorts differ).

    Job mix per tenant: whole-rack gangs (``rack_gangs``); of the rest 60 % one host of
    1-8 GPUs, 40 % gangs of 16 or 32 GPUs (8 per member), a third of those preferring
    one rack. Durations are log-normal (median ``median_minutes``, capped at
    ``max_hours``); a third
    carry a time limit of 1.5x their duration rounded up to minutes. Arrivals stop after
    ``hours``; the simulation then runs until every job has ended.

    Every job checkpoints at an interval drawn log-uniform within ``checkpoint_minutes``
    (from a generator of its own, so the jobs are the same with or without them); None:
    no job checkpoints.
    """
    rng = random.Random(seed)
    marks_rng = random.Random(f"checkpoints:{seed}")
    nodes = synthetic_cluster(hosts, hosts_per_rack=hosts_per_rack, racks_per_block=2)
    rack_gpus = 8 * hosts_per_rack
    horizon_ms = int(hours * 3_600_000)
    median_ms = median_minutes * 60_000
    max_ms = int(max_hours * 3_600_000)
    jobs: list[SimJob] = []
    for tenant in tenants:
        # Mean GPU-milliseconds per job, to turn the offered load into an arrival rate.
        sample = [_draw(rng, tenant, rack_gpus, median_ms, max_ms) for _ in range(200)]
        mean_work = sum(d.gpus * d.duration_ms for d in sample) / len(sample)
        start_ms = int(tenant.start_h * 3_600_000)
        rate = tenant.load * tenant.gpu / mean_work  # jobs per ms while arriving
        arrivals = _arrivals(rng, tenant, rate, start_ms, horizon_ms)
        for i, at in enumerate(sorted(arrivals)):
            d = _draw(rng, tenant, rack_gpus, median_ms, max_ms)
            spec = gang_spec(f"{tenant.name}-{i}", d.gpus, d.per_member, queue=tenant.name)
            roll = rng.random()
            klass = (
                "high" if roll < tenant.high else "low" if roll < tenant.high + tenant.low else ""
            )
            duration = max(d.duration_ms, 60_000)
            limit = 0
            if rng.random() < 1 / 3:
                limit = math.ceil(duration * 1.5 / 60_000) * 60_000
            spec = replace(
                spec,
                topology_required=d.required,
                topology_preferred=d.preferred,
                time_limit_ms=limit,
                priority_class=klass,
            )
            every = _checkpoint_ms(marks_rng, checkpoint_minutes)
            jobs.append(SimJob(at, spec, duration, f"{tenant.name}-user", checkpoint_ms=every))
    jobs.sort(key=lambda j: (j.arrival_ms, j.spec.name))
    cohorts, queues = _tree(tenants, organisations)
    notes = (
        f"multi-tenant seed {seed}: {len(jobs)} jobs over {hours:g} h on {hosts} x 8 GPUs "
        f"(racks of {hosts_per_rack} hosts), {_described(tenants, checkpoint_minutes)}"
    )
    if cohorts:
        notes += "; " + ", ".join(
            f"{r.name} under {r.parent}: " + ", ".join(q.name for q in queues if q.cohort == r.name)
            for r in cohorts
            if r.parent
        )
    return Workload("multi-tenant", nodes, tuple(jobs), notes, queues=queues, cohorts=cohorts)


def _tree(
    tenants: Sequence[Tenant], organisations: int
) -> tuple[tuple[Cohort, ...], tuple[Queue, ...]]:
    """The cohort records (parents first) and the tenants' queues: all in ``research``
    without organisations, else dealt in turn to organisations below it."""
    if organisations < 1:
        return (), tuple(Queue(t.name, gpu=t.gpu, cohort=COHORT) for t in tenants)
    orgs = tuple(Cohort(f"org-{i + 1}", COHORT) for i in range(organisations))
    queues = tuple(
        Queue(t.name, gpu=t.gpu, cohort=orgs[i % organisations].name) for i, t in enumerate(tenants)
    )
    return (Cohort(COHORT), *orgs), queues


def _arrivals(
    rng: random.Random, tenant: Tenant, rate: float, start_ms: int, horizon_ms: int
) -> list[int]:
    """A tenant's arrival times (ms) at ``rate`` jobs per ms from ``start_ms`` to the
    horizon: Poisson, or Poisson bursts of ``tenant.burst`` jobs within a minute."""
    arrivals: list[int] = []
    now = float(start_ms)
    if tenant.pattern == "bursty":
        burst_rate = rate / tenant.burst
        while True:
            now += rng.expovariate(burst_rate)
            if now >= horizon_ms:
                break
            arrivals.extend(int(now + rng.uniform(0, 60_000)) for _ in range(tenant.burst))
    else:
        while True:
            now += rng.expovariate(rate)
            if now >= horizon_ms:
                break
            arrivals.append(int(now))
    return arrivals


def _described(tenants: Sequence[Tenant], checkpoint_minutes: tuple[float, float] | None) -> str:
    """The workload's checkpoints and queues, for its notes."""
    described = ", ".join(
        f"{t.name} {t.gpu} GPUs {t.pattern}"
        + (f" from {t.start_h:g} h" if t.pattern == "late" else "")
        + (f", {t.rack_gangs:.0%} whole-rack gangs" if t.rack_gangs else "")
        for t in tenants
    )
    marks = (
        f"checkpoints every {checkpoint_minutes[0]:g}-{checkpoint_minutes[1]:g} min (log-uniform)"
        if checkpoint_minutes
        else "no checkpoints"
    )
    return f"{marks}; cohort {COHORT}: {described}"


def _checkpoint_ms(rng: random.Random, minutes: tuple[float, float] | None) -> int:
    """A checkpoint interval drawn log-uniform within ``minutes`` (0 for None), ms."""
    if minutes is None:
        return 0
    low, high = minutes
    return round(math.exp(rng.uniform(math.log(low), math.log(high))) * 60_000)


def from_trace(
    jobs: Sequence[TraceJob],
    nodes: tuple[NodeInfo, ...],
    queues: Sequence[Queue] | None = None,
    name: str = "trace",
) -> Workload:
    """A workload replaying trace ``jobs`` on ``nodes``.

    Without ``queues``, every queue the trace names gets an equal share of the cluster's
    GPUs (rounded down) as its nominal quota, all in cohort ``trace``; ``default`` keeps
    no quota. A queue the trace names that ``queues`` lacks raises ValueError. A job's
    ``after_ok`` lines become the indices of their jobs in the workload (``jobs`` are in
    submission order, so each comes before the jobs that wait for it).
    """
    named = sorted({j.spec.queue for j in jobs})
    if queues is None:
        quota_queues = [q for q in named if q != "default"]
        total = sum(n.capacity.gpu for n in nodes)
        share = total // max(len(quota_queues), 1)
        queues = [Queue(q, gpu=share, cohort="trace") for q in quota_queues]
    known = {q.name for q in queues} | {"default"}
    unknown = [q for q in named if q not in known]
    if unknown:
        raise ValueError(f"the trace names queues with no settings: {', '.join(unknown)}")
    index_of = {j.line: i for i, j in enumerate(jobs)}
    sim_jobs = tuple(
        SimJob(
            j.submit_ms,
            j.spec,
            j.duration_ms,
            user=j.user,
            after_ok=tuple(index_of[line] for line in j.after_ok),
            checkpoint_ms=j.checkpoint_ms,
        )
        for j in jobs
    )
    arrays = sum(1 for j in jobs if j.spec.array)
    notes = (
        f"{name}: {len(sim_jobs)} jobs"
        + (f" ({arrays} of them arrays)" if arrays else "")
        + f" on {len(nodes)} nodes, queues {', '.join(named)}"
    )
    return Workload(name, nodes, sim_jobs, notes, queues=tuple(queues))
