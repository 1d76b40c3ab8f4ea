"""Many submissions: one job per ``SubmitJob`` call against ``SubmitJobs`` batches.

A real cluster for each way (three scheduler replicas on 127.0.0.1 with TLS, as shipped;
no worker, so the jobs stay pending), an admin client connected before the clock starts, and
``--jobs`` one-member jobs submitted

- ``single``: one ``SubmitJob`` per job from ``--threads`` threads at once (the way a
  client without the batch call submits many);
- ``batch``: ``SubmitJobs`` calls of ``--batch`` jobs, from the same number of threads.

The calls go through the client library (:class:`~synapse_ha.client.cluster.ClusterClient`,
not hedged): a call that meets an election follows the new leader and is sent again with
its request id, so a busy machine costs time, never a job or the run. For each way:
acknowledged submissions a second (jobs / wall time of the whole run), and the CPU time
and context switches (every thread of its process, from /proc) per job acknowledged of
the replica that led when the run started. Prints one JSON object (``--out`` also writes
it); ``--smoke`` submits a few jobs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import emit
from bench.throughput import _context_switches, _proc_cpu_s
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobSpec, Resources
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import spec_to_proto

WAYS = ("single", "batch")


def requests(way: str, jobs: int, batch: int) -> list[Any]:
    """The calls of one way: SubmitJobRequests, or SubmitJobsRequests of ``batch``."""
    spec = spec_to_proto(
        JobSpec(name="many", replicas=1, resources=Resources(10, 16, 0), command=("true",))
    )
    items = [pb.SubmitJobRequest(spec=spec, request_id=f"{way}-{i}") for i in range(jobs)]
    if way == "single":
        return items
    return [pb.SubmitJobsRequest(jobs=items[i : i + batch]) for i in range(0, jobs, batch)]


def run_way(root: Path, way: str, jobs: int, batch: int, threads: int) -> dict[str, Any]:
    cluster = LocalReplicas(root / way, extra_args=["--log-level", "WARNING"])
    try:
        cluster.start()
        leader = cluster.serving_leader(timeout_s=60)
        calls = requests(way, jobs, batch)
        with ClusterClient(
            [leader.grpc, *(r.grpc for r in cluster.followers(leader))],
            timeout_s=120,
            per_try_timeout_s=60,
            hedge_s=None,
            channel_factory=cluster.transport.channel,
        ) as client:
            client.list_nodes()  # connected to the leader

            def send(request: Any) -> list[pb.SubmitJobResponse]:
                if way == "single":
                    return [client.submit_job(request.spec, request.request_id)]
                return client.submit_jobs(request.jobs)

            cpu_before, switches_before = _proc_cpu_s(leader.pid), _context_switches(leader.pid)
            started = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                answers = list(pool.map(send, calls))
            wall_s = time.perf_counter() - started
            cpu_s = _proc_cpu_s(leader.pid) - cpu_before
            switches = _context_switches(leader.pid) - switches_before
        made = len({job.job_id for answer in answers for job in answer})
        assert made == jobs, (made, jobs)
        return {
            "jobs": jobs,
            "calls": len(calls),
            "wall_s": round(wall_s, 3),
            "acknowledged_per_s": round(jobs / wall_s, 1),
            "leader_cpu_us_per_job": round(cpu_s / jobs * 1e6),
            "leader_context_switches_per_job": round(switches / jobs, 2),
        }
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4_000, help="jobs submitted each way")
    parser.add_argument("--batch", type=int, default=200, help="jobs per SubmitJobs call")
    parser.add_argument("--threads", type=int, default=8, help="calls in flight at once")
    parser.add_argument("--smoke", action="store_true", help="a few jobs, to check it runs")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    jobs, batch = (40, 10) if args.smoke else (args.jobs, args.batch)
    if jobs < 1 or not 1 <= batch <= 1_000 or args.threads < 1:
        parser.error("--jobs and --threads at least 1, --batch from 1 to 1000")
    with tempfile.TemporaryDirectory(prefix="synapse-submit-batch-") as tmp:
        ways = {way: run_way(Path(tmp), way, jobs, batch, args.threads) for way in WAYS}
    single, batched = ways["single"], ways["batch"]
    emit(
        {
            "smoke": args.smoke,
            "batch_size": batch,
            "threads": args.threads,
            **ways,
            "speedup": round(batched["acknowledged_per_s"] / single["acknowledged_per_s"], 2),
            "leader_cpu_ratio": round(
                batched["leader_cpu_us_per_job"] / max(single["leader_cpu_us_per_job"], 1), 3
            ),
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
