"""Memory benchmark: a real replica's RSS at scale, the encoded state, and where the
state's memory goes.

1. **A real replica.** A one-replica cluster on loopback (mutual TLS, the benchmark as
   the admin by certificate), loaded from this process, a separate one, with pipelined
   RegisterNode (``--nodes``, 8 GPUs each) and SubmitJob calls (``--jobs`` one-GPU jobs,
   all bound: live jobs). The replica's resident set (``VmRSS`` and its peak ``VmHWM``
   from ``/proc/<pid>/status``) is read when it started, after the nodes and after the
   jobs; the encoded state is the size of ``GetReplicaState``'s canonical encoding
   (:mod:`synapse_ha.core.codec.versioned`), compact as a new cluster writes it. The nodes' dead
   timeout is set long so that nothing is reaped while the benchmark loads. The loads are
   sent again when refused for a while (UNAVAILABLE, or no answer in time) and the reads
   go through the client library (:class:`~synapse_ha.client.cluster.ClusterClient`), so
   a busy machine costs time, not the run.
2. **Attribution, in process.** The same state is built with ``apply`` alone under
   ``tracemalloc``: the traced size of the state, and the source lines that allocated
   most of it (what a growth of the state's memory comes from).

Prints one JSON object (``--out`` also writes it to a file). ``--smoke`` runs a tiny
version in seconds.
Targets: RSS <= 1 GiB with 10,000 nodes and 50,000 live jobs; encoded state <= 20 MB per
10,000 nodes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import wait_for
from bench.quorum import loopback_host, pipelined, register_request, small_spec
from bench.report import emit
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core import commands as c
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, NodeInfo, Resources
from synapse_ha.core.scheduler import schedule
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

MIB = 2**20


def proc_memory(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of process ``pid`` in MiB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def live_jobs(client: ClusterClient) -> int:
    """Jobs waiting or holding resources (not finished)."""
    status = client.cluster_status()
    return int(status.pending_jobs + status.running_jobs)


def encoded_state(client: ClusterClient) -> bytes:
    """The leader's ``GetReplicaState`` (its canonical encoding of the state)."""
    request = pb.GetReplicaStateRequest()
    answer: pb.GetReplicaStateResponse = client.call(
        "GetReplicaState", lambda a, t: client.scheduler(a).GetReplicaState(request, timeout=t)
    )
    return answer.encoded_state


def replica_run(root: Path, nodes: int, jobs: int) -> dict[str, Any]:
    # As a new cluster is deployed (deploy/scheduler-*.toml): the compact state on. No
    # worker runs the members: long dead and start timeouts keep every job bound (live).
    cluster = LocalReplicas(
        root / "mem",
        size=1,
        extra_args=["--dead-timeout", "1h", "--start-timeout", "1h", "--compact-state"],
    )
    try:
        cluster.start()
        leader = cluster.serving_leader(timeout_s=60)
        pid = leader.pid
        assert pid is not None
        report: dict[str, Any] = {"nodes": nodes, "jobs": jobs, "compact_state": True}
        report["rss_started_mib"] = proc_memory(pid)
        with ClusterClient(
            [leader.grpc],
            timeout_s=120,
            per_try_timeout_s=60,
            channel_factory=cluster.transport.channel,
        ) as client:
            agent, stub = client.agent(leader.grpc), client.scheduler(leader.grpc)
            started = time.monotonic()
            registrations = [
                register_request(f"m-{i:05d}", loopback_host(i), gpu=8) for i in range(nodes)
            ]
            pipelined(agent.RegisterNode, registrations, 128, timeout_s=120)
            report["register_s"] = round(time.monotonic() - started, 1)
            report["rss_with_nodes_mib"] = proc_memory(pid)
            nodes_state = encoded_state(client)
            report["encoded_state_nodes_only_mb"] = round(len(nodes_state) / MIB, 2)
            started = time.monotonic()
            chunk = 5_000
            for start in range(0, jobs, chunk):
                requests = [
                    pb.SubmitJobRequest(spec=small_spec(f"j{i}", gpu=1), request_id=f"j{i}")
                    for i in range(start, min(jobs, start + chunk))
                ]
                pipelined(stub.SubmitJob, requests, 128, timeout_s=120)

            def all_bound() -> bool:
                return not client.list_jobs(limit=1, states=["PENDING"])

            wait_for("every job to be bound", all_bound, timeout_s=600, every_s=0.5)
            report["submit_and_bind_s"] = round(time.monotonic() - started, 1)
            report["live_jobs"] = live_jobs(client)
            report["rss_with_jobs_mib"] = proc_memory(pid)
            try:
                state = encoded_state(client)
            except grpc.RpcError as exc:  # larger than the channel's 4 MiB message limit
                report["encoded_state_error"] = str(exc.details())
            else:
                encoded = len(state)
                report["encoded_state_mb"] = round(encoded / MIB, 2)
                report["encoded_state_mb_per_10k_nodes"] = round(encoded / MIB * 10_000 / nodes, 2)
                nodes_only = len(nodes_state)
                report["encoded_bytes_per_node"] = round(nodes_only / nodes)
                report["encoded_bytes_per_job"] = round((encoded - nodes_only) / jobs)
            report["rss_after_reads_mib"] = proc_memory(pid)
        return report
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.close()


