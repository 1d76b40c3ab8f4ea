"""Dependency latency on loopback: a dependency succeeds → its dependant is bound.

Starts 3 scheduler replicas and 2 synapse-worker agents on 127.0.0.1 (the production
heartbeat interval, 1s) and submits ``--chains`` chains of ``--length`` one-member jobs,
each step ``afterok`` the one before, all at once, as a pipeline hands its steps to the
cluster. Every step exits 0 at once. A link's latency is the dependant's bind time minus
the time its dependency finished, both command times of the replicated log (one clock).

The target (docs/cli.md, dependencies): a dependant is bound within one scheduling pass of
its dependency's success, p50 <= 200 ms. A dependency is resolved at the transition of the
job depended on; the leader plans at once when the state changed (a submission, an exit),
so the figure is the exit's commit, one pass and the bind's commit.

Prints one JSON object. ``--smoke`` runs one short chain (seconds).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import loopback_cluster, percentile
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobSpec, Resources
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.rpc.states import job_state
from synapse_ha.rpc.to_proto import spec_to_proto

TARGET_P50_MS = 200


def chain(client: ClusterClient, name: str, length: int) -> list[str]:
    """Submit ``length`` jobs, each afterok the one before; their ids in order."""
    ids: list[str] = []
    for step in range(length):
        deps = Dependencies(after_ok=(ids[-1],)) if ids else None
        spec = JobSpec(
            name=f"{name}-{step}",
            replicas=1,
            resources=Resources(cpu_milli=100, memory_mib=64),
            command=("true",),
            dependencies=deps,
        )
        ids.append(client.submit_job(spec_to_proto(spec)).job_id)
    return ids


def link_latencies(client: ClusterClient, ids: list[str], timeout_s: float) -> list[float]:
    """Once every job of the chain finished: bind time of each minus the finish time of
    the one before (ms)."""
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = [client.get_job(job_id) for job_id in ids]
        if all(job_state(j).finished for j in jobs):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"chain {ids[0]}.. not finished after {timeout_s}s")
        time.sleep(0.2)
    failed = [j.job_id for j in jobs if not j.HasField("attempt")]
    if failed:
        raise RuntimeError(f"jobs never ran: {failed}")
    return [
        float(after.attempt.bound_at_ms - before.finished_at_ms)
        for before, after in itertools.pairwise(jobs)
    ]


def run(chains: int, length: int) -> dict[str, object]:
    nodes = [
        (f"w{i + 1}", ["--mock-gpus", "0", "--cpu", "16", "--memory", "64Gi"]) for i in range(2)
    ]
    with (
        tempfile.TemporaryDirectory(prefix="synapse-bench-") as tmp,
        loopback_cluster(Path(tmp), "1s", nodes) as client,
    ):
        submitted = [chain(client, f"chain{c}", length) for c in range(chains)]
        latencies = [
            ms for ids in submitted for ms in link_latencies(client, ids, 30.0 + 5 * length)
        ]
    p50 = percentile(latencies, 0.5)
    return {
        "chains": chains,
        "length": length,
        "links": len(latencies),
        "heartbeat_interval": "1s",
        "latency_ms_p50": round(p50, 1),
        "latency_ms_p99": round(percentile(latencies, 0.99), 1),
        "latency_ms_mean": round(statistics.fmean(latencies), 1),
        "latency_ms_max": round(max(latencies), 1),
        "target": f"p50 <= {TARGET_P50_MS} ms from a dependency's success to its dependant's bind",
        "meets_target": p50 <= TARGET_P50_MS,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="one short chain")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--length", type=int, default=10)
    args = p.parse_args()
    chains, length = (1, 3) if args.smoke else (args.chains, args.length)
    print(json.dumps(run(chains, length), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
