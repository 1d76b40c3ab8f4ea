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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import loopback_cluster, percentile, read_stamps, wait_for
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def run(gangs: int, members: int, n_workers: int, heartbeat: str) -> dict[str, object]:
    nodes = [
        (f"w{i + 1}", ["--mock-gpus", "8", "--cpu", "64", "--memory", "256Gi"])
        for i in range(n_workers)
    ]
    latencies: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="synapse-bench-") as tmp,
        loopback_cluster(Path(tmp), heartbeat, nodes) as client,
    ):
        out = Path(tmp) / "stamps"
        out.mkdir()
        for g in range(gangs):
            spec = pb.JobSpec(
                name=f"gang-{g}",
                replicas=members,
                resources=pb.Resources(cpu_milli=1000, memory_mib=1024, gpu=1),
                shell_command=f"date +%s.%N > {out}/$SYNAPSE_JOB_ID-$RANK",
            )
            submitted = time.time()
            job_id = client.submit_job(spec).job_id
            paths = [out / f"{job_id}-{r}" for r in range(members)]
            stamps = read_stamps(paths, time.monotonic() + 30)
            latencies.append((max(stamps) - submitted) * 1000)
            wait_for(
                f"{job_id} to finish",
                lambda j=job_id: client.get_job(j).state == "SUCCEEDED",  # type: ignore[misc]
                timeout_s=30,
                every_s=0.01,
            )
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
