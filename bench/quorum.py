"""Quorum benchmark: three real replicas on loopback, driven through gRPC.

(a) acknowledged submissions per second (many submissions in flight at once);
(b) gang members bound per second while ~1,000 simulated nodes heartbeat from this
    process;
(c) leader kills (kill -9) under a stream of submissions: time from the kill to the first
    committed write and to the next committed bind, p50 and max, and how many
    acknowledged writes were lost (must be 0).

Secure by default, as a deployed cluster: mutual TLS on every connection, the benchmark
calling as the cluster's admin by certificate (an admin may speak for the simulated
nodes). Prints one JSON object. ``--smoke`` runs a tiny version in seconds (a test runs
it).
Targets on a two-core machine: >= 2,000 submissions/s, >= 5,000 members bound/s,
failover p50 <= 1 s and max <= 2 s, 0 lost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import wait_for
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.security.tls import Transport


def loopback_host(i: int) -> str:
    """A distinct loopback address for simulated node ``i``: the leader nudges nodes at
    their addresses after a bind, and nothing here may send traffic off this machine."""
    return f"127.{1 + i // 65536 % 254}.{i // 256 % 256}.{i % 256}"


def register_request(node_id: str, host: str, gpu: int = 8) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=node_id,
        address=f"{host}:7070",
        capacity=pb.Resources(cpu_milli=64_000, memory_mib=512 * 1024, gpu=gpu),
        gpu_islands=[pb.RegisterNodeRequest.GpuIsland(gpus=list(range(gpu)))] if gpu else [],
        topology=[pb.TopologyLabel(level="rack", value="r1")],
    )


def small_spec(name: str, replicas: int = 1, gpu: int = 0) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=replicas,
        resources=pb.Resources(cpu_milli=10, memory_mib=16, gpu=gpu),
        shell_command="true",
    )


# The floors and caps on members (docs/security.md "Floors and caps") lifted: the
# benchmarks' small jobs stand in for real ones on simulated nodes where they never end, so
# thousands pile up on a few nodes, which the caps (rightly) stop.
NO_MEMBER_LIMITS = {
    "member_min_cpu_milli": 0,
    "member_min_memory_mib": 0,
    "member_overhead_memory_mib": 0,
    "running_members_per_user": 10_000_000,  # the highest allowed (core/identity/admission.py)
    "members_per_node_per_user": 10_000_000,
}


def lift_member_limits(client: ClusterClient, timeout_s: float = 30.0) -> None:
    """Set :data:`NO_MEMBER_LIMITS` once the cluster takes them (they need every replica
    at the format that has them); a cluster of a release without them is left as it is."""
    if "members_per_node_per_user" not in pb.Limits.DESCRIPTOR.fields_by_name:
        return

    def lifted() -> bool:
        try:
            client.set_limits(NO_MEMBER_LIMITS)
        except grpc.RpcError as exc:
            if failure_of(exc).reason is Reason.CONFLICT:  # the format is not there yet
                return False
            raise RuntimeError(f"the member limits were refused: {exc.details()}") from exc
        return True

    wait_for("the member limits lifted", lifted, timeout_s=timeout_s, every_s=0.2)


def _send_once(
    stub_call: Callable[..., Any], requests: list[Any], window: int, timeout_s: float
) -> tuple[list[Any], dict[int, grpc.RpcError]]:
    """Send ``requests`` keeping ``window`` in flight: responses, and errors by index."""
    responses: list[Any] = [None] * len(requests)
    lock = threading.Lock()
    slots = threading.Semaphore(window)
    done = threading.Event()
    remaining = [len(requests)]
    errors: dict[int, grpc.RpcError] = {}

    def finished(i: int, future: grpc.Future) -> None:
        try:
            responses[i] = future.result()
        except grpc.RpcError as exc:
            errors[i] = exc
        slots.release()
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    for i, request in enumerate(requests):
        slots.acquire()
        future = stub_call.future(request, timeout=timeout_s)
        future.add_done_callback(lambda f, i=i: finished(i, f))
    if requests:
        done.wait(timeout_s * 2)
    return responses, errors


# Requests re-sent during the whole run, after UNAVAILABLE or a leadership move.
RETRIED = {"unavailable_or_timeout_resent": 0, "leader_moved_resent": 0}
# No leader yet / a new leader committing its barrier; a proposal whose outcome is unknown.
_RESEND = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _leader_moved(exc: grpc.RpcError) -> bool:
    return failure_of(exc).reason is Reason.NOT_LEADER


class LeaderStubs:
    """Scheduler stubs on whichever replica serves as leader now (channels closed at
    the end)."""

    def __init__(self, cluster: LocalReplicas) -> None:
        self.cluster = cluster
        self.channels: list[grpc.Channel] = []

    def submit_call(self) -> Callable[..., Any]:
        channel = self.cluster.channel(self.cluster.serving_leader().grpc)
        self.channels.append(channel)
        call: Callable[..., Any] = pb_grpc.SchedulerServiceStub(channel).SubmitJob
        return call

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def pipelined(
    stub_call: Callable[..., Any],
    requests: list[Any],
    window: int,
    timeout_s: float = 30.0,
    follow: Callable[[], Callable[..., Any]] | None = None,
) -> tuple[list[Any], float]:
    """Send ``requests`` keeping ``window`` in flight; return responses and seconds.

    A request refused with UNAVAILABLE (a leader change under load: no leader yet, or a
    new leader still committing its barrier) or DEADLINE_EXCEEDED (its proposal's
    outcome is unknown) is sent again, as a client would, in up to 50 rounds 100 ms
    apart; the time counts. With ``follow``, every retry round goes to the call
    ``follow()`` returns for the replica serving as leader by then, and a request refused
    because leadership moved (FAILED_PRECONDITION, not the leader) is re-sent too.
    Requests carry request ids, so a re-sent submission never creates a second job. Any
    other error fails the benchmark.
    """
    responses: list[Any] = [None] * len(requests)
    todo = list(range(len(requests)))
    start = time.perf_counter()
    for _ in range(50):
        got, errors = _send_once(stub_call, [requests[i] for i in todo], window, timeout_s)
        for pos, i in enumerate(todo):
            responses[i] = got[pos]
        moved = [e for e in errors.values() if _leader_moved(e)] if follow else []
        fatal = [
            e
            for e in errors.values()
            if e.code() not in _RESEND and not (follow and _leader_moved(e))
        ]
        if fatal:
            raise RuntimeError(f"{len(fatal)} requests failed, e.g. {fatal[0]}")
        todo = [todo[pos] for pos in sorted(errors)]
        if not todo:
            return responses, time.perf_counter() - start
        RETRIED["unavailable_or_timeout_resent"] += len(todo) - len(moved)
        RETRIED["leader_moved_resent"] += len(moved)
        time.sleep(0.1)
        if follow is not None:
            stub_call = follow()  # wherever leadership is now
    raise RuntimeError(f"{len(todo)} requests still UNAVAILABLE after 50 rounds")


# ------------------------------------------------------------------------ (a)


def bench_submissions(root: Path, count: int) -> dict[str, Any]:
    cluster = LocalReplicas(root / "a")
    leaders = LeaderStubs(cluster)
    try:
        cluster.start()
        leader = cluster.serving_leader()
        with cluster.channel(leader.grpc) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)
            warm = [
                pb.SubmitJobRequest(spec=small_spec("warm"), request_id=f"w{i}") for i in range(200)
            ]
            pipelined(stub.SubmitJob, warm, 64)
            requests = [
                pb.SubmitJobRequest(spec=small_spec(f"s{i}"), request_id=f"s{i}")
                for i in range(count)
            ]
            responses, elapsed = pipelined(
                stub.SubmitJob, requests, 128, follow=leaders.submit_call
            )
        ids = {r.job_id for r in responses}
        assert len(ids) == count
        return {
            "submissions": count,
            "seconds": round(elapsed, 3),
            "submissions_per_s": round(count / elapsed, 1),
        }
    finally:
        leaders.close()
        cluster.close()


# ------------------------------------------------------------------------ (b)


class Heartbeater(threading.Thread):
    """Heartbeats every node once per interval from this process (pipelined), following
    the leader like real workers do. Nodes given to :meth:`add` while it runs join from
    its next round: a worker heartbeats from its registration on, not once every node
    registered (registering thousands takes longer than a lease)."""

    def __init__(
        self,
        addresses: list[str],
        node_ids: list[str],
        interval_s: float = 1.0,
        transport: Transport | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.client = ClusterClient(
            addresses,
            per_try_timeout_s=0.5,
            channel_factory=(transport or Transport.insecure()).channel,
        )
        self.address = addresses[0]
        self.node_ids = list(node_ids)
        self._lock = threading.Lock()
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.sent = 0
        self.failed = 0

    def add(self, node_ids: Sequence[str]) -> None:
        """Heartbeat ``node_ids`` too, from the next round on."""
        with self._lock:
            self.node_ids = [*self.node_ids, *node_ids]

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            stub = self.client.agent(self.address)
            with self._lock:
                node_ids = self.node_ids
            futures = [
                stub.Heartbeat.future(pb.HeartbeatRequest(node_id=n), timeout=5.0) for n in node_ids
            ]
            failed = 0
            for f in futures:
                try:
                    f.result()
                    self.sent += 1
                except grpc.RpcError:
                    failed += 1
            self.failed += failed
            if failed:
                try:
                    leader = self.client.cluster_status().leader_address
                    self.address = leader or self.address
                except ClusterUnavailable:
                    pass
                continue
            self.stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        self.client.close()


def bench_binding(root: Path, nodes: int, jobs: int, members: int) -> dict[str, Any]:
    cluster = LocalReplicas(root / "b")
    heartbeater = None
    try:
        cluster.start()
        leader = cluster.serving_leader()
        with cluster.channel(leader.grpc) as channel:
            agent = pb_grpc.NodeAgentServiceStub(channel)
            stub = pb_grpc.SchedulerServiceStub(channel)
            node_ids = [f"node-{i:05d}" for i in range(nodes)]
            registrations = [
                register_request(n, loopback_host(i), gpu=8) for i, n in enumerate(node_ids)
            ]
            pipelined(agent.RegisterNode, registrations, 64)
            heartbeater = Heartbeater([leader.grpc], node_ids, transport=cluster.transport)
            heartbeater.start()
            requests = [
                pb.SubmitJobRequest(spec=small_spec(f"g{i}", members, gpu=1), request_id=f"g{i}")
                for i in range(jobs)
            ]
            start = time.perf_counter()
            _, submit_s = pipelined(stub.SubmitJob, requests, 128)

            def all_bound() -> bool:
                left = stub.ListJobs(pb.ListJobsRequest(states=["PENDING"], limit=1), timeout=5)
                return not left.jobs

            wait_for("every gang to be bound", all_bound, timeout_s=120, every_s=0.02)
            elapsed = time.perf_counter() - start
        bound = jobs * members
        return {
            "nodes": nodes,
            "gangs": jobs,
            "members_per_gang": members,
            "members_bound": bound,
            "seconds_submit_to_all_bound": round(elapsed, 3),
            "members_bound_per_s": round(bound / elapsed, 1),
            "bind_window_after_last_ack_s": round(max(0.0, elapsed - submit_s), 3),
            "heartbeats_sent": heartbeater.sent,
            "heartbeats_failed": heartbeater.failed,
        }
    finally:
        if heartbeater is not None:
            heartbeater.stop.set()
            heartbeater.join(timeout=10)
        cluster.close()


# ------------------------------------------------------------------------ (c)


class Stream(threading.Thread):
    """Submits one job at a time through the redirect-following client."""

    def __init__(self, addresses: list[str], transport: Transport | None = None) -> None:
        super().__init__(daemon=True)
        self.client = ClusterClient(
            addresses,
            timeout_s=15.0,
            per_try_timeout_s=0.5,
            backoff_s=0.02,
            channel_factory=(transport or Transport.insecure()).channel,
        )
        # (sent at, acknowledged at, request_id, job_id), monotonic seconds
        self.acks: list[tuple[float, float, str, str]] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            request_id = f"k{i}"
            sent = time.monotonic()
            try:
                answer = self.client.submit_job(small_spec(f"k{i}"), request_id=request_id)
            except (ClusterUnavailable, grpc.RpcError):
                continue
            with self.lock:
                self.acks.append((sent, time.monotonic(), request_id, answer.job_id))
            i += 1
        self.client.close()

    def first_ack_after(self, t: float) -> float | None:
        """When the first write sent after ``t`` was acknowledged (a write sent before
        could have been committed by the old leader)."""
        with self.lock:
            for sent, acked, _, _ in self.acks:
                if sent > t:
                    return acked
        return None


def bench_failover(root: Path, kills: int) -> dict[str, Any]:
    cluster = LocalReplicas(root / "c")
    stream = None
    heartbeater = None
    to_write: list[float] = []
    to_bind: list[float] = []
    try:
        cluster.start()
        cluster.serving_leader()
        with cluster.client() as client:
            node_ids = [f"fo-{i}" for i in range(4)]
            for i, n in enumerate(node_ids):
                client.register_node(register_request(n, loopback_host(i), gpu=0))
        stream = Stream(cluster.grpc_addresses, cluster.transport)
        stream.start()
        for _ in range(kills):
            leader = cluster.serving_leader(timeout_s=30)
            if heartbeater is None:
                heartbeater = Heartbeater(
                    cluster.grpc_addresses, node_ids, interval_s=0.5, transport=cluster.transport
                )
                heartbeater.start()
            wait_for("acks before the kill", lambda: len(stream.acks) > 0, timeout_s=30)
            time.sleep(0.3)
            kill_mono, kill_wall_ms = time.monotonic(), time.time() * 1000
            cluster.kill(leader)
            new_leader = cluster.serving_leader(timeout_s=30)
            first = wait_for(
                "a write after the kill", lambda t=kill_mono: stream.first_ack_after(t), 30
            )
            to_write.append(first - kill_mono)
            # The next committed bind: the earliest bind time after the kill.
            with cluster.channel(new_leader.grpc) as channel:
                stub = pb_grpc.SchedulerServiceStub(channel)

                def bound_after(
                    stub: pb_grpc.SchedulerServiceStub = stub, kill_wall_ms: float = kill_wall_ms
                ) -> float | None:
                    jobs = []
                    token = ""
                    while True:
                        page = stub.ListJobs(
                            pb.ListJobsRequest(states=["SCHEDULED"], page_token=token), timeout=5
                        )
                        jobs.extend(page.jobs)
                        token = page.next_page_token
                        if not token:
                            break
                    times = [
                        j.attempt.bound_at_ms for j in jobs if j.attempt.bound_at_ms > kill_wall_ms
                    ]
                    return min(times) if times else None

                bound_ms = wait_for("a bind after the kill", bound_after, timeout_s=30, every_s=0.1)
            to_bind.append((bound_ms - kill_wall_ms) / 1000)
            cluster.start(leader)
            target = cluster.local_status(new_leader).commit_index
            wait_for(
                "the restarted replica to catch up",
                lambda r=leader, t=target: cluster.local_status(r).last_applied >= t,
                timeout_s=30,
            )
        stream.stop.set()
        stream.join(timeout=20)
        acked = {request_id: job_id for _, _, request_id, job_id in stream.acks}
        with cluster.client() as client:
            present = {j.request_id: j.job_id for j in client.list_jobs(name="")}
        lost = sum(1 for r, j in acked.items() if present.get(r) != j)
        return {
            "kills": kills,
            "acknowledged_writes": len(acked),
            "acknowledged_writes_lost": lost,
            "failover_to_first_write_s_p50": round(statistics.median(to_write), 3),
            "failover_to_first_write_s_max": round(max(to_write), 3),
            "failover_to_next_bind_s_p50": round(statistics.median(to_bind), 3),
            "failover_to_next_bind_s_max": round(max(to_bind), 3),
        }
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        if stream is not None:
            stream.stop.set()
        if heartbeater is not None:
            heartbeater.stop.set()
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--only", choices=["a", "b", "c"], help="run one part only")
    args = parser.parse_args()
    if args.smoke:
        sizes = {"submissions": 300, "nodes": 50, "jobs": 50, "members": 4, "kills": 1}
    else:
        sizes = {"submissions": 10_000, "nodes": 1_000, "jobs": 1_000, "members": 8, "kills": 20}
    report: dict[str, Any] = {"smoke": args.smoke}
    with tempfile.TemporaryDirectory(prefix="synapse-quorum-") as tmp:
        root = Path(tmp)
        if args.only in (None, "a"):
            report["submit"] = bench_submissions(root, sizes["submissions"])
        if args.only in (None, "b"):
            report["bind"] = bench_binding(root, sizes["nodes"], sizes["jobs"], sizes["members"])
        if args.only in (None, "c"):
            report["failover"] = bench_failover(root, sizes["kills"])
    report.update(RETRIED)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
