"""What security costs: plaintext against mutual TLS + bearer token, in one run.

Two clusters on 127.0.0.1, one after the other, each of 3 scheduler replicas and
``--workers`` ``synapse-worker`` agents (8 mock GPUs each):

* **plaintext**: every replica and worker started with ``--insecure``; the client speaks
  plaintext and carries no credential.
* **tls_token**: the default: mutual TLS on every connection (client → replica, worker →
  replica, replica → replica, replica → worker), every call checked against the access
  policy. The client is an ordinary user: the admin creates a user token (CreateToken)
  and the client sends it as ``authorization: Bearer`` over the transport-only client
  certificate, so every call is a TLS record plus a token lookup.

Measured on each, in the same way:

* **acknowledged submissions per second**: ``--threads`` client threads, each with its
  own client (its own connection), submit ``--submissions`` jobs in total one call at a
  time; a submission counts once a replica acknowledged it (committed). The jobs ask for
  more GPUs than any node has, so they wait in the queue and the workers stay idle. Each
  thread submits once before the clock starts, so connection set-up (the TLS handshake)
  is not part of the rate.
* **gang start latency** p50/p99: ``--gangs`` gangs of ``--members`` members, one after
  the other, submitted by the same user; a gang's latency is from just before SubmitJob
  to the moment its last member's process started (each member writes the wall-clock time
  as its first act, as in ``bench/gang_start.py``).

The two clusters run one after the other on the same machine, so anything else running
there skews one side more than the other: each side records the load average around it.
Prints one JSON object and writes it to ``bench/results/security_cost.json`` (``--out``;
``--smoke`` runs a tiny version and writes only where ``--out`` says).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import gang_start_latencies, percentile, wait_for
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc

RESULT = Path(__file__).resolve().parent / "results" / "security_cost.json"
MODES = ("plaintext", "tls_token")
USER = "bench"
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Sizes:
    submissions: int
    threads: int
    gangs: int
    members: int
    workers: int


@dataclass
class Cluster:
    """One running cluster and how the benchmark's user reaches it."""

    replicas: LocalReplicas
    token: str | None  # the user's bearer token (None: plaintext, no credential)

    def user_client(self, timeout_s: float = 30.0) -> ClusterClient:
        return self.replicas.client(timeout_s=timeout_s, token=self.token)


@contextlib.contextmanager
def cluster(root: Path, mode: str, workers: int, heartbeat: str) -> Iterator[Cluster]:
    """Start 3 replicas and ``workers`` agents in ``mode``; yield once every agent is
    registered (and, secure, once the user's token exists); stop everything on the way
    out."""
    launcher = Launcher(root / "logs")
    replicas = LocalReplicas(
        root / "cluster",
        extra_args=["--heartbeat-interval", heartbeat, "--log-level", "WARNING"],
        insecure=mode == "plaintext",
        launcher=launcher,
    )
    try:
        replicas.start()
        replicas.serving_leader(timeout_s=60)
        for i in range(workers):
            node_id = f"w{i + 1}"
            launcher.start(
                launcher.worker(
                    replicas.grpc_addresses,
                    node_id,
                    root / "workers" / node_id,
                    extra=[
                        "--mock-gpus",
                        str(GPUS_PER_NODE),
                        "--cpu",
                        "64",
                        "--memory",
                        "256Gi",
                        "--no-cgroups",
                        "--stop-grace",
                        "1s",
                        "--fence-grace",
                        "200ms",
                        "--log-level",
                        "WARNING",
                    ],
                )
            )
        with replicas.client(timeout_s=30.0) as admin:
            wait_for(
                "workers to register",
                lambda: len(admin.list_nodes()) == workers,
                timeout_s=60,
            )
            token = None if mode == "plaintext" else admin.create_token(USER).token
        yield Cluster(replicas, token)
    except Exception:
        print(replicas.logs(), file=sys.stderr)
        raise
    finally:
        launcher.close()


# ------------------------------------------------------------------ submissions


def queued_spec(name: str) -> pb.JobSpec:
    """A job no node can hold (more GPUs than a node has): it waits in the queue."""
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=10, memory_mib=16, gpu=GPUS_PER_NODE * 2),
        shell_command="true",
        wait_for_nodes=True,
    )


