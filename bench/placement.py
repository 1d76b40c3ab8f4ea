"""Placement benchmark: one scheduling pass over a large synthetic cluster.

Cluster: 5 zones x 10 blocks x 25 racks x 8 hosts = 10,000 nodes of 8 GPUs (NVLink
pairs), half of its GPUs already held by running gangs with time limits; 5,000 pending
gangs of 1 to 512 GPUs (1-8 GPUs per member), a quarter with ``required`` and a quarter
with ``preferred`` topology. Prints JSON: per-gang decision time p50/p99, the full pass
time, the replicated state's memory and encoded size. ``--queues N`` spreads every gang
over N queues (cohorts of 5, equal nominal quotas summing to the cluster, priority
classes low/normal/high) with topology-aware preemption on. ``--smoke`` runs a tiny version in
about a second so the benchmark cannot rot.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, NodeInfo, Resources
from synapse_ha.core.scheduler import schedule

PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))


def build_cluster(zones: int, blocks: int, racks: int, hosts: int) -> ClusterState:
    state = ClusterState()
    for z in range(zones):
        for b in range(blocks):
            for r in range(racks):
                for h in range(hosts):
                    name = f"z{z}-b{b}-r{r}-h{h}"
                    info = NodeInfo(
                        node_id=name,
                        address=f"{name}.cluster",
                        capacity=Resources(128_000, 1024 * 1024, 8),
                        gpu_islands=PAIRS,
                        topology=(("block", f"b{b}"), ("rack", f"r{r}"), ("zone", f"z{z}")),
                    )
                    result = apply(state, c.RegisterNode(info, 0))
                    assert result.ok, result.message
    return state


def gang_spec(rng: random.Random, name: str, with_limit: bool) -> JobSpec:
    per_member = rng.choice([1, 2, 4, 8, 8])
    total = rng.choice([1, 2, 4, 8, 8, 16, 16, 32, 64, 128, 256, 512])
    total = max(total, per_member)
    replicas = total // per_member
    topo = rng.random()
    required = rng.choice(["rack", "block"]) if topo < 0.25 else ""
    preferred = rng.choice(["rack", "block"]) if 0.25 <= topo < 0.5 else ""
    if required == "rack" and total > 64:
        required = "block"
    return JobSpec(
        name=name,
        replicas=replicas,
        resources=Resources(per_member * 4_000, per_member * 32 * 1024, per_member),
        command=("python train.py",),
        priority=rng.choice([0, 0, 0, 1, 5]),
        topology_required=required,
        topology_preferred=preferred,
        time_limit_ms=rng.randint(600, 86_400) * 1000 if with_limit else 0,
    )


def add_queues(state: ClusterState, count: int) -> list[str]:
    """``count`` queues in cohorts of 5 with equal nominal quotas summing to the cluster."""
    total = sum(n.info.capacity.gpu for n in state.nodes.values())
    names = [f"q{i:02d}" for i in range(count)]
    for i, name in enumerate(names):
        queue = Queue(name, gpu=total // count, cohort=f"c{i // 5}")
        assert apply(state, c.SetQueue(queue, 0)).ok
    return names


def in_queue(spec: JobSpec, rng: random.Random, queues: list[str]) -> JobSpec:
    if not queues:
        return spec
    cls = rng.choice(["low", "normal", "normal", "high"])
    return replace(spec, queue=rng.choice(queues), priority_class=cls)


def make_busy(
    state: ClusterState,
    rng: random.Random,
    target_share: float,
    queues: list[str] | None = None,
    timed: bool = True,
) -> int:
    """Place background gangs (with time limits, unless not ``timed``) until
    ``target_share`` of GPUs is used."""
    total = sum(n.info.capacity.gpu for n in state.nodes.values())
    seq = 0
    while (used := sum(n.allocated.gpu for n in state.nodes.values())) < total * target_share:
        for _ in range(max(1, int(total * target_share - used) // 200)):
            seq += 1
            spec = in_queue(gang_spec(rng, f"bg-{seq}", timed), rng, queues or [])
            apply(state, c.SubmitJob(spec, f"bg-{seq}", 0))
        command = schedule(state, 0).command(0)
        if command is not None:
            apply(state, command)
        for job in state.jobs.values():  # drop what did not fit: the queue starts empty
            if job.state.value == "PENDING":
                apply(state, c.CancelJob(job.job_id, "bench setup", 0))
        apply(state, c.PurgeFinished(state.config.retention_ms + 1))
    return sum(n.allocated.gpu for n in state.nodes.values())


def run(
    zones: int, blocks: int, racks: int, hosts: int, gangs: int, seed: int, queues: int = 0
) -> dict[str, object]:
    rng = random.Random(seed)
    tracemalloc.start()
    state = build_cluster(zones, blocks, racks, hosts)
    names = add_queues(state, queues) if queues else []
    busy_gpus = make_busy(state, rng, 0.5, names)
    for i in range(gangs):
        spec = in_queue(gang_spec(rng, f"g-{i}", rng.random() < 0.5), rng, names)
        apply(state, c.SubmitJob(spec, f"g-{i}", 1))
    state_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    encoded = len(encode_state(state))

    stamps: list[float] = []
    start = time.perf_counter()
    plan = schedule(state, 1, lambda _job, _placed: stamps.append(time.perf_counter()))
    pass_s = time.perf_counter() - start
    decisions = [b - a for a, b in zip([start, *stamps], stamps, strict=False)]
    decisions_ms = sorted(d * 1000 for d in decisions)

    def pct(p: float) -> float:
        return round(decisions_ms[min(len(decisions_ms) - 1, int(p * len(decisions_ms)))], 3)

    command = plan.command(1)
    apply_s = 0.0
    if command is not None:
        t0 = time.perf_counter()
        result = apply(state, command)
        apply_s = time.perf_counter() - t0
        assert not result.rejected, result.rejected[:3]
    total_gpus = zones * blocks * racks * hosts * 8
    return {
        "benchmark": "placement",
        "nodes": zones * blocks * racks * hosts,
        "gpus": total_gpus,
        "busy_gpus_before": busy_gpus,
        "pending_gangs": gangs,
        "gangs_placed": len(plan.placements),
        "queues": queues,
        "preemption": state.config.preemption.value,
        "preemptions": len(plan.preemptions),
        "victims": sum(len(p.victims) for p in plan.preemptions),
        "reservation": plan.reservation.job_id if plan.reservation else None,
        "decision_ms_p50": pct(0.50),
        "decision_ms_p99": pct(0.99),
        "decision_ms_max": round(decisions_ms[-1], 3),
        "decision_ms_mean": round(statistics.fmean(decisions_ms), 3),
        "full_pass_s": round(pass_s, 3),
        "apply_bind_plan_s": round(apply_s, 3),
        "state_memory_mb": round(state_bytes / 2**20, 1),
        "state_encoded_mb": round(encoded / 2**20, 1),
        "targets": {"decision_ms_p99": 10, "full_pass_s": 1.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a tiny cluster, seconds long")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--queues", type=int, default=0, help="spread gangs over N queues")
    args = parser.parse_args()
    size = (2, 2, 3, 4, 60) if args.smoke else (5, 10, 25, 8, 5000)
    result = run(*size, args.seed, args.queues)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
