"""A seeded workload of training jobs: long multi-node gangs and shorter one-host runs,
each with a retry budget, for the GPU failure runs (:mod:`synapse_ha.sim.gpu_failures`)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from synapse_ha.core.model import RetryPolicy
from synapse_ha.sim.workload import SimJob, Workload, gang_spec, synthetic_cluster

MS_PER_HOUR = 3_600_000


def training(
    seed: int = 1,
    nodes: int = 64,
    days: float = 3.0,
    load: float = 0.85,
    max_retries: int = 3,
) -> Workload:
    """Training jobs arriving for ``days`` at ``load`` offered load on ``nodes`` 8-GPU
    hosts (8 to a rack, 4 racks to a block).

    Mix: 60 % multi-node gangs of 16-256 GPUs (8 per member, capped at half the
    cluster), log-normal run time with a median of 4 h, capped at 2 days; 40 % one-host
    runs of 1-8 GPUs, median 45 min, capped at 1 day. Arrivals are Poisson. Every job
    may be retried ``max_retries`` times after a failure (back-off 10 s doubling to at
    most 10 min, the job spec's defaults), and a third of the gangs up to a rack's size
    prefer one rack.
    """
    if nodes < 1:
        raise ValueError(f"nodes: at least 1, got {nodes}")
    if not 0 < days <= 366:
        raise ValueError(f"days: more than 0 and at most 366, got {days}")
    if not 0 < load <= 10:
        raise ValueError(f"load: more than 0 and at most 10, got {load}")
    if not 0 <= max_retries <= 100:
        raise ValueError(f"max_retries: between 0 and 100, got {max_retries}")
    rng = random.Random(seed)
    cluster = synthetic_cluster(nodes)
    total = sum(n.capacity.gpu for n in cluster)
    retries = RetryPolicy(max_retries=max_retries)
    span_ms = days * 24 * MS_PER_HOUR
    # Mean GPU-ms per job, from the mix below, sets the arrival rate for the load.
    gang_sizes = [g for g in (16, 32, 64, 128, 256) if g <= max(total // 2, 8)] or [8]
    mean_gang = sum(gang_sizes) / len(gang_sizes)
    mean_work = 0.6 * mean_gang * _mean_ms(4.0, 1.0, 48.0) + 0.4 * 4.6 * _mean_ms(0.75, 1.2, 24.0)
    rate_per_ms = load * total / mean_work
    out: list[SimJob] = []
    now = rng.expovariate(rate_per_ms)
    while now < span_ms:
        i = len(out)
        if rng.random() < 0.6:
            gpus = rng.choice(gang_sizes)
            spec = gang_spec(f"train-{i}", gpus, 8)
            hours = min(rng.lognormvariate(math.log(4.0), 1.0), 48.0)
            if gpus <= 64 and rng.random() < 1 / 3:
                spec = replace(spec, topology_preferred="rack")
        else:
            gpus = rng.choice([1, 2, 4, 8, 8])
            spec = gang_spec(f"run-{i}", gpus, gpus)
            hours = min(rng.lognormvariate(math.log(0.75), 1.2), 24.0)
        spec = replace(spec, retries=retries)
        out.append(SimJob(int(now), spec, max(int(hours * MS_PER_HOUR), 60_000)))
        now += rng.expovariate(rate_per_ms)
    notes = (
        f"training seed {seed}: {len(out)} jobs over {days:g} days on {nodes} x 8 GPUs "
        f"(racks of 8 hosts), offered load {load:.0%}, {max_retries} retries per job"
    )
    return Workload("training", cluster, tuple(out), notes)


def _mean_ms(median_h: float, sigma: float, cap_h: float) -> float:
    """Mean of a log-normal run time (ignoring the cap's small effect), in ms."""
    return min(median_h * math.exp(sigma * sigma / 2), cap_h) * MS_PER_HOUR
