"""A storm of read calls against every replica, while thousands of nodes heartbeat.

Three real replicas on loopback; ``nodes`` simulated nodes (8 GPUs each) register and
heartbeat once a second from this process; ``running`` gangs are bound to them and a long
queue of ``pending`` gangs that cannot fit waits. Then, for ``seconds``, ``threads`` client
threads call ExplainJob, GetJob and ListJobs (the full list) round-robin against every
replica (stale reads on followers, as a dashboard would). Each reader sends ExplainJob to
the first address, GetJob to the second and ListJobs to the third; ``--lists-on leader``
orders the addresses so that the leader serves the ListJobs storm (the case that weighs
most on its heartbeats), ``--lists-on follower`` so that a follower does.

Reads are served from snapshots, so they must not stall the log or the heartbeats. Prints
JSON: read calls served, heartbeat round trip p50/p99/max before and during the storm
(target p99 < 100 ms during), the longest gap between two answered heartbeats of any node
holding members (a gap past ``lease_ttl`` would fence its members), gangs requeued or
failed (must be 0), and whether the leader kept its term. ``--smoke`` runs a tiny version.

Secure by default: every connection is mutual TLS, the benchmark calling as the cluster's
admin by certificate (an admin may speak for the simulated nodes); the figures include TLS
and the access check on every call.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loopback import percentile
from quorum import loopback_host, pipelined, register_request, small_spec

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import JobState
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.errors import failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import job_state, replica_role
from synapse_ha.security.tls import Transport

# Failures after which a worker looks for the leader again. Others (a deadline, a call
# cancelled) leave the channel as it is: closing it would cancel every call in flight.
_LEADER_MOVED = frozenset({"UNAVAILABLE", "FAILED_PRECONDITION"})
LEASE_TTL_S = 4.0  # the default lease_ttl: a longer silence fences a node's members
READS = ("ExplainJob", "GetJob", "ListJobs")  # by the position of the address they go to


def waiting_spec(name: str, replicas: int) -> pb.JobSpec:
    """A gang of ``replicas`` x 8 GPUs that waits for nodes to join."""
    spec = small_spec(name, replicas, gpu=8)
    spec.wait_for_nodes = True
    return spec


class Heartbeats(threading.Thread):
    """Every node heartbeats once per interval, the sends spread evenly over it; records
    each round trip and, per node, the longest time between two answered heartbeats."""

    def __init__(
        self,
        find_leader: Callable[[], str],
        node_ids: list[str],
        transport: Transport,
        interval_s: float = 1.0,
    ) -> None:
        super().__init__(daemon=True)
        self.find_leader = find_leader
        self.transport = transport
        self.channel = transport.channel(find_leader())
        self.stub = pb_grpc.NodeAgentServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.node_ids = node_ids
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.rtts: list[tuple[float, float]] = []  # (sent at, seconds)
        self.failed = 0
        self.moved = 0  # failures that say the leader may have moved
        self.failed_by_code: dict[str, int] = {}
        self.last_ok: dict[str, float] = {}
        self.max_gap: dict[str, float] = {}

    def _done(self, node_id: str, sent: float, future: grpc.Future) -> None:
        now = time.monotonic()
        with self.lock:
            error = future.exception()
            if error is not None:
                self.failed += 1
                code = error.code().name if isinstance(error, grpc.Call) else type(error).__name__
                self.failed_by_code[code] = self.failed_by_code.get(code, 0) + 1
                if code in _LEADER_MOVED:
                    self.moved += 1
                return
            self.rtts.append((sent, now - sent))
            last = self.last_ok.get(node_id)
            if last is not None:
                self.max_gap[node_id] = max(self.max_gap.get(node_id, 0.0), now - last)
            self.last_ok[node_id] = now

    def run(self) -> None:
        moved = 0
        while not self.stop.is_set():
            started = time.monotonic()
            if self.moved > moved:  # the leader may have moved: find it, as workers do
                moved = self.moved
                self.channel.close()
                self.channel = self.transport.channel(self.find_leader())
                self.stub = pb_grpc.NodeAgentServiceStub(self.channel)  # type: ignore[no-untyped-call]
            # Spread over the interval, as independent workers are, not one burst.
            gap = self.interval_s / max(1, len(self.node_ids))
            for i, node_id in enumerate(self.node_ids):
                if self.stop.wait(max(0.0, started + i * gap - time.monotonic())):
                    break
                sent = time.monotonic()
                future = self.stub.Heartbeat.future(
                    pb.HeartbeatRequest(node_id=node_id), timeout=5.0
                )
                future.add_done_callback(
                    lambda f, n=node_id, s=sent: self._done(n, s, f)  # type: ignore[misc]
                )
            self.stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        self.channel.close()

    def window(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [rtt for sent, rtt in self.rtts if start <= sent < end]


class Reader(threading.Thread):
    """Calls ExplainJob, GetJob and ListJobs (every page, as a dashboard listing all jobs
    does) round-robin on every replica until stopped. A call the replica refuses as
    OVERLOADED (heavy reads are rationed) is counted and, unless the refusal names a
    follower to ask instead, the reader pauses briefly before its next call."""

    def __init__(
        self, addresses: list[str], job_ids: list[str], seed: int, transport: Transport
    ) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.channels = [transport.channel(a) for a in addresses]
        self.stubs = [pb_grpc.SchedulerServiceStub(c) for c in self.channels]  # type: ignore[no-untyped-call]
        self.job_ids = job_ids
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.calls = {"ExplainJob": 0, "GetJob": 0, "ListJobs": 0}
        self.jobs_listed = 0
        self.overloaded = 0
        self.redirected = 0  # asked again at the follower a leader named
        self.errors = 0

    def _ask(self, at: int, call: Callable[[Any], Any]) -> Any:
        """``call(stub)`` at the replica ``at``; a leader that refuses it as OVERLOADED
        naming followers (``read_from``) is left for the first of them, as
        :class:`ClusterClient` does."""
        try:
            return call(self.stubs[at])
        except grpc.RpcError as exc:
            named = self._named_follower(exc)
            if named is None:
                raise
            self.overloaded += 1
            self.redirected += 1
            return call(self.stubs[named])

    def _named_follower(self, exc: grpc.RpcError) -> int | None:
        if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None
        for address in failure_of(exc).metadata.get("read_from", "").split(","):
            if address in self.addresses:
                return self.addresses.index(address)
        return None

    def _read(self, at: int, kind: str, job_id: str) -> None:
        if kind == "ExplainJob":
            request: Any = pb.ExplainJobRequest(job_id=job_id, allow_stale=True)
            self._ask(at, lambda stub: stub.ExplainJob(request, timeout=10))
        elif kind == "GetJob":
            request = pb.GetJobRequest(job_id=job_id, allow_stale=True)
            self._ask(at, lambda stub: stub.GetJob(request, timeout=10))
        else:
            token = ""
            while True:
                request = pb.ListJobsRequest(allow_stale=True, page_token=token)
                page = self._ask(at, lambda stub, r=request: stub.ListJobs(r, timeout=30))
                self.jobs_listed += len(page.jobs)
                token = page.next_page_token
                if not token:
                    break

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            kind = READS[i % 3]
            try:
                self._read(i % len(self.stubs), kind, self.rng.choice(self.job_ids))
                self.calls[kind] += 1
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    self.overloaded += 1
                    self.stop.wait(self.rng.uniform(0.05, 0.2))
                else:
                    self.errors += 1
            i += 1
        for channel in self.channels:
            channel.close()


def read_storm(
    addresses: list[str],
    job_ids: list[str],
    threads: int,
    seconds: float,
    out: Any,
    transport: Transport,
) -> None:
    """The readers, in a process of their own: the heartbeat round trips measured in the
    parent must not include waiting for this process's interpreter lock."""
    readers = [Reader(addresses, job_ids, seed, transport) for seed in range(threads)]
    started = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process
    for reader in readers:
        reader.start()
    time.sleep(seconds)
    for reader in readers:
        reader.stop.set()
    stopped = time.monotonic()
    for reader in readers:
        reader.join(timeout=30)
    out.put(
        {
            "calls": {k: sum(r.calls[k] for r in readers) for k in readers[0].calls},
            "jobs_listed": sum(r.jobs_listed for r in readers),
            "overloaded": sum(r.overloaded for r in readers),
            "redirected": sum(r.redirected for r in readers),
            "errors": sum(r.errors for r in readers),
            "started": started,
            "stopped": stopped,
        }
    )