def build_state(
    nodes: int, jobs: int, after_nodes: Callable[[], None] | None = None
) -> ClusterState:
    """``nodes`` registered machines and ``jobs`` one-member jobs, scheduled once, built
    in process with ``apply``; ``after_nodes`` runs between the two."""
    state = ClusterState()
    for i in range(nodes):
        info = NodeInfo(
            node_id=f"m-{i:05d}",
            address=f"{loopback_host(i)}:7070",
            capacity=Resources(64_000, 512 * 1024, 8),
            gpu_islands=(tuple(range(8)),),
            topology=(("rack", f"r{i // 32}"),),
        )
        apply(state, c.RegisterNode(info, 0))
    if after_nodes is not None:
        after_nodes()
    for i in range(jobs):
        spec = JobSpec(name=f"j{i}", replicas=1, resources=Resources(10, 16, 1), command=("true",))
        apply(state, c.SubmitJob(spec, f"j{i}", 1))
    command = schedule(state, 2).command(2)
    if command is not None:
        apply(state, command)
    return state


def attribution(nodes: int, jobs: int, top: int = 12) -> dict[str, Any]:
    """Build the same state in process with ``apply`` under ``tracemalloc``; the traced
    size and the source lines holding the most of it."""
    gc.collect()
    tracemalloc.start(1)
    base, _ = tracemalloc.get_traced_memory()
    traced_nodes: list[int] = []
    state = build_state(
        nodes, jobs, lambda: traced_nodes.append(tracemalloc.get_traced_memory()[0] - base)
    )
    nodes_bytes = traced_nodes[0]
    gc.collect()
    snap = tracemalloc.take_snapshot()
    total = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    live = sum(1 for j in state.jobs.values() if j.state.value in ("PENDING", "SCHEDULED"))
    stats = snap.statistics("lineno")[:top]
    return {
        "nodes": nodes,
        "jobs": jobs,
        "live_jobs": live,
        "traced_nodes_mb": round(nodes_bytes / MIB, 2),
        "traced_state_mb": round(total / MIB, 2),
        **encodings(state),
        "top_allocation_sites": [
            {
                "where": f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
                "mb": round(s.size / MIB, 2),
                "blocks": s.count,
            }
            for s in stats
        ],
    }


def encodings(state: ClusterState) -> dict[str, Any]:
    """The state's encoded size and the CPU time to encode and decode it, written in full
    and compact (``ClusterConfig.compact_state``)."""
    out: dict[str, Any] = {}
    for name, compact in (("full", False), ("compact", True)):
        state.config = replace(state.config, compact_state=compact)
        started = time.process_time()
        data = encode_state(state)
        encoded = time.process_time() - started
        started = time.process_time()
        decode_state(data)
        decoded = time.process_time() - started
        suffix = "" if name == "full" else "_compact"
        out[f"encoded_state{suffix}_mb"] = round(len(data) / MIB, 2)
        out[f"encode{suffix}_cpu_s"] = round(encoded, 2)
        out[f"decode{suffix}_cpu_s"] = round(decoded, 2)
    state.config = replace(state.config, compact_state=False)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--skip-replica", action="store_true", help="attribution only")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    nodes, jobs = (50, 200) if args.smoke else (args.nodes, args.jobs)
    report: dict[str, Any] = {"smoke": args.smoke}
    report["attribution"] = attribution(nodes, jobs)
    if not args.skip_replica:
        with tempfile.TemporaryDirectory(prefix="synapse-memory-") as tmp:
            report["replica"] = replica_run(Path(tmp), nodes, jobs)
    report["targets"] = {"rss_mib": 1024, "encoded_state_mb_per_10k_nodes": 20}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
