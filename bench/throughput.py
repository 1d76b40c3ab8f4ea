"""Throughput benchmark with the load generated in separate processes.

Three TLS replicas on loopback (:class:`~synapse_ha.local.replicas.LocalReplicas`); the
benchmark process only starts them, hands out work and collects figures. The load comes
from generator processes of their own, so the generator never competes with the
measurement for one interpreter:

(a) **acknowledged submissions/s**: ``--processes`` generator processes, each keeping
    ``--window`` single-job ``SubmitJob`` calls in flight over mutual TLS as the admin
    (by certificate). The figure is every acknowledged submission over the time from the
    first process starting to the last one finishing.
(b) **members bound/s**: simulated nodes registered and heartbeating from a process of
    their own (at a modest rate, ``--heartbeat-s``), gangs submitted by the generator
    processes; the figure is every member bound over the time from the first submission
    until no job is pending any more. Each node heartbeats from its registration on, by
    default with unary calls sent in one burst a round; ``--heartbeats stream`` gives each
    node a stream of its own to the address its registration names, as ``synapse-worker``
    does. The report counts the nodes dead at the end and the gangs requeued: nodes
    whose heartbeats the leader could not answer within ``dead_timeout``.

With ``--profile DIR`` the leader is sampled by ``py-spy`` (``pip install py-spy``, the
``bench`` extra) during each measured phase, and the profile summary (the functions with
the most samples, by self and by total time, and the samples per submission / per bound
member) goes into the JSON report; in part (a) one follower is sampled as well.

Prints one JSON object and writes it to ``bench/results/throughput.json`` (``--smoke``:
a tiny run that takes seconds, written nowhere unless ``--out`` is given).
Targets on a two-core machine: >= 2,000 submissions/s, >= 5,000 members bound/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib
from dataclasses import dataclass

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench.front_end import front_ends, tls_transport
from bench.heartbeat_fanin import Load
from bench.loopback import percentile, wait_for
from bench.quorum import Heartbeater, loopback_host, pipelined, register_request, small_spec
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import NodeStatus
from synapse_ha.local.process import Replica
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import node_status

RESULTS = Path(__file__).resolve().parent / "results" / "throughput.json"

# ------------------------------------------------------------ generator processes


def _generator(
    index: int,
    files: tuple[str, str, str],
    addresses: list[str],
    specs: list[bytes],
    prefix: str,
    window: int,
    ready: Any,
    go: Any,
    out: Any,
    batch: int = 1,
    via: str | None = None,
) -> None:
    """One load generator process: warm up its channel, wait for ``go``, submit its
    share (serialized ``JobSpec`` messages) with ``window`` calls in flight (one job a
    ``SubmitJob`` call, or with ``batch`` > 1 that many a ``SubmitJobs`` call; with
    ``via``, single-job calls to the front ends there, :mod:`bench.front_end`), report
    ``(index, started, finished, acknowledged, distinct job ids, CPU seconds)``
    (monotonic seconds: one clock for every process on the machine; the CPU time of the
    whole process, every thread, over the measured submissions)."""
    transport = tls_transport(files)
    client = ClusterClient(addresses, channel_factory=transport.channel)

    def follow() -> Any:
        """SubmitJob on whichever replica leads now (a leader change under load)."""
        leader = client.cluster_status().leader_address or addresses[0]
        return client.scheduler(leader).SubmitJob

    with client:
        if via is None:
            stub = client.scheduler(client.cluster_status().leader_address or addresses[0])
        else:
            stub = pb_grpc.SchedulerServiceStub(transport.channel(via))
        following = follow if via is None else None  # front ends follow no leader change
        warm = [
            pb.SubmitJobRequest(spec=small_spec("warm"), request_id=f"{prefix}warm-{index}-{i}")
            for i in range(20)
        ]
        pipelined(stub.SubmitJob, warm, 8, follow=following)
        requests = [
            pb.SubmitJobRequest(spec=pb.JobSpec.FromString(raw), request_id=f"{prefix}-{index}-{i}")
            for i, raw in enumerate(specs)
        ]
        calls: list[Any] = requests
        if batch > 1:
            calls = [
                pb.SubmitJobsRequest(jobs=requests[i : i + batch])
                for i in range(0, len(requests), batch)
            ]
        ready.put(index)
        go.wait(120)
        started, cpu = time.monotonic(), time.process_time()
        if batch > 1:
            answers, _ = pipelined(
                stub.SubmitJobs, calls, window, follow=lambda: follow_batch(client, addresses)
            )
            responses = [job for a in answers if a is not None for job in a.jobs]
        else:
            responses, _ = pipelined(stub.SubmitJob, calls, window, follow=following)
        finished, cpu = time.monotonic(), time.process_time() - cpu
    ids = {r.job_id for r in responses if r is not None}
    out.put((index, started, finished, len(responses), len(ids), cpu))


def follow_batch(client: ClusterClient, addresses: list[str]) -> Any:
    """SubmitJobs on whichever replica leads now."""
    return client.scheduler(client.cluster_status().leader_address or addresses[0]).SubmitJobs


STREAM_PROCESSES = 2  # generator processes of streamed heartbeats
_REGISTER_CHUNK = 128  # nodes registered before they join the heartbeats


def _nodes(
    files: tuple[str, str, str],
    addresses: list[str],
    count: int,
    interval_s: float,
    ready: Any,
    stop: Any,
) -> None:
    """The simulated nodes: register ``count`` nodes (on the first address, the
    leader), each heartbeating once per ``interval_s`` (following the leader) from its
    registration on, as a worker does, until ``stop`` is set. Puts the number registered
    on ``ready`` once they all heartbeat."""
    transport = tls_transport(files)
    node_ids = [f"node-{i:05d}" for i in range(count)]
    beat = Heartbeater(addresses, [], interval_s=interval_s, transport=transport)
    beat.start()
    with ClusterClient(addresses, channel_factory=transport.channel) as client:

        def follow() -> Any:
            """RegisterNode on whichever replica leads now (a leader change under load)."""
            return client.agent(client.cluster_status().leader_address or addresses[0]).RegisterNode

        registrations = [
            register_request(n, loopback_host(i), gpu=8) for i, n in enumerate(node_ids)
        ]
        for at in range(0, count, _REGISTER_CHUNK):
            pipelined(follow(), registrations[at : at + _REGISTER_CHUNK], 64, follow=follow)
            beat.add(node_ids[at : at + _REGISTER_CHUNK])
    ready.put(len(node_ids))
    stop.wait(900)
    beat.stop.set()
    beat.join(timeout=10)


def _split(items: Sequence[bytes], parts: int) -> list[list[bytes]]:
    return [list(items[i::parts]) for i in range(parts)]


def run_generators(
    cluster: LocalReplicas,
    specs: list[pb.JobSpec],
    processes: int,
    window: int,
    prefix: str,
    batch: int = 1,
    via: str | None = None,
) -> tuple[float, float, int, int, float]:
    """Submit ``specs`` from ``processes`` generator processes at once (``batch`` jobs a
    call; with ``via``, to the front ends there); the start of the first, the end of the
    last, the acknowledged and distinct job counts and the generators' CPU seconds."""
    files = _admin_files(cluster)
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    raw = [s.SerializeToString() for s in specs]
    procs = [
        ctx.Process(
            target=_generator,
            args=(
                i,
                files,
                cluster.grpc_addresses,
                share,
                prefix,
                window,
                ready,
                go,
                out,
                batch,
                via,
            ),
            daemon=True,
        )
        for i, share in enumerate(_split(raw, processes))
    ]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        go.set()
        reports = [out.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    started = min(r[1] for r in reports)
    finished = max(r[2] for r in reports)
    acked, distinct = sum(r[3] for r in reports), sum(r[4] for r in reports)
    return started, finished, acked, distinct, sum(r[5] for r in reports)


def _leader_first(cluster: LocalReplicas, leader: Replica) -> list[str]:
    return [leader.grpc, *(a for a in cluster.grpc_addresses if a != leader.grpc)]


def _terms(cluster: LocalReplicas) -> int:
    """The highest Raft term any replica reports (it grows with every election)."""
    terms = [0]
    for r in cluster.replicas:
        with contextlib.suppress(grpc.RpcError):
            terms.append(cluster.local_status(r).term)
    return max(terms)


def raft_ticks(cluster: LocalReplicas) -> dict[str, tuple[float, float]]:
    """Each replica's Raft tick stalls so far and its longest interval between two ticks
    (seconds), by its gRPC address, from its ``/metrics`` (mutual TLS with the CLI's
    certificate); a replica that does not answer, or predates the series, is left out."""
    assert cluster.credentials is not None, "the benchmark runs with TLS"
    client = cluster.credentials.client_tls()
    context = ssl.create_default_context(cafile=str(client.ca))
    context.load_cert_chain(str(client.cert), str(client.key))
    out: dict[str, tuple[float, float]] = {}
    for replica in cluster.replicas:
        with contextlib.suppress(grpc.RpcError, OSError, ValueError, KeyError):
            url = cluster.local_status(replica).metrics_url
            with urllib.request.urlopen(url, context=context, timeout=5) as answer:
                text = answer.read().decode()
            got = {
                s.name: s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            out[replica.grpc] = (
                got["synapse_raft_tick_stalls_total"],
                got["synapse_raft_longest_tick_interval_seconds"],
            )
    return out


def tick_report(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], leader: str
) -> dict[str, Any]:
    """The leader's and the followers' Raft tick stalls during a run, and the longest
    interval between two ticks each has had (:mod:`synapse_ha.raft.tick_watch`)."""
    if leader not in after:
        return {}
    followers = [a for a in after if a != leader and a in before]
    return {
        "raft_tick_stalls": {
            "leader": int(after[leader][0] - before.get(leader, (0.0, 0.0))[0]),
            "followers": int(sum(after[a][0] - before[a][0] for a in followers)),
        },
        "raft_longest_tick_interval_s": {
            "leader": round(after[leader][1], 3),
            "followers": round(max((after[a][1] for a in followers), default=0.0), 3),
        },
    }


def _admin_files(cluster: LocalReplicas) -> tuple[str, str, str]:
    assert cluster.credentials is not None, "the benchmark runs with TLS"
    files = cluster.credentials.admin_tls()
    return (str(files.ca), str(files.cert), str(files.key))


# ---------------------------------------------------------------------- profiling


class Profiler:
    """``py-spy record`` of one process for one phase, summarised from its collapsed
    stacks (``--format raw``); does nothing without ``directory``."""

    def __init__(self, directory: Path | None, name: str, replica: Replica) -> None:
        self.directory = directory
        self.name = name
        self.pid = replica.pid
        self.proc: subprocess.Popen[bytes] | None = None
        self.path = directory / f"{name}.txt" if directory is not None else None

    def __enter__(self) -> Profiler:
        if self.directory is None or self.pid is None:
            return self
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--threads",
                "--function",
                "--nonblocking",
                "--gil",
                "--output",
                str(self.path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # attached before the phase starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def summary(self, per: int, top: int = 15) -> dict[str, Any] | None:
        if self.path is None or not self.path.exists():
            return None
        return summarise(self.path.read_text(), per, top)


def summarise(collapsed: str, per: int, top: int = 15) -> dict[str, Any]:
    """Self and total sample counts per function from py-spy's collapsed stacks (recorded
    with ``--gil``: only the thread holding the interpreter lock is sampled, so the
    counts are the interpreter's time, not threads waiting for it), by thread, and the
    samples per unit of work (``per``: submissions or members bound)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    busy = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        busy += count
        name = frames[0].partition(": ")[2] or frames[0]
        threads[re.sub(r"[_-]?\d+$", "", name)] += count
        own[frames[-1]] += count
        for f in set(frames[1:]):
            total[f] += count
    return {
        "busy_samples": busy,
        "busy_samples_per_1000_units": round(1000 * busy / per, 2) if per else None,
        "by_thread": dict(threads.most_common(8)),
        "top_self": [[f, n] for f, n in own.most_common(top)],
        "top_total": [[f, n] for f, n in total.most_common(top)],
    }


def _proc_cpu_s(pid: int | None) -> float:
    """User plus system CPU seconds of ``pid`` so far, from /proc."""
    return sum(_proc_user_system_s(pid))


def _proc_user_system_s(pid: int | None) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` so far, from /proc."""
    if pid is None:
        return 0.0, 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _context_switches(pid: int | None) -> int:
    """Voluntary plus involuntary context switches of every thread of ``pid``."""
    if pid is None:
        return 0
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[-1])
    return total


# ----------------------------------------------------------------------------- (a)


@contextlib.contextmanager
def _route(cluster: LocalReplicas, leader: Replica, fronts: Fronts) -> Iterator[Route]:
    """Where the generators send single-job calls: the replicas (``fronts.count`` 0), or
    front end processes in front of ``leader`` (:mod:`bench.front_end`)."""
    route = Route()
    if fronts.count <= 0:
        yield route
        return
    assert cluster.credentials is not None, "the benchmark runs with TLS"
    server = cluster.credentials.replica_tls("front-end")
    files = (str(server.ca), str(server.cert), str(server.key))
    with front_ends(
        fronts.count, files, _admin_files(cluster), leader.grpc, window=fronts.window
    ) as (running, calls):
        route.via, route.pids = running.address, running.pids
        yield route
    route.calls = sum(n for n, _ in calls)
    route.call_ms = sorted(ms for _, each in calls for ms in each)


@dataclass(frozen=True)
class Fronts:
    """How many front ends, and each one's calls in flight to the leader."""

    count: int = 0
    window: int = 2

    @classmethod
    def parse(cls, text: str) -> Fronts:
        """``N`` or ``NxW`` (``2x4``: two front ends, four calls in flight each)."""
        count, _, window = text.partition("x")
        return cls(int(count), int(window or 2))


NO_FRONTS = Fronts()


class Route:
    """The front ends' address, process ids and (once stopped) calls; none without."""

    def __init__(self) -> None:
        self.via: str | None = None
        self.pids: tuple[int, ...] = ()
        self.calls = 0
        self.call_ms: list[float] = []

    def cpu_s(self) -> float:
        return sum(_proc_cpu_s(pid) for pid in self.pids)

    def report(self, acked: int, cpu_s: float) -> dict[str, Any]:
        if not self.pids:
            return {}
        return {
            "front_ends": len(self.pids),
            "front_end_cpu_us_per_submission": round(1e6 * cpu_s / max(1, acked), 1),
            "jobs_per_front_end_call": round(acked / max(1, self.calls), 1),
            "front_end_call_ms_p50_p95": [
                round(percentile(self.call_ms, q), 1) if self.call_ms else None for q in (0.5, 0.95)
            ],
        }


def bench_submissions(
    root: Path,
    count: int,
    processes: int,
    window: int,
    profile: Path | None,
    batch: int = 1,
    fronts: Fronts = NO_FRONTS,
) -> dict[str, Any]:
    cluster = LocalReplicas(root / "a")
    try:
        cluster.start()
        leader = cluster.serving_leader()
        specs = [small_spec(f"s{i}") for i in range(count)]
        term = _terms(cluster)
        followers = [r for r in cluster.replicas if r.pid is not None and r.pid != leader.pid]
        ticks_before = raft_ticks(cluster)
        with _route(cluster, leader, NO_FRONTS if batch > 1 else fronts) as route:
            split_before = _proc_user_system_s(leader.pid)
            switches_before = _context_switches(leader.pid)
            followers_before = sum(_proc_cpu_s(r.pid) for r in followers)
            front_before = route.cpu_s()
            with (
                Profiler(profile, "submit", leader) as spy,
                Profiler(profile, "submit-follower", followers[0]) as follower_spy,
            ):
                started, finished, acked, distinct, generators_cpu = run_generators(
                    cluster, specs, processes, window, "s", batch, route.via
                )
            front_cpu = route.cpu_s() - front_before
        split = _proc_user_system_s(leader.pid)
        user, system = split[0] - split_before[0], split[1] - split_before[1]
        cpu = user + system
        switches = _context_switches(leader.pid) - switches_before
        followers_cpu = sum(_proc_cpu_s(r.pid) for r in followers) - followers_before
        elapsed = finished - started
        report: dict[str, Any] = {
            "generator_processes": processes,
            "in_flight_per_process": window,
            "jobs_per_call": batch,
            "submissions": count,
            "acknowledged": acked,
            "distinct_jobs": distinct,
            "seconds": round(elapsed, 3),
            "submissions_per_s": round(acked / elapsed, 1),
            "leader_cpu_s": round(cpu, 2),
            "leader_cpu_us_per_submission": round(1e6 * cpu / max(1, acked), 1),
            "leader_user_system_s": [round(user, 2), round(system, 2)],
            "leader_context_switches_per_submission": round(switches / max(1, acked), 1),
            "elections_during_run": _terms(cluster) - term,
            # Every process on the machine shares its cores: what each kind costs.
            "cpu_us_per_submission": {
                "leader": round(1e6 * cpu / max(1, acked), 1),
                "followers": round(1e6 * followers_cpu / max(1, acked), 1),
                "generators": round(1e6 * generators_cpu / max(1, acked), 1),
                **({"front_ends": round(1e6 * front_cpu / max(1, acked), 1)} if route.pids else {}),
            },
            "machine_cpu_share": round(
                (cpu + followers_cpu + generators_cpu + front_cpu)
                / (elapsed * (os.cpu_count() or 1)),
                3,
            ),
            **route.report(acked, front_cpu),
            **tick_report(ticks_before, raft_ticks(cluster), leader.grpc),
        }
        summary = spy.summary(acked)
        if summary is not None:
            report["profile"] = summary
        summary = follower_spy.summary(acked)
        if summary is not None:
            report["profile_follower"] = summary
        return report
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.close()


# ----------------------------------------------------------------------------- (b)


def bench_binding(
    root: Path,
    nodes: int,
    jobs: int,
    members: int,
    processes: int,
    window: int,
    heartbeat_s: float,
    profile: Path | None,
    heartbeats: str = "unary",
    batch: int = 1,
    fronts: Fronts = NO_FRONTS,
) -> dict[str, Any]:
    cluster = LocalReplicas(root / "b")
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    beater = None
    streams: Load | None = None
    try:
        cluster.start()
        leader = cluster.serving_leader()
        ready = ctx.Queue()
        addresses = _leader_first(cluster, leader)
        if heartbeats == "stream":
            streams = _streamed_nodes(cluster, leader, nodes, heartbeat_s)
        else:
            beater = ctx.Process(
                target=_nodes,
                args=(_admin_files(cluster), addresses, nodes, heartbeat_s, ready, stop),
                daemon=True,
            )
            beater.start()
            ready.get(timeout=300)
        with cluster.client() as watcher:
            specs = [small_spec(f"g{i}", members, gpu=1) for i in range(jobs)]

            def all_bound() -> bool:
                return not watcher.list_jobs(limit=1, states=["PENDING"])

            term = _terms(cluster)
            ticks_before = raft_ticks(cluster)
            cpu_before = _proc_cpu_s(leader.pid)
            with (
                _route(cluster, leader, NO_FRONTS if batch > 1 else fronts) as route,
                Profiler(profile, "bind", leader) as spy,
            ):
                front_before = route.cpu_s()
                started, submitted, acked, _, _ = run_generators(
                    cluster, specs, processes, window, "g", batch, route.via
                )
                try:
                    wait_for(
                        "every gang to be bound",
                        all_bound,
                        timeout_s=60 if nodes < 100 else 300,
                        every_s=0.02,
                    )
                except Exception:
                    for job in watcher.list_jobs(limit=3, states=["PENDING"]):
                        print(f"still pending: {job}", file=sys.stderr)
                    for node in watcher.list_nodes()[:3]:
                        print(f"node: {node}", file=sys.stderr)
                    raise
                done = time.monotonic()
                front_cpu = route.cpu_s() - front_before
            cpu = _proc_cpu_s(leader.pid) - cpu_before
            # A node whose heartbeats the leader cannot answer within its lease is declared
            # dead and its gangs requeued: the run then measures a storm, not binding.
            ticks = tick_report(ticks_before, raft_ticks(cluster), leader.grpc)
            dead = sum(1 for n in watcher.list_nodes() if node_status(n) is NodeStatus.DEAD)
            requeues = sum(j.requeues for j in watcher.list_jobs())
        bound = acked * members
        elapsed = done - started
        report: dict[str, Any] = {
            "nodes": nodes,
            "heartbeats": heartbeats,
            "heartbeat_interval_s": heartbeat_s,
            "generator_processes": processes,
            "jobs_per_call": batch,
            "gangs": acked,
            "members_per_gang": members,
            "members_bound": bound,
            "seconds_submit_to_all_bound": round(elapsed, 3),
            "members_bound_per_s": round(bound / elapsed, 1),
            "bind_window_after_last_ack_s": round(max(0.0, done - submitted), 3),
            **route.report(acked, front_cpu),
            "leader_cpu_s": round(cpu, 2),
            "leader_cpu_us_per_member": round(1e6 * cpu / max(1, bound), 1),
            "elections_during_run": _terms(cluster) - term,
            "nodes_dead_at_end": dead,
            "gang_requeues": requeues,
            **ticks,
        }
        summary = spy.summary(bound)
        if summary is not None:
            report["profile"] = summary
        return report
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        stop.set()
        if beater is not None:
            beater.join(timeout=20)
            if beater.is_alive():
                beater.kill()
        if streams is not None:
            streams.close()
        cluster.close()


def _streamed_nodes(cluster: LocalReplicas, leader: Replica, count: int, interval_s: float) -> Load:
    """The simulated nodes as ``synapse-worker`` runs them: registered (on the leader),
    then each heartbeating once per ``interval_s`` on a stream of its own to the address
    its registration named (``NodeStreamService.Connect``), from generator processes."""
    node_ids = [f"node-{i:05d}" for i in range(count)]
    with cluster.channel(leader.grpc) as channel:
        agent = pb_grpc.NodeAgentServiceStub(channel)  # type: ignore[no-untyped-call]
        answers, _ = pipelined(
            agent.RegisterNode,
            [register_request(n, loopback_host(i), gpu=8) for i, n in enumerate(node_ids)],
            64,
        )
    named = [str(a.stream_address) for a in answers]
    if not all(named):
        raise RuntimeError("the leader named no heartbeat stream for some registrations")
    assert cluster.credentials is not None, "the benchmark runs with TLS"
    load = Load(
        cluster.credentials.admin_tls(),
        leader.grpc,
        named,
        node_ids,
        interval_s,
        "stream",
        processes=STREAM_PROCESSES,
    )
    load.start()
    wait_for(
        "every node's first heartbeat",
        lambda: load.counts()[0] >= count,
        timeout_s=60,
        every_s=0.1,
    )
    return load


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--only", choices=["a", "b"], help="run one part only")
    parser.add_argument("--processes", type=int, default=3, help="load generator processes")
    parser.add_argument("--window", type=int, default=64, help="calls in flight per process")
    parser.add_argument("--submissions", type=int, default=20_000)
    # Room to spare (10,000 GPUs for 8,000 members): a node reaped under load must not
    # leave a gang without room.
    parser.add_argument("--nodes", type=int, default=1_250)
    parser.add_argument("--gangs", type=int, default=1_000)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--heartbeat-s", type=float, default=2.0)
    parser.add_argument(
        "--heartbeats",
        choices=["unary", "stream"],
        default="unary",
        help="(b): the simulated nodes' heartbeats as unary calls from one burst a round "
        "(default), or one stream per node as synapse-worker sends them",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="jobs a call: 1 (default) sends one SubmitJob per job; more sends SubmitJobs "
        "calls of that many (synctl's and the client library's way for many jobs)",
    )
    parser.add_argument(
        "--front-ends",
        type=Fronts.parse,
        default=NO_FRONTS,
        metavar="N[xW]",
        help="single-job calls go to N front end processes in front of the leader, which "
        "hand them on in batches, W calls in flight each (default 2; bench/front_end.py); "
        "0 (default): to the replicas",
    )
    parser.add_argument("--profile", type=Path, help="sample the leader with py-spy into DIR")
    parser.add_argument("--out", type=Path, help=f"where the JSON goes (default {RESULTS})")
    parser.add_argument(
        "--summarise",
        type=Path,
        metavar="FILE",
        help="only print the summary of a saved profile (py-spy --format raw), per --per units",
    )
    parser.add_argument("--per", type=int, default=1, help="units of work of --summarise")
    args = parser.parse_args(argv)
    if args.summarise is not None:
        print(json.dumps(summarise(args.summarise.read_text(), args.per), indent=2))
        return 0
    if args.smoke:
        args.processes, args.window = 2, 16
        args.submissions, args.nodes, args.gangs, args.members = 200, 40, 40, 4
    report: dict[str, Any] = {"smoke": args.smoke, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="synapse-throughput-") as tmp:
        root = Path(tmp)
        if args.only in (None, "a"):
            report["submit"] = bench_submissions(
                root,
                args.submissions,
                args.processes,
                args.window,
                args.profile,
                args.batch,
                args.front_ends,
            )
        if args.only in (None, "b"):
            report["bind"] = bench_binding(
                root,
                args.nodes,
                args.gangs,
                args.members,
                args.processes,
                args.window,
                args.heartbeat_s,
                args.profile,
                args.heartbeats,
                args.batch,
                args.front_ends,
            )
    text = json.dumps(report, indent=2)
    print(text)
    out = args.out or (None if args.smoke else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