def storm_addresses(addresses: list[str], leader: str, lists_on: str) -> list[str]:
    """The replicas' addresses in the order the readers use them (:data:`READS`):
    ``leader`` last for ``lists_on="leader"``, first for ``"follower"``, as given for
    ``"any"``."""
    others = [a for a in addresses if a != leader]
    if lists_on == "leader":
        return [*others, leader]
    if lists_on == "follower":
        return [leader, *others]
    return list(addresses)


def _rtt_summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 0.50) * 1000, 2),
        "p99_ms": round(percentile(values, 0.99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def run(
    root: Path,
    nodes: int,
    running: int,
    pending: int,
    threads: int,
    seconds: float,
    replica_args: tuple[str, ...] = (),
    lists_on: str = "any",
) -> Any:
    cluster = LocalReplicas(root / "storm", extra_args=replica_args)
    heartbeats: Heartbeats | None = None
    storm: Any = None
    observer: ClusterClient | None = None
    try:
        cluster.start()
        observer = cluster.client(timeout_s=60, per_try_timeout_s=30)
        leader = cluster.serving_leader()
        with cluster.channel(leader.grpc) as channel:
            agent = pb_grpc.NodeAgentServiceStub(channel)  # type: ignore[no-untyped-call]
            stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
            node_ids = [f"node-{i:05d}" for i in range(nodes)]
            pipelined(
                agent.RegisterNode,
                [register_request(n, loopback_host(i), gpu=8) for i, n in enumerate(node_ids)],
                64,
            )
            heartbeats = Heartbeats(
                lambda: cluster.serving_leader().grpc, node_ids, cluster.transport
            )
            heartbeats.start()
            # Gangs of 4 x 8 GPUs hold whole nodes; gangs larger than the cluster wait for
            # nodes to join (they ask to: otherwise they are refused at submission).
            gangs = [
                pb.SubmitJobRequest(spec=small_spec(f"run{i}", 4, gpu=8), request_id=f"run{i}")
                for i in range(running)
            ] + [
                pb.SubmitJobRequest(spec=waiting_spec(f"wait{i}", nodes + 1), request_id=f"wait{i}")
                for i in range(pending)
            ]
            answers, _ = pipelined(stub.SubmitJob, gangs, 128)
            job_ids = [a.job_id for a in answers]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if len(observer.list_jobs(states=["SCHEDULED"], allow_stale=True)) >= running:
                        break
                except (grpc.RpcError, ClusterUnavailable):
                    pass
                time.sleep(0.2)
        # The storm starts from a settled cluster: the leader as it is now.
        leader = cluster.serving_leader()
        term_before = cluster.local_status(leader).term
        addresses = storm_addresses(cluster.grpc_addresses, leader.grpc, lists_on)
        with cluster.channel(leader.grpc) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
            quiet_start = time.monotonic()
            time.sleep(min(5.0, seconds / 3))
            spawn = multiprocessing.get_context("spawn")
            results = spawn.Queue()
            storm = spawn.Process(
                target=read_storm,
                args=(
                    addresses,
                    job_ids,
                    threads,
                    seconds,
                    results,
                    cluster.transport,
                ),
                daemon=True,
            )
            storm.start()
            readers_done = results.get(timeout=seconds + 120)
            storm.join(timeout=30)
            storm_start, storm_end = readers_done["started"], readers_done["stopped"]
            status = cluster.local_status(leader)
            # Read from whichever replica answers: the leader may have moved.
            jobs = observer.list_jobs(allow_stale=True)
        heartbeats.stop.set()
        heartbeats.join(timeout=10)
        holding = {
            m.node_id for j in jobs if job_state(j) is JobState.SCHEDULED for m in j.attempt.members
        }
        gaps = [heartbeats.max_gap.get(n, 0.0) for n in sorted(holding)]
        calls = readers_done["calls"]
        return {
            "benchmark": "read_storm",
            "nodes": nodes,
            "running_gangs": running,
            "pending_gangs": pending,
            "reader_threads": threads,
            "replica_args": list(replica_args),
            "lists_on": lists_on,
            "leader_serves": READS[addresses.index(leader.grpc)],
            "storm_seconds": seconds,
            "read_calls": calls,
            "read_calls_per_s": round(sum(calls.values()) / (storm_end - storm_start), 1),
            "jobs_listed": readers_done["jobs_listed"],
            "reads_refused_overloaded": readers_done["overloaded"],
            "reads_sent_to_a_named_follower": readers_done["redirected"],
            "read_errors": readers_done["errors"],
            "heartbeat_rtt_before_storm": _rtt_summary(heartbeats.window(quiet_start, storm_start)),
            "heartbeat_rtt_during_storm": _rtt_summary(heartbeats.window(storm_start, storm_end)),
            "heartbeats_failed": heartbeats.failed,
            "heartbeats_failed_by_code": dict(sorted(heartbeats.failed_by_code.items())),
            "longest_heartbeat_gap_of_a_node_with_members_s": round(max(gaps, default=0.0), 3),
            "nodes_past_lease_ttl": sum(1 for g in gaps if g > LEASE_TTL_S),
            "gangs_requeued_or_failed": sum(
                1 for j in jobs if j.requeues or j.retries_used or job_state(j) is JobState.FAILED
            ),
            "leader_kept_its_term": replica_role(status) is ReplicaRole.LEADER
            and status.term == term_before,
            "targets": {"heartbeat_rtt_during_storm_p99_ms": 100, "nodes_past_lease_ttl": 0},
        }
    finally:
        if storm is not None and storm.is_alive():
            storm.kill()
            storm.join(timeout=10)
        if heartbeats is not None:
            heartbeats.stop.set()
        if observer is not None:
            observer.close()
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a tiny version, seconds long")
    parser.add_argument("--nodes", type=int, default=1500)
    parser.add_argument("--pending", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--heavy-reads", type=int, help="the replicas' --heavy-reads")
    parser.add_argument(
        "--heavy-read-cpu-share", type=float, help="the replicas' --heavy-read-cpu-share"
    )
    parser.add_argument(
        "--lists-on",
        choices=("any", "leader", "follower"),
        default="any",
        help="which replica serves the ListJobs storm (any: the addresses' own order)",
    )
    args = parser.parse_args()
    replica_args: tuple[str, ...] = ()
    if args.heavy_reads is not None:
        replica_args += ("--heavy-reads", str(args.heavy_reads))
    if args.heavy_read_cpu_share is not None:
        replica_args += ("--heavy-read-cpu-share", str(args.heavy_read_cpu_share))
    with tempfile.TemporaryDirectory(prefix="synapse-storm-") as tmp:
        if args.smoke:
            result = run(Path(tmp), 20, 2, 20, threads=2, seconds=2.0, lists_on=args.lists_on)
        else:
            result = run(
                Path(tmp),
                nodes=args.nodes,
                running=min(100, args.nodes // 8),
                pending=args.pending,
                threads=args.threads,
                seconds=args.seconds,
                replica_args=replica_args,
                lists_on=args.lists_on,
            )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
