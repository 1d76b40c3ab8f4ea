"""Gang start latency, side by side: synapse_ha against Ray placement groups.

Both run the same fake cluster on 127.0.0.1: 8 nodes x 8 GPUs x 16 CPUs in two racks of
4 nodes (``rack_a``, ``rack_b``).

* **synapse_ha**: 3 scheduler replicas (Raft) and 8 ``synapse-worker`` agents with mock
  GPUs and ``rack=rack_a|rack_b`` topology labels. A member is a process that writes
  the wall-clock time it started to a file and exits 0.
* **Ray**: ``ray.cluster_utils.Cluster`` with 8 raylets (``num_gpus=8``, ``num_cpus=16``,
  custom resource ``rack_a`` or ``rack_b`` = 8, no dashboard). A gang is a placement
  group with one bundle per member; a member is a task scheduled into its bundle that
  returns ``time.time()``.

Measured in one run, in this order on each side: gang start latency (submit, or
placement-group creation, until every member has started) for gangs of 2 members x 8
GPUs in one rack and of 4 members x 2 GPUs, one gang at a time (each freed before the
next); and the time to start 50 gangs of 2 members x 1 CPU submitted back to back (they
all fit at once; ours from 16 client threads, since a submission returns only once it
is committed). Reports medians, p99 and ours/Ray ratios, with notes on what each side
does that the other does not. Everything started is torn down at the end.

Ray is optional (``pip install -e '.[ray]'``): without it, only our side is measured and
the report says why. Prints one JSON object; ``--smoke`` measures a few gangs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Without this Ray advertises the address it would use to reach the internet, even for a
# cluster on one machine; with it, every Ray process uses 127.0.0.1. Ray reads it when
# first imported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from bench.loopback import loopback_cluster, percentile, read_stamps, wait_for
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobState
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state

NODES = 8
GPUS_PER_NODE = 8
CPUS_PER_NODE = 16
RACKS = ("rack_a", "rack_b")
SHAPES = {"2x8gpu": (2, 8), "4x2gpu": (4, 2)}
MANY_GANGS = 50
BURST_THREADS = 16
DEADLINE_S = 60.0

FAIRNESS = {
    "synapse_ha": [
        "every decision is replicated through Raft on 3 scheduler processes before any "
        "worker acts on it (survives the loss of a replica; Ray's GCS is one process)",
        "workers learn of new members from heartbeat replies; the leader nudges a "
        "worker to heartbeat as soon as a bind placing members on it commits",
        "each member is a new OS process in its own process group with its rank "
        "environment (MASTER_ADDR, RANK, CUDA_VISIBLE_DEVICES...), as torchrun expects, "
        "under a lease-holding supervisor forked from a pre-started fork server",
        "chooses the rack itself (tightest fit, best fit among racks, NVLink islands); "
        "2x8 gangs here say topology.required=rack and the scheduler picks which rack",
        "lease-based self-fencing guarantees no two attempts of a job ever overlap",
    ],
    "ray": [
        "one GCS process holds placement-group state: no replication of decisions",
        "raylets push work to pooled, already-started Python worker processes; a "
        "member here is a task in a running worker, not a new process",
        "knows no topology: a rack is a custom resource the user must name; the 2x8 "
        "gangs here pin alternate racks by asking for rack_a or rack_b in every bundle",
        "placement groups reserve resources first, then tasks are scheduled into them "
        "(two steps, both included in the latency)",
    ],
    "same_on_both": [
        "same fake cluster (8 nodes x 8 GPUs x 16 CPUs, two racks), loopback only, "
        "same machine, run one after the other",
        "latency = wall clock from just before the submit call until the last member "
        "recorded its start",
    ],
}


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 1),
        "p99_ms": round(percentile(values, 0.99), 1),
        "mean_ms": round(statistics.fmean(values), 1),
        "max_ms": round(max(values), 1),
    }


# ------------------------------------------------------------------------ synapse_ha


def _our_gang(
    client: ClusterClient, out: Path, name: str, members: int, gpu: int, cpu_milli: int, rack: bool
) -> tuple[str, list[Path]]:
    spec = pb.JobSpec(
        name=name,
        replicas=members,
        resources=pb.Resources(cpu_milli=cpu_milli, memory_mib=256, gpu=gpu),
        shell_command=f"date +%s.%N > {out}/$SYNAPSE_JOB_ID-$RANK",
        topology_required="rack" if rack else "",
    )
    job_id = client.submit_job(spec).job_id
    return job_id, [out / f"{job_id}-{r}" for r in range(members)]


def measure_ours(gangs: int, many: int, heartbeat: str) -> dict[str, Any]:
    nodes = [
        (
            f"w{i + 1}",
            [
                "--mock-gpus",
                str(GPUS_PER_NODE),
                "--cpu",
                str(CPUS_PER_NODE),
                "--memory",
                "64Gi",
                "--topology",
                f"rack={RACKS[i * len(RACKS) // NODES]}",
            ],
        )
        for i in range(NODES)
    ]
    with (
        tempfile.TemporaryDirectory(prefix="synapse-vs-ray-") as tmp,
        loopback_cluster(Path(tmp), heartbeat, nodes) as client,
    ):
        out = Path(tmp) / "stamps"
        out.mkdir()
        report: dict[str, Any] = {
            "replicas": 3,
            "heartbeat_interval": heartbeat,
            "burst_submit_threads": BURST_THREADS,
        }
        for label, (members, gpu) in SHAPES.items():
            latencies = []
            for g in range(gangs):
                submitted = time.time()
                job_id, paths = _our_gang(
                    client, out, f"{label}-{g}", members, gpu, 1000, rack=gpu == 8
                )
                stamps = read_stamps(paths, time.monotonic() + DEADLINE_S)
                latencies.append((max(stamps) - submitted) * 1000)
                wait_for(
                    f"{job_id} to finish",
                    lambda j=job_id: job_state(client.get_job(j)) is JobState.SUCCEEDED,  # type: ignore[misc]
                    timeout_s=DEADLINE_S,
                    every_s=0.01,
                )
            report[label] = summary(latencies)
        # Submitted from several threads at once: a submission returns only once
        # it is committed by a quorum, where Ray's placement_group() returns at
        # once; one thread would measure 50 round trips, not the scheduler.
        started = time.time()
        with ThreadPoolExecutor(max_workers=BURST_THREADS) as pool:
            submitted_all = list(
                pool.map(
                    lambda g: _our_gang(client, out, f"many-{g}", 2, 0, 1000, False),
                    range(many),
                )
            )
        deadline = time.monotonic() + DEADLINE_S
        last = max(max(read_stamps(paths, deadline)) for _, paths in submitted_all)
        report[f"start_{many}_gangs_ms"] = round((last - started) * 1000, 1)
        return report


# ------------------------------------------------------------------------------- Ray


def ray_missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install -e '.[ray]'); only synapse_ha was measured"
    return None


def measure_ray(gangs: int, many: int) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    node_args: dict[str, Any] = {
        "num_cpus": CPUS_PER_NODE,
        "num_gpus": GPUS_PER_NODE,
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
    }
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node_args, "resources": {RACKS[0]: GPUS_PER_NODE}},
    )
    try:
        for i in range(1, NODES):
            rack = RACKS[i * len(RACKS) // NODES]
            cluster.add_node(**node_args, resources={rack: GPUS_PER_NODE})
        cluster.wait_for_nodes(timeout=DEADLINE_S)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)

        @ray.remote
        def member() -> float:
            return time.time()

        def start_gang(bundles: list[dict[str, float]], strategy: str) -> Callable[[], float]:
            pg = placement_group(bundles, strategy=strategy)
            refs = [
                member.options(
                    num_cpus=b.get("CPU", 0),
                    num_gpus=b.get("GPU", 0),
                    resources={k: v for k, v in b.items() if k not in ("CPU", "GPU")},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=i
                    ),
                ).remote()
                for i, b in enumerate(bundles)
            ]

            def finish() -> float:
                stamps = ray.get(refs, timeout=DEADLINE_S)
                remove_placement_group(pg)
                return max(stamps)

            return finish

        report: dict[str, Any] = {"version": ray.__version__}
        # Start the worker pool before measuring, as a long-running Ray cluster would have.
        start_gang([{"CPU": 1}] * NODES, "SPREAD")()
        for label, (members, gpu) in SHAPES.items():
            latencies = []
            for g in range(gangs):
                bundle: dict[str, float] = {"CPU": 1, "GPU": gpu}
                if gpu == GPUS_PER_NODE:
                    bundle[RACKS[g % len(RACKS)]] = gpu
                submitted = time.time()
                last = start_gang([bundle] * members, "PACK")()
                latencies.append((last - submitted) * 1000)
            report[label] = summary(latencies)
        started = time.time()
        pending = [start_gang([{"CPU": 1}] * 2, "PACK") for _ in range(many)]
        last = max(finish() for finish in pending)
        report[f"start_{many}_gangs_ms"] = round((last - started) * 1000, 1)
        return report
    finally:
        ray.shutdown()
        stop_cluster: Callable[[], None] = cluster.shutdown  # untyped in Ray
        stop_cluster()


# ----------------------------------------------------------------------------- report


def compare(ours: dict[str, Any], ray_side: dict[str, Any], many: int) -> dict[str, Any]:
    ratios: dict[str, float | None] = {}
    for label in SHAPES:
        for q in ("p50_ms", "p99_ms"):
            theirs = ray_side[label][q]
            ratios[f"{label}_{q}"] = round(ours[label][q] / theirs, 2) if theirs else None
    key = f"start_{many}_gangs_ms"
    ratios[key] = round(ours[key] / ray_side[key], 2) if ray_side[key] else None
    return ratios


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a few gangs, 5 in the burst")
    p.add_argument("--gangs", type=int, default=30, help="gangs per shape, one at a time")
    p.add_argument("--heartbeat-interval", default="100ms")
    p.add_argument("--no-ray", action="store_true", help="measure synapse_ha only")
    args = p.parse_args()
    gangs, many = (3, 5) if args.smoke else (args.gangs, MANY_GANGS)
    report: dict[str, Any] = {
        "benchmark": "vs_ray",
        "cluster": f"{NODES} nodes x {GPUS_PER_NODE} GPUs x {CPUS_PER_NODE} CPUs, racks "
        f"{', '.join(RACKS)}, 127.0.0.1",
        "gangs_per_shape": gangs,
        "burst_gangs": many,
        "synapse_ha": measure_ours(gangs, many, args.heartbeat_interval),
    }
    missing = "not requested (--no-ray)" if args.no_ray else ray_missing()
    if missing is None:
        report["ray"] = measure_ray(gangs, many)
        report["ours_over_ray"] = compare(report["synapse_ha"], report["ray"], many)
    else:
        report["ray"] = {"skipped": missing}
    report["read_fairly"] = FAIRNESS
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
