"""Workloads for the simulator: the Alibaba GPU trace and a seeded synthetic gang mix."""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from synapse_ha.core.cluster_config import Cohort, Queue
from synapse_ha.core.model import JobSpec, NodeInfo, Resources

GPU_NODE_CPU = 96_000
GPU_NODE_MEMORY = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SimJob:
    arrival_ms: int
    spec: JobSpec
    duration_ms: int  # how long the job runs once started (a time limit may cut it)
    user: str = ""  # who submits it (the job's owner)
    # Workload jobs (by index) this one waits for (afterok): each must succeed first.
    after_ok: tuple[int, ...] = ()
    # While it runs, every member marks a checkpoint this often (ms of run time); 0: never.
    checkpoint_ms: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    nodes: tuple[NodeInfo, ...]
    jobs: tuple[SimJob, ...]
    notes: str
    # Queues set through the real apply before the first job arrives (none: the
    # built-in ``default`` queue only).
    queues: tuple[Queue, ...] = ()
    # Cohort records, parents first, set through apply before the queues (none: every
    # cohort a queue names is a flat one).
    cohorts: tuple[Cohort, ...] = ()
    # Victims that save on notice: a preempted job with a checkpoint interval saves and
    # marks a checkpoint this long after its notice (ms, drawn uniformly between the two
    # for each preemption, seeded), then its members exit, ending its grace at once.
    # None: victims never mark after the notice and stop when their grace ends.
    save_on_notice_ms: tuple[int, int] | None = None

    @property
    def total_gpus(self) -> int:
        return sum(n.capacity.gpu for n in self.nodes)

    def without_topology(self) -> Workload:
        """The same jobs with topology requirements removed (for topology-blind policies)."""
        jobs = tuple(
            replace(j, spec=replace(j.spec, topology_required="", topology_preferred=""))
            for j in self.jobs
        )
        return replace(self, jobs=jobs)


def _topology(index: int, hosts_per_rack: int, racks_per_block: int) -> tuple[tuple[str, str], ...]:
    rack = index // hosts_per_rack
    block = rack // racks_per_block
    return (("block", f"b{block}"), ("rack", f"r{rack}"), ("zone", "z0"))


def synthetic_cluster(
    nodes: int, gpus_per_node: int = 8, hosts_per_rack: int = 8, racks_per_block: int = 4
) -> tuple[NodeInfo, ...]:
    """Identical GPU hosts with NVLink pairs, ``hosts_per_rack`` to a rack."""
    pairs = tuple((i, i + 1) for i in range(0, gpus_per_node - 1, 2))
    return tuple(
        NodeInfo(
            node_id=f"node-{i:05d}",
            address=f"node-{i:05d}.sim",
            capacity=Resources(GPU_NODE_CPU, GPU_NODE_MEMORY, gpus_per_node),
            gpu_islands=pairs if gpus_per_node % 2 == 0 else (),
            topology=_topology(i, hosts_per_rack, racks_per_block),
        )
        for i in range(nodes)
    )


