"""Heartbeat fan-in: the leader's CPU per heartbeat, unary calls, streams to the leader
and streams relayed by the followers.

Three TLS replicas on loopback (LocalReplicas). N simulated nodes are registered as the
cluster's admin (an admin may speak for any node), then heartbeat once per interval from
load-generator processes of their own (asyncio gRPC clients, mutual TLS with the admin's
certificate): either unary ``NodeAgentService.Heartbeat`` calls, or one
``NodeStreamService.Connect`` stream per node, either to the leader (``stream``) or, with
``--relay-heartbeats`` on, to the follower the leader named when the node registered
(``relay``: the followers forward the heartbeats in batches, rpc/relay.py). For each N and
transport the leader process's CPU seconds (utime + stime from ``/proc/<pid>/stat``) over
a measurement window are divided by the heartbeats acknowledged in that window (counted by
the generators); each follower's CPU share is reported too. An idle window (no
heartbeats) gives the leader's baseline.

Then, with the largest N streaming (to the leader, and relayed), one node stops
heartbeating: the time from its last acknowledged heartbeat until the leader's ListNodes
shows it dead, against ``dead_timeout + 1 s``.

Prints one JSON object and writes it to bench/results/heartbeat_fanin.json (not with
``--smoke``, which runs a tiny version in seconds; a test runs it). The machine may be
shared: the generators' achieved rate is reported with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from grpc import aio

from bench.loopback import wait_for
from bench.quorum import loopback_host, pipelined, register_request
from synapse_ha.core.model import NodeStatus
from synapse_ha.local.process import Replica
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import node_status
from synapse_ha.security.tls import TlsFiles, Transport

RESULT = Path(__file__).resolve().parent / "results" / "heartbeat_fanin.json"
TARGET_US = 50.0
FOLLOWER_TARGET_SHARE = 0.6  # of a core, per follower, when relaying
NODES_PER_CHANNEL = 500


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ generator


def _generator(
    files: TlsFiles,
    agent: str,
    streams: list[str],
    node_ids: list[str],
    interval_s: float,
    mode: str,
    acks: Synchronized,  # type: ignore[type-arg]
    errors: Synchronized,  # type: ignore[type-arg]
    stop: Any,
    silence: Any,
    last_ack: Synchronized,  # type: ignore[type-arg]
    silent_node: str,
) -> None:
    """A load-generator process: heartbeat ``node_ids`` until ``stop`` is set. Once
    ``silence`` is set, the first node stops (its last acknowledgement time in
    ``last_ack``, wall clock)."""
    asyncio.run(
        _generate(
            files,
            agent,
            streams,
            node_ids,
            interval_s,
            mode,
            acks,
            errors,
            stop,
            silence,
            last_ack,
            silent_node,
        )
    )


async def _generate(
    files: TlsFiles,
    agent: str,
    streams: list[str],
    node_ids: list[str],
    interval_s: float,
    mode: str,
    acks: Any,
    errors: Any,
    stop: Any,
    silence: Any,
    last_ack: Any,
    silent_node: str,
) -> None:
    material = Transport(files).material()
    assert material is not None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=material.ca, private_key=material.key, certificate_chain=material.cert
    )
    # Each node's address: the leader's agent service, or the stream its registration named.
    targets = [agent] * len(node_ids) if mode == "unary" else streams
    by_target: dict[str, list[Any]] = {}
    for target in sorted(set(targets)):
        count = max(1, targets.count(target) // NODES_PER_CHANNEL)
        by_target[target] = [
            aio.secure_channel(target, credentials, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(count)
        ]
    channels = [c for cs in by_target.values() for c in cs]

    def channel_of(i: int) -> Any:
        own = by_target[targets[i]]
        return own[i % len(own)]

    done = asyncio.Event()

    async def watch_stop() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
        done.set()

    async def unary(i: int, node_id: str) -> None:
        stub = pb_grpc.NodeAgentServiceStub(channel_of(i))  # type: ignore[no-untyped-call]
        await asyncio.sleep(interval_s * i / len(node_ids))
        request = pb.HeartbeatRequest(node_id=node_id)
        next_at = time.monotonic()
        while not done.is_set():
            try:
                await stub.Heartbeat(request, timeout=5.0)
                acks.value += 1
            except grpc.RpcError:
                errors.value += 1
            next_at += interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def streamed(i: int, node_id: str) -> None:
        stub = pb_grpc.NodeStreamServiceStub(channel_of(i))  # type: ignore[no-untyped-call]
        await asyncio.sleep(interval_s * i / len(node_ids))
        while not done.is_set():
            call = stub.Connect()
            seq = 0
            sent_at = 0.0
            next_at = time.monotonic()
            try:
                while not done.is_set():
                    if node_id == silent and silence.is_set():
                        call.cancel()
                        return
                    seq += 1
                    if node_id == silent:
                        sent_at = time.time()
                    await call.write(pb.WorkerMessage(seq=seq, node_id=node_id))
                    while True:
                        reply = await call.read()
                        if reply is aio.EOF:  # type: ignore[attr-defined]
                            raise ConnectionError("stream ended")
                        if reply.ack_seq == seq:
                            break
                    acks.value += 1
                    if node_id == silent:
                        # When the last acknowledged heartbeat was sent: the leader heard
                        # the node after that.
                        last_ack.value = sent_at
                    next_at += interval_s
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            except (grpc.RpcError, ConnectionError):
                errors.value += 1
                call.cancel()
                await asyncio.sleep(0.5)

    work = unary if mode == "unary" else streamed
    silent = silent_node
    tasks = [asyncio.ensure_future(work(i, n)) for i, n in enumerate(node_ids)]
    watcher = asyncio.ensure_future(watch_stop())
    await done.wait()
    await asyncio.sleep(0.2)
    for t in tasks:
        t.cancel()
    watcher.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()


class Load:
    """``processes`` generator processes heartbeating ``node_ids`` between them."""

    def __init__(
        self,
        files: TlsFiles,
        agent: str,
        streams: list[str],
        node_ids: list[str],
        interval_s: float,
        mode: str,
        processes: int,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.silence = ctx.Event()
        self.acks = [ctx.Value("q", 0, lock=False) for _ in range(processes)]
        self.errors = [ctx.Value("q", 0, lock=False) for _ in range(processes)]
        self.last_ack = ctx.Value("d", 0.0, lock=False)
        self.procs = [
            ctx.Process(
                target=_generator,
                args=(
                    files,
                    agent,
                    streams[p::processes],
                    node_ids[p::processes],
                    interval_s,
                    mode,
                    self.acks[p],
                    self.errors[p],
                    self.stop,
                    self.silence,
                    self.last_ack,
                    node_ids[0],
                ),
                daemon=True,
            )
            for p in range(processes)
        ]
        self.first_node = node_ids[0]

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def counts(self) -> tuple[int, int]:
        return sum(a.value for a in self.acks), sum(e.value for e in self.errors)

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)


# ------------------------------------------------------------------ measuring


def _window(
    pid: int,
    load: Load,
    warmup_s: float,
    window_s: float,
    interval_s: float,
    nodes: int,
    followers: dict[str, int],
) -> dict[str, Any]:
    # Every node sends its first heartbeat within one interval; then measure.
    # (bounded: generators that cannot drive every node are measured at what they reach)
    ramp_until = time.monotonic() + max(30.0, 10 * interval_s)
    while load.counts()[0] < nodes and time.monotonic() < ramp_until:
        time.sleep(0.05)
    time.sleep(warmup_s)
    acks0, errors0 = load.counts()
    others0 = {r: _cpu_s(p) for r, p in followers.items()}
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    time.sleep(window_s)
    acks1, errors1 = load.counts()
    cpu1, t1 = _cpu_s(pid), time.monotonic()
    others = {r: round((_cpu_s(p) - others0[r]) / (t1 - t0), 3) for r, p in followers.items()}
    heartbeats = acks1 - acks0
    cpu = cpu1 - cpu0
    return {
        "nodes": nodes,
        "window_s": round(t1 - t0, 2),
        "heartbeats": heartbeats,
        "heartbeats_per_s": round(heartbeats / (t1 - t0), 1),
        "offered_per_s": round(nodes / interval_s, 1),
        "errors": errors1 - errors0,
        "leader_cpu_s": round(cpu, 3),
        "leader_cpu_share": round(cpu / (t1 - t0), 3),
        "leader_cpu_us_per_heartbeat": round(cpu / heartbeats * 1e6, 1) if heartbeats else None,
        "follower_cpu_share": others,
    }


def _register(
    cluster: LocalReplicas, node_ids: list[str], first: int, relay: bool, attempts: int = 3
) -> tuple[list[str], str, Replica]:
    """Register ``node_ids`` with the serving leader (again with a new one, should the
    leader change meanwhile: registering twice is harmless). Returns the stream address
    each registration named (with ``relay``, once the leader names followers' streams),
    the leader's own stream address, and the leader."""
    for attempt in range(attempts):
        leader = cluster.serving_leader()
        try:
            with cluster.channel(leader.grpc) as channel:
                agent = pb_grpc.NodeAgentServiceStub(channel)  # type: ignore[no-untyped-call]
                requests = [
                    register_request(n, loopback_host(first + i), gpu=0)
                    for i, n in enumerate(node_ids)
                ]
                if relay:
                    wait_for(
                        "the leader to name followers' streams",
                        lambda a=agent, r=requests[0]: a.RegisterNode(r, timeout=10).relayed,
                        60,
                        0.2,
                    )
                answers, _ = pipelined(agent.RegisterNode, requests, 16)
                named = [str(a.stream_address) for a in answers]
                own = pb.RegisterNodeRequest()
                own.CopyFrom(requests[0])
                own.unreachable_streams.extend(sorted(set(named)))
                answer = agent.RegisterNode(own, timeout=10)
            return named, str(answer.stream_address), leader
        except (RuntimeError, grpc.RpcError) as exc:
            print(f"registration attempt {attempt + 1} failed: {exc!s:.200}", file=sys.stderr)
    raise RuntimeError(f"could not register {len(node_ids)} nodes in {attempts} attempts")


def _detect_death(
    cluster: LocalReplicas, leader_grpc: str, load: Load, dead_timeout_s: float, poll_s: float
) -> dict[str, Any]:
    node_id = load.first_node
    with cluster.channel(leader_grpc) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
        agent = pb_grpc.NodeAgentServiceStub(channel)  # type: ignore[no-untyped-call]

        def status() -> NodeStatus:
            nodes = stub.ListNodes(pb.ListNodesRequest(), timeout=10).nodes
            return next(node_status(n) for n in nodes if n.node_id == node_id)

        # Alive to start with (a gap between runs may have let it be declared dead).
        agent.RegisterNode(register_request(node_id, loopback_host(0), gpu=0), timeout=10)
        wait_for("the node to be ready", lambda: status() is NodeStatus.READY, 30, poll_s)
        acked = load.last_ack.value
        wait_for("a heartbeat after that", lambda: load.last_ack.value > acked, 30, 0.01)
        load.silence.set()

        def dead() -> bool:
            return status() is NodeStatus.DEAD

        wait_for("the silent node to be declared dead", dead, 3 * dead_timeout_s + 30, poll_s)
        seen = time.time()
    latency = seen - load.last_ack.value
    return {
        "node": node_id,
        "dead_timeout_s": dead_timeout_s,
        "poll_period_s": poll_s,
        "last_heartbeat_sent_to_dead_s": round(latency, 3),
        "bound_s": dead_timeout_s + 1.0,
        "within_bound": latency <= dead_timeout_s + 1.0,
    }


def run(
    root: Path,
    sizes: list[int],
    modes: list[str],
    interval_s: float,
    warmup_s: float,
    window_s: float,
    processes: int,
    dead_timeout_s: float,
    poll_s: float,
    extra: list[str],
    deaths: tuple[str, ...] = ("stream", "relay"),
) -> dict[str, Any]:
    """``deaths``: the modes after whose run at the largest size a node is silenced and
    its death timed."""
    relay = "relay" in modes
    cluster = LocalReplicas(
        root / "cluster",
        extra_args=[
            "--heartbeat-interval",
            f"{interval_s:g}s",
            "--dead-timeout",
            f"{dead_timeout_s:g}s",
            *(["--relay-heartbeats"] if relay else []),
            *extra,
        ],
    )
    assert cluster.credentials is not None
    files = cluster.credentials.admin_tls()
    report: dict[str, Any] = {"interval_s": interval_s, "generator_processes": processes}
    load: Load | None = None
    try:
        cluster.start()
        leader = cluster.serving_leader()
        assert leader.process is not None
        pid = leader.process.pid
        idle0, t0 = _cpu_s(pid), time.monotonic()
        time.sleep(window_s)
        idle = (_cpu_s(pid) - idle0) / (time.monotonic() - t0)
        report["leader_idle_cpu_share"] = round(idle, 4)
        registered: list[str] = []
        named: list[str] = []  # the stream each registration named
        stream_address = ""
        runs: list[dict[str, Any]] = []
        for n in sizes:
            fresh = [f"node-{i:05d}" for i in range(len(registered), n)]
            if fresh:
                more, stream_address, now_leader = _register(cluster, fresh, len(registered), relay)
                registered += fresh
                named += more
                if now_leader.replica_id != leader.replica_id:
                    report["leader_changes_while_registering"] = (
                        report.get("leader_changes_while_registering", 0) + 1
                    )
                    leader = now_leader
                    assert leader.process is not None
                    pid = leader.process.pid
            for mode in modes:
                streams = named if mode == "relay" else [stream_address] * len(registered)
                load = Load(files, leader.grpc, streams, registered, interval_s, mode, processes)
                load.start()
                followers = {
                    r.replica_id: r.process.pid
                    for r in cluster.replicas
                    if r is not leader and r.process is not None
                }
                figures = _window(pid, load, warmup_s, window_s, interval_s, n, followers)
                figures["mode"] = mode
                if mode == "relay":
                    figures["streams_per_replica"] = {a: named.count(a) for a in sorted(set(named))}
                # Net of what the leader spends with no heartbeats at all (Raft ticks,
                # the leader loop).
                net = figures["leader_cpu_s"] - idle * figures["window_s"]
                figures["leader_cpu_us_per_heartbeat_net_of_idle"] = (
                    round(max(0.0, net) / figures["heartbeats"] * 1e6, 1)
                    if figures["heartbeats"]
                    else None
                )
                runs.append(figures)
                print(json.dumps(figures), file=sys.stderr)
                if n == sizes[-1] and mode in deaths:
                    # On the replica leading now: an overloaded leader may have been
                    # replaced during the runs (reported as leader_changed).
                    serving = cluster.serving_leader()
                    key = "death" if mode == "stream" else "death_relayed"
                    report[key] = _detect_death(cluster, serving.grpc, load, dead_timeout_s, poll_s)
                load.close()
                load = None
        report["runs"] = runs
        report["stream_address"] = stream_address
        status = cluster.serving_leader()
        report["leader_changed"] = status.replica_id != leader.replica_id
    finally:
        if load is not None:
            load.close()
        cluster.close()
    report["target_us_per_heartbeat"] = TARGET_US
    report["follower_target_cpu_share"] = FOLLOWER_TARGET_SHARE
    for mode in ("stream", "relay"):
        of_mode = [r for r in report["runs"] if r["mode"] == mode]
        if of_mode:
            per = of_mode[-1]["leader_cpu_us_per_heartbeat"]
            report[f"{mode}_meets_target_at_largest_n"] = per is not None and per <= TARGET_US
    relayed = [r for r in report["runs"] if r["mode"] == "relay"]
    if relayed:
        shares = relayed[-1]["follower_cpu_share"].values()
        report["relay_followers_within_share"] = all(x <= FOLLOWER_TARGET_SHARE for x in shares)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--sizes", default="1000,3000,10000", help="node counts, ascending")
    parser.add_argument("--modes", default="unary,stream,relay")
    parser.add_argument("--interval", type=float, default=1.0, help="heartbeat interval, s")
    parser.add_argument("--window", type=float, default=10.0, help="measurement window, s")
    parser.add_argument("--processes", type=int, default=2, help="load-generator processes")
    args = parser.parse_args()
    if args.smoke:
        sizes, window, warmup, dead_timeout, poll = [20], 0.5, 0.1, 5.0, 0.1
        extra = ["--lease-ttl", "2s", "--leader-step-down", "1s"]
    else:
        sizes = [int(s) for s in args.sizes.split(",")]
        window, warmup, dead_timeout, poll, extra = args.window, 3.0, 10.0, 0.25, []
    modes = [m for m in args.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="synapse-fanin-") as tmp:
        report = run(
            Path(tmp),
            sizes,
            modes,
            args.interval,
            warmup,
            window,
            args.processes,
            dead_timeout,
            poll,
            extra,
            # The smoke run times one death, on the newest path, to keep it short.
            deaths=("relay",) if args.smoke else ("stream", "relay"),
        )
    report["smoke"] = args.smoke
    report["command"] = " ".join(["python", "bench/heartbeat_fanin.py", *sys.argv[1:]])
    text = json.dumps(report, indent=2)
    print(text)
    if not args.smoke:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
