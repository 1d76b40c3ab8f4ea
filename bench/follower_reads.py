"""Follower reads on loopback: the leader's CPU per read with reads sent to the leader,
and with reads served by followers for clients that carry a read token.

Starts 3 replicas on 127.0.0.1 and submits ``--jobs`` jobs. Then, for each mode, for
``--seconds``, ``--clients`` threads each with its own client (its own read token) loop:
submit a job, then ``--reads`` GetJob calls of it and one ListJobs page of 100. Every
read must find the client's own job (read-your-writes); a miss is counted and must be 0.
Reported per mode: reads/s, the leader's and each follower's CPU seconds per 1,000 reads
(utime + stime of its process over the window), the share of reads followers served,
and misses. ``--smoke`` runs a tiny version.

Prints one JSON object and writes it to bench/results/follower_reads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

RESULT = Path(__file__).resolve().parent / "results" / "follower_reads.json"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spec(name: str) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64),
        shell_command="true",
    )


def client_loop(
    cluster: LocalReplicas,
    follower_reads: bool,
    reads: int,
    until: float,
    out: dict[str, int],
    lock: threading.Lock,
) -> None:
    counts = {"reads": 0, "by_followers": 0, "misses": 0, "writes": 0}
    with ClusterClient(
        cluster.grpc_addresses,
        timeout_s=20.0,
        channel_factory=cluster.transport.channel,
        follower_reads=follower_reads,
    ) as client:
        n = 0
        while time.monotonic() < until:
            job_id = client.submit_job(spec(f"read-{n}")).job_id
            counts["writes"] += 1
            n += 1
            for _ in range(reads):
                answer = client.ask("GetJob", pb.GetJobRequest(job_id=job_id))
                counts["reads"] += 1
                counts["by_followers"] += int(answer.stale)
                counts["misses"] += int(answer.job.job_id != job_id)
            page = client.ask("ListJobs", pb.ListJobsRequest(limit=100))
            counts["reads"] += 1
            counts["by_followers"] += int(page.stale)
    with lock:
        for key, value in counts.items():
            out[key] = out.get(key, 0) + value


def run_mode(
    cluster: LocalReplicas, follower_reads: bool, clients: int, reads: int, seconds: float
) -> dict[str, Any]:
    leader = cluster.serving_leader(timeout_s=30)
    followers = [r for r in cluster.replicas if r is not leader]
    pids = {r.replica_id: r.process.pid for r in cluster.replicas if r.process is not None}
    before = {rid: cpu_s(pid) for rid, pid in pids.items()}
    counts: dict[str, int] = {}
    lock = threading.Lock()
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=client_loop, args=(cluster, follower_reads, reads, until, counts, lock)
        )
        for _ in range(clients)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    used = {rid: cpu_s(pid) - before[rid] for rid, pid in pids.items()}
    thousands = max(counts.get("reads", 0), 1) / 1000
    return {
        "follower_reads": follower_reads,
        "reads": counts.get("reads", 0),
        "writes": counts.get("writes", 0),
        "reads_per_s": round(counts.get("reads", 0) / elapsed, 1),
        "served_by_followers": round(counts.get("by_followers", 0) / thousands / 1000, 3),
        "misses": counts.get("misses", 0),
        "leader_cpu_s_per_1000_reads": round(used[leader.replica_id] / thousands, 3),
        "follower_cpu_s_per_1000_reads": [
            round(used[f.replica_id] / thousands, 3) for f in followers
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny version, seconds long")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--reads", type=int, default=20, help="GetJob calls per submission")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=500, help="jobs submitted first")
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.seconds, args.jobs = 2, 2.0, 20
    with tempfile.TemporaryDirectory(prefix="synapse-follower-reads-") as tmp:
        root = Path(tmp)
        cluster = LocalReplicas(
            root / "cluster",
            extra_args=["--log-level", "WARNING"],
            launcher=Launcher(root / "logs"),
        )
        try:
            cluster.start()
            cluster.serving_leader(timeout_s=60)
            with cluster.client(timeout_s=30) as client:
                for i in range(args.jobs):
                    client.submit_job(spec(f"base-{i}"))
            modes = [
                run_mode(cluster, on, args.clients, args.reads, args.seconds)
                for on in (False, True)
            ]
        finally:
            cluster.close()
    off, on = modes
    result = {
        "benchmark": "follower_reads",
        "clients": args.clients,
        "reads_per_write": args.reads,
        "seconds": args.seconds,
        "modes": modes,
        "leader_cpu_per_read_ratio": round(
            on["leader_cpu_s_per_1000_reads"] / max(off["leader_cpu_s_per_1000_reads"], 1e-9), 3
        ),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if not args.smoke:
        RESULT.write_text(text + "\n")


if __name__ == "__main__":
    main()
