"""What one user token can take of the control plane, with the default limits.

One cluster on 127.0.0.1: 3 scheduler replicas (mutual TLS), no workers (the jobs ask for
more GPUs than exist and stay pending). An admin creates a user token; the user then:

* **fat specs**: submits ``--fat`` jobs whose environment is 3.9 MB (just under gRPC's
  4 MiB message limit). Measured: how many were refused with ``LIMIT_EXCEEDED``, and each
  replica's resident memory (``VmRSS``) and data directory (journal and snapshots)
  before and after.
* **flood**: ``--threads`` threads submit ``--flood`` small jobs as fast as the replicas
  answer. Measured: accepted, refused (``LIMIT_EXCEEDED``, limit ``submit_per_s``), the
  wall time, and the accepted rate against what the token bucket allows (burst plus
  rate x time). The bucket is the default one unless ``--burst``/``--rate`` set it (the
  smoke run sets 20 and 1/s, so that its flood meets the limit on any machine).
* **admin alongside**: while the user is refused, the admin submits ``--admin-jobs``
  jobs and each must be accepted (admins are not limited by user limits); measured: the
  admin's p50/p99 submit latency during the flood.

Prints one JSON object and writes it to ``bench/results/abuse.json`` (``--out``;
``--smoke`` runs a small version and writes only where ``--out`` says).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import synapse_ha.programs  # noqa: F401  (gRPC without its fork handlers, first)
from bench.loopback import percentile
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.cluster_config import Limits
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

RESULTS = Path(__file__).resolve().parent / "results" / "abuse.json"
NEVER_FITS = 64  # GPUs per member: no node (there are none) has them, so jobs stay pending
FAT_ENV_BYTES = 3_900_000
MIB = 1024 * 1024


def pending_job(name: str, env: dict[str, str] | None = None) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=NEVER_FITS),
        shell_command="true",
        env=[pb.EnvVar(name=k, value=v) for k, v in (env or {}).items()],
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def dir_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / MIB


def footprint(replicas: LocalReplicas) -> dict[str, dict[str, float]]:
    out = {}
    for r in replicas.replicas:
        assert r.pid is not None
        out[r.replica_id] = {
            "rss_mib": round(rss_mib(r.pid), 1),
            "data_mib": round(dir_mib(r.data_dir), 2),
        }
    return out


def submit(client: ClusterClient, spec: pb.JobSpec) -> str:
    """ "accepted", or the reason's name (with the limit) of a refusal."""
    try:
        client.submit_job(spec)
    except grpc.RpcError as exc:
        failure = failure_of(exc)
        if failure.reason is Reason.LIMIT_EXCEEDED:
            return f"LIMIT_EXCEEDED:{failure.metadata.get('limit', '')}"
        return failure.reason.name
    return "accepted"


def fat_specs(replicas: LocalReplicas, user: ClusterClient, count: int) -> dict[str, Any]:
    before = footprint(replicas)
    outcomes = [
        submit(user, pending_job(f"fat-{i}", {"BLOB": "x" * FAT_ENV_BYTES})) for i in range(count)
    ]
    time.sleep(1.0)  # anything replicated would be applied and journaled by now
    after = footprint(replicas)
    return {
        "submissions": count,
        "env_bytes_each": FAT_ENV_BYTES,
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
        "before": before,
        "after": after,
        "rss_growth_mib_max": round(
            max(after[r]["rss_mib"] - before[r]["rss_mib"] for r in before), 1
        ),
        "data_growth_mib_max": round(
            max(after[r]["data_mib"] - before[r]["data_mib"] for r in before), 2
        ),
    }


def flood(
    replicas: LocalReplicas,
    token: str,
    total: int,
    threads: int,
    admin_jobs: int,
    bucket: tuple[int, int],
) -> dict[str, Any]:
    outcomes: list[str] = []
    lock = threading.Lock()
    counter = iter(range(total))

    def run() -> None:
        with replicas.client(timeout_s=30.0, token=token) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                outcome = submit(client, pending_job(f"flood-{i}"))
                with lock:
                    outcomes.append(outcome)

    admin_latencies_ms: list[float] = []
    admin_outcomes: list[str] = []
    workers = [threading.Thread(target=run, name=f"flood-{t}") for t in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    with replicas.client(timeout_s=30.0) as admin:
        for i in range(admin_jobs):
            t0 = time.perf_counter()
            admin_outcomes.append(submit(admin, pending_job(f"admin-{i}")))
            admin_latencies_ms.append((time.perf_counter() - t0) * 1000)
    for w in workers:
        w.join()
    wall_s = time.monotonic() - started
    burst, per_s = bucket
    accepted = outcomes.count("accepted")
    allowed = burst + per_s * wall_s
    return {
        "submissions": total,
        "threads": threads,
        "wall_s": round(wall_s, 2),
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
        "accepted": accepted,
        "bucket_allows_at_most": int(allowed),
        "accepted_within_bucket": accepted <= allowed,
        "admin": {
            "submissions": admin_jobs,
            "outcomes": {o: admin_outcomes.count(o) for o in sorted(set(admin_outcomes))},
            "p50_ms": round(percentile(admin_latencies_ms, 0.5), 1),
            "p99_ms": round(percentile(admin_latencies_ms, 0.99), 1),
            "mean_ms": round(statistics.fmean(admin_latencies_ms), 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fat", type=int, default=5, help="3.9 MB submissions")
    parser.add_argument("--flood", type=int, default=2000, help="small submissions")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--admin-jobs", type=int, default=50)
    parser.add_argument(
        "--burst", type=int, help="the submit bucket's burst (default: the default limit)"
    )
    parser.add_argument(
        "--rate", type=int, help="its refill per second (default: the default limit)"
    )
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    parser.add_argument("--out", type=Path, help=f"where to write the JSON (default {RESULTS})")
    args = parser.parse_args()
    if args.smoke:
        args.fat, args.flood, args.threads, args.admin_jobs = 1, 260, 2, 5
        args.burst, args.rate = 20, 1
    out_path = args.out or (None if args.smoke else RESULTS)
    with tempfile.TemporaryDirectory(prefix="synapse-abuse-") as tmp:
        replicas = LocalReplicas(Path(tmp) / "cluster", extra_args=["--log-level", "WARNING"])
        try:
            replicas.start()
            replicas.serving_leader(timeout_s=60)
            defaults = Limits()
            bucket = (args.burst or defaults.submit_burst, args.rate or defaults.submit_per_s)
            with replicas.client(timeout_s=30.0) as admin:
                token = admin.create_token("mallory").token
                if bucket != (defaults.submit_burst, defaults.submit_per_s):
                    admin.set_limits({"submit_burst": bucket[0], "submit_per_s": bucket[1]})
            with replicas.client(timeout_s=30.0, token=token) as user:
                fat = fat_specs(replicas, user, args.fat)
            report = {
                "benchmark": "abuse",
                "limits": {
                    "spec_bytes": defaults.spec_bytes,
                    "env_bytes": defaults.env_bytes,
                    "submit_burst": bucket[0],
                    "submit_per_s": bucket[1],
                },
                "fat_specs": fat,
                "flood": flood(replicas, token, args.flood, args.threads, args.admin_jobs, bucket),
                "after_all": footprint(replicas),
            }
        except Exception:
            print(replicas.logs(), file=sys.stderr)
            raise
        finally:
            replicas.close()
    text = json.dumps(report, indent=2)
    print(text)
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text + "\n")


if __name__ == "__main__":
    main()