def submissions_per_s(c: Cluster, count: int, threads: int) -> dict[str, Any]:
    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    ready = threading.Barrier(threads + 1)
    go = threading.Event()
    acked = [0] * threads
    errors: list[BaseException] = []
    clients = [c.user_client() for _ in range(threads)]

    def submitter(i: int) -> None:
        client = clients[i]
        try:
            client.submit_job(queued_spec(f"warm-{i}"))  # the connection, outside the clock
        except Exception as exc:  # reported below; the barrier must still be reached
            errors.append(exc)
        ready.wait()
        go.wait()
        if errors:
            return
        try:
            for n in range(per_thread[i]):
                client.submit_job(queued_spec(f"s{i}-{n}"))
                acked[i] += 1
        except Exception as exc:
            errors.append(exc)

    pool = [threading.Thread(target=submitter, args=(i,), daemon=True) for i in range(threads)]
    try:
        for t in pool:
            t.start()
        ready.wait(timeout=120)
        start = time.perf_counter()
        go.set()
        for t in pool:
            t.join(timeout=600)
        elapsed = time.perf_counter() - start
    finally:
        go.set()
        for client in clients:
            client.close()
    if errors:
        raise RuntimeError(f"{len(errors)} submitter threads failed, e.g. {errors[0]!r}")
    total = sum(acked)
    return {
        "submissions": total,
        "client_threads": threads,
        "seconds": round(elapsed, 3),
        "submissions_per_s": round(total / elapsed, 1),
    }


# ------------------------------------------------------------------- gang start


def gang_start(c: Cluster, root: Path, gangs: int, members: int) -> dict[str, Any]:
    out = root / "stamps"
    out.mkdir()
    with c.user_client() as client:
        latencies = gang_start_latencies(client, out, gangs, members)
    return {
        "gangs": gangs,
        "members_per_gang": members,
        "latency_ms_p50": round(percentile(latencies, 0.5), 1),
        "latency_ms_p99": round(percentile(latencies, 0.99), 1),
        "latency_ms_mean": round(statistics.fmean(latencies), 1),
        "latency_ms_max": round(max(latencies), 1),
    }


# ---------------------------------------------------------------------- the run


def plaintext_refused(c: Cluster) -> bool:
    """Whether a plaintext call (no TLS, no credential) to the leader is refused."""
    leader = c.replicas.serving_leader()
    with grpc.insecure_channel(leader.grpc) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.ListNodes(pb.ListNodesRequest(), timeout=5.0)
        except grpc.RpcError:
            return True
    return False


def measure(root: Path, mode: str, sizes: Sizes, heartbeat: str) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with cluster(root, mode, sizes.workers, heartbeat) as c:
        # Gangs first, while the queue is empty; then the queue fills with submissions.
        starts = gang_start(c, root, sizes.gangs, sizes.members)
        submits = submissions_per_s(c, sizes.submissions, sizes.threads)
        # What the run really was: who the replicas recorded as the jobs' owner, and
        # whether they turn a plaintext caller away.
        with c.user_client() as client:
            owner = client.list_jobs(limit=1)[0].owner
        refused = plaintext_refused(c)
        load_after = os.getloadavg()[0]
    return {
        "transport": "plaintext (--insecure)" if mode == "plaintext" else "mutual TLS",
        "client_credential": "none" if mode == "plaintext" else "user bearer token",
        "jobs_recorded_owner": owner,
        "plaintext_call_refused": refused,
        "submit": submits,
        "gang_start": starts,
        # The machine's load around the measurement: other work skews both sides.
        "load_average_1m": {"before": round(load_before, 2), "after": round(load_after, 2)},
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def run(sizes: Sizes, heartbeat: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix=f"synapse-cost-{mode}-") as tmp:
            results[mode] = measure(Path(tmp), mode, sizes, heartbeat)
    plain, secure = results["plaintext"], results["tls_token"]
    return {
        "benchmark": "security_cost",
        "replicas": 3,
        "workers": sizes.workers,
        "gpus_per_worker": GPUS_PER_NODE,
        "heartbeat_interval": heartbeat,
        **results,
        "tls_token_over_plaintext": {
            "submissions_per_s": ratio(
                secure["submit"]["submissions_per_s"], plain["submit"]["submissions_per_s"]
            ),
            "gang_start_p50": ratio(
                secure["gang_start"]["latency_ms_p50"], plain["gang_start"]["latency_ms_p50"]
            ),
            "gang_start_p99": ratio(
                secure["gang_start"]["latency_ms_p99"], plain["gang_start"]["latency_ms_p99"]
            ),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny run (seconds)")
    p.add_argument("--submissions", type=int, default=4000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--gangs", type=int, default=30)
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--heartbeat-interval", default="100ms")
    p.add_argument("--out", type=Path, help=f"where to write the JSON (default {RESULT})")
    args = p.parse_args()
    if args.smoke:
        sizes = Sizes(submissions=200, threads=4, gangs=5, members=2, workers=2)
        out = args.out
    else:
        sizes = Sizes(args.submissions, args.threads, args.gangs, args.members, args.workers)
        out = args.out or RESULT
    report = {"smoke": args.smoke, **run(sizes, args.heartbeat_interval)}
    text = json.dumps(report, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