def gang_spec(name: str, gpus: int, per_member: int, queue: str | None = None) -> JobSpec:
    """A training gang of ``gpus`` GPUs, ``per_member`` to a member (8 CPUs and 64 GiB of
    memory a GPU); in ``queue`` (None: the default queue)."""
    per_member = min(per_member, gpus)
    spec = JobSpec(
        name=name,
        replicas=max(gpus // per_member, 1),
        resources=Resources(per_member * 8_000, per_member * 64 * 1024, per_member),
        command=("python train.py",),
    )
    return spec if queue is None else replace(spec, queue=queue)


@dataclass(frozen=True, slots=True)
class OpenbPod:
    """A pod of the Alibaba openb pod list that ran: its line in the file, its row, its
    GPUs (a pod sharing a GPU counts one whole GPU) and when and how long it ran."""

    line: int
    row: dict[str, str]
    gpus: int
    created_s: int
    duration_s: int


def openb_pods(folder: Path) -> Iterator[OpenbPod]:
    """The pods of ``folder``'s ``openb_pod_list_default.csv`` with a run time, in file
    order: run time is ``deletion_time`` minus ``scheduled_time`` (or minus
    ``creation_time`` for a pod never scheduled)."""
    with (folder / "openb_pod_list_default.csv").open() as f:
        for number, row in enumerate(csv.DictReader(f), start=2):
            gpus = int(row["num_gpu"])
            if gpus == 0 and int(row["gpu_milli"] or 0) > 0:
                gpus = 1
            created = int(row["creation_time"])
            started = int(row["scheduled_time"]) if row["scheduled_time"] else created
            duration_s = int(row["deletion_time"]) - started
            if duration_s > 0:
                yield OpenbPod(number, row, gpus, created, duration_s)


def synthetic(
    seed: int = 1,
    jobs: int = 2_000,
    nodes: int = 512,
    load: float = 0.9,
    time_limit_share: float = 0.3,
    topology_share: float = 0.3,
) -> Workload:
    """A seeded gang mix at ``load`` offered load on ``nodes`` 8-GPU hosts.

    Mix: 70 % single-host jobs of 1-8 GPUs; 25 % gangs of 16-128 GPUs (8 per member);
    5 % gangs of 256-1024 GPUs, capped at half the cluster. Arrivals are Poisson;
    durations log-normal (median 20 min, heavy tail, capped at 2 days). A share carries
    a time limit (1.2-3x the duration, rounded up to minutes) and a share requires one
    rack (gangs up to a rack's size) or one block.
    """
    rng = random.Random(seed)
    cluster = synthetic_cluster(nodes)
    total = sum(n.capacity.gpu for n in cluster)
    rack_gpus = 8 * 8
    block_gpus = rack_gpus * 4
    sizes: list[tuple[int, int]] = []
    for _ in range(jobs):
        kind = rng.random()
        if kind < 0.70:
            g = rng.choice([1, 1, 2, 4, 8])
            sizes.append((g, g))
        elif kind < 0.95:
            sizes.append((rng.choice([16, 32, 64, 128]), 8))
        else:
            sizes.append((min(rng.choice([256, 512, 1024]), total // 2), 8))
    durations = [
        min(int(rng.lognormvariate(math.log(1_200), 1.3) * 1000), 172_800_000) for _ in sizes
    ]
    work = sum(g * d for (g, _), d in zip(sizes, durations, strict=True))
    rate_per_ms = load * total * len(sizes) / work  # arrivals per millisecond
    now = 0.0
    out = []
    for i, ((g, per), duration) in enumerate(zip(sizes, durations, strict=True)):
        now += rng.expovariate(rate_per_ms)
        spec = gang_spec(f"job-{i}", g, per)
        if rng.random() < time_limit_share:
            limit_min = math.ceil(duration * rng.uniform(1.2, 3.0) / 60_000)
            spec = replace(spec, time_limit_ms=limit_min * 60_000)
        if rng.random() < topology_share and 8 < g <= block_gpus:
            spec = replace(spec, topology_required="rack" if g <= rack_gpus else "block")
        out.append(SimJob(int(now), spec, max(duration, 1_000)))
    notes = (
        f"synthetic seed {seed}: {jobs} jobs on {nodes} x 8 GPUs (racks of 8 hosts, "
        f"blocks of 4 racks), offered load {load:.0%}"
    )
    return Workload("synthetic", cluster, tuple(out), notes)


def load_openb(
    folder: Path, hosts_per_rack: int = 8, racks_per_block: int = 8, limit: int | None = None
) -> Workload:
    """The Alibaba "openb" GPU trace (v2023) as one-member jobs.

    Conversion: each pod is a one-member job; ``num_gpu`` whole GPUs, and a pod that
    shares a GPU (``gpu_milli`` < 1000) gets one whole GPU, since GPU sharing is not
    modelled. Arrival is ``creation_time``; run time is ``deletion_time`` minus
    ``scheduled_time`` (or minus ``creation_time`` for pods the trace never scheduled).
    Nodes come from the GPU node list, with no NVLink information (one island per GPU)
    and synthetic topology: ``hosts_per_rack`` hosts to a rack, ``racks_per_block``
    racks to a block, in the trace's node order.
    """
    nodes = []
    with (folder / "openb_node_list_gpu_node.csv").open() as f:
        for i, row in enumerate(csv.DictReader(f)):
            nodes.append(
                NodeInfo(
                    node_id=row["sn"],
                    address=f"{row['sn']}.sim",
                    capacity=Resources(
                        int(row["cpu_milli"]), int(row["memory_mib"]), int(row["gpu"])
                    ),
                    gpu_model=row["model"],
                    topology=_topology(i, hosts_per_rack, racks_per_block),
                )
            )
    jobs = []
    for pod in itertools.islice(openb_pods(folder), limit):
        spec = JobSpec(
            name=pod.row["name"],
            replicas=1,
            resources=Resources(int(pod.row["cpu_milli"]), int(pod.row["memory_mib"]), pod.gpus),
            command=("trace",),
        )
        jobs.append(SimJob(pod.created_s * 1000, spec, pod.duration_s * 1000))
    jobs.sort(key=lambda j: (j.arrival_ms, j.spec.name))
    notes = (
        f"alibaba openb v2023: {len(jobs)} pods as one-member jobs on {len(nodes)} GPU nodes; "
        f"GPU sharing rounded up to one GPU; synthetic racks of {hosts_per_rack} hosts"
    )
    return Workload("openb", tuple(nodes), tuple(jobs), notes)
