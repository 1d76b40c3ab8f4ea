"""Gang start latency on loopback: submit → every member's process running.

Starts 3 scheduler replicas and 8 synapse-worker agents (8 mock GPUs each) on 127.0.0.1,
then submits gangs of 4 members one after another. Each member's first act is to write
the wall-clock time to a file; a gang's latency is the latest of its members' times minus
the time just before SubmitJob was called. Members exit 0 at once, so every gang frees
its capacity for the next.

A worker learns of new members in a heartbeat reply (DESIGN §2, pull); once the bind
commits the leader nudges the workers concerned to heartbeat at once, so the figure is
the bind, one heartbeat round trip and the process starts, not the heartbeat interval.
``--heartbeat-interval`` sets the cluster's interval (default 100ms; the production
default is 1s); it matters only when a nudge is lost.

Prints one JSON object. ``--smoke`` runs a few gangs on 2 workers (a few seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import gang_start_latencies, loopback_cluster, percentile


def run(gangs: int, members: int, n_workers: int, heartbeat: str) -> dict[str, object]:
    nodes = [
        (f"w{i + 1}", ["--mock-gpus", "8", "--cpu", "64", "--memory", "256Gi"])
        for i in range(n_workers)
    ]
    with (
        tempfile.TemporaryDirectory(prefix="synapse-bench-") as tmp,
        loopback_cluster(Path(tmp), heartbeat, nodes) as client,
    ):
        out = Path(tmp) / "stamps"
        out.mkdir()
        latencies = gang_start_latencies(client, out, gangs, members)
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return {
        "benchmark": "gang_start",
        "replicas": 3,
        "workers": n_workers,
        "gangs": gangs,
        "members_per_gang": members,
        "heartbeat_interval": heartbeat,
        "latency_ms_p50": round(p50, 1),
        "latency_ms_p99": round(p99, 1),
        "latency_ms_mean": round(statistics.fmean(latencies), 1),
        "latency_ms_max": round(max(latencies), 1),
        "latency_ms_min": round(min(latencies), 1),
        "target_p50_ms": 150,
        "target_p99_ms": 500,
        "meets_target": p50 <= 150 and p99 <= 500,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a few gangs on 2 workers")
    p.add_argument("--gangs", type=int, default=100)
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--heartbeat-interval", default="100ms")
    args = p.parse_args()
    if args.smoke:
        report = run(5, 2, 2, args.heartbeat_interval)
    else:
        report = run(args.gangs, args.members, args.workers, args.heartbeat_interval)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
