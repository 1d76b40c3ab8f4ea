"""Failover benchmark: ``kill -9`` of the leader under load, and elections without kills.

Three real replicas on loopback (mutual TLS, the benchmark calling as the admin by
certificate). The load: ``--streams`` clients each submitting one small job at a time
through the redirect-following :class:`~synapse_ha.client.cluster.ClusterClient`, and a few
simulated nodes heartbeating, so every submission is bound by the leader's planning loop.

1. **Kill-free period.** The load runs for ``--quiet-s`` seconds (by default as long as
   the kills take) with no fault; the benchmark samples every replica's Raft term and
   the leader it names. Every term a replica enters is one election; under load with no
   fault there must be none.
2. **Kills.** ``--kills`` times: ``kill -9`` of the leader, then the time from the kill to
   a replica serving as leader, to the first acknowledged write sent after the kill, and
   to the next committed bind (the earliest ``bound_at`` after the kill); the killed
   replica is restarted and caught up before the next kill.

Prints one JSON object (``--out`` also writes it to a file). ``--smoke`` runs a tiny
version in seconds. Extra flags for the replicas (``--replica-arg=--election-min=300ms``)
let the same run compare settings.
Targets on a two-core machine: next committed bind p50 <= 0.5 s and max <= 1 s over 20
kills, and 0 elections in the kill-free period.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import wait_for
from bench.quorum import Heartbeater, Stream, loopback_host, register_request
from bench.report import emit
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import replica_role


class TermWatch(threading.Thread):
    """Samples every running replica's term and named leader every ``every_s``: the
    highest term seen and the number of distinct (term, leader) pairs observed."""

    def __init__(self, cluster: LocalReplicas, every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.every_s = every_s
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.max_term = 0
        self.leaders: set[tuple[int, str]] = set()

    def sample(self) -> None:
        for r in self.cluster.replicas:
            if not r.alive:
                continue
            try:
                status = self.cluster.local_status(r, timeout_s=0.5)
            except grpc.RpcError:
                continue
            with self.lock:
                self.max_term = max(self.max_term, int(status.term))
                if replica_role(status) is ReplicaRole.LEADER:
                    self.leaders.add((int(status.term), r.replica_id))

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()

    def reading(self) -> tuple[int, int]:
        with self.lock:
            return self.max_term, len(self.leaders)


def earliest_bind_after(stub: pb_grpc.SchedulerServiceStub, after_ms: float) -> float | None:
    """The earliest ``bound_at_ms`` after ``after_ms`` among bound jobs, or None."""
    times: list[int] = []
    token = ""
    for state in ("SCHEDULED", "RUNNING"):
        token = ""
        while True:
            page = stub.ListJobs(
                pb.ListJobsRequest(states=[state], page_token=token, limit=1000), timeout=5
            )
            times += [j.attempt.bound_at_ms for j in page.jobs if j.attempt.bound_at_ms > after_ms]
            token = page.next_page_token
            if not token:
                break
    return float(min(times)) if times else None


def run(
    root: Path, kills: int, quiet_s: float | None, streams: int, extra: list[str]
) -> dict[str, Any]:
    cluster = LocalReplicas(root / "fo", extra_args=extra)
    loads: list[Stream] = []
    heartbeater: Heartbeater | None = None
    watch = TermWatch(cluster)
    to_leader: list[float] = []
    to_write: list[float] = []
    to_bind: list[float] = []
    terms_per_kill: list[int] = []
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        node_ids = [f"fo-{i}" for i in range(4)]
        with cluster.client() as client:
            for i, n in enumerate(node_ids):
                client.register_node(register_request(n, loopback_host(i), gpu=0))
        heartbeater = Heartbeater(
            cluster.grpc_addresses, node_ids, interval_s=0.5, transport=cluster.transport
        )
        heartbeater.start()
        for _ in range(streams):
            stream = Stream(cluster.grpc_addresses, cluster.transport)
            stream.start()
            loads.append(stream)
        wait_for("acks under load", lambda: all(s.acks for s in loads), timeout_s=60)
        watch.sample()
        watch.start()

        # 1. kill-free period under the same load
        quiet = quiet_s if quiet_s is not None else max(5.0, 3.0 * kills)
        term0, _ = watch.reading()
        acks0 = sum(len(s.acks) for s in loads)
        time.sleep(quiet)
        watch.sample()
        term1, leaders1 = watch.reading()
        quiet_acks = sum(len(s.acks) for s in loads) - acks0
        quiet_elections = term1 - term0

        # 2. kills
        kill_started = time.monotonic()
        for _ in range(kills):
            leader = cluster.serving_leader(timeout_s=30)
            watch.sample()
            term_before, _ = watch.reading()
            wait_for("acks before the kill", lambda: all(s.acks for s in loads), timeout_s=30)
            time.sleep(0.3)
            kill_mono, kill_wall_ms = time.monotonic(), time.time() * 1000
            cluster.kill(leader)
            # Only what was sent or decided once the old leader was dead counts (under a
            # loaded machine the kill call itself can take tens of milliseconds); the
            # time is counted from before the kill.
            dead_mono, dead_wall_ms = time.monotonic(), time.time() * 1000
            new_leader = cluster.serving_leader(timeout_s=30)
            to_leader.append(time.monotonic() - kill_mono)
            first = wait_for(
                "a write after the kill",
                lambda t=dead_mono, s=loads[0]: s.first_ack_after(t),
                30,
            )
            to_write.append(first - kill_mono)
            with cluster.channel(new_leader.grpc) as channel:
                stub = pb_grpc.SchedulerServiceStub(channel)
                bound_ms = wait_for(
                    "a bind after the kill",
                    lambda s=stub, k=dead_wall_ms: earliest_bind_after(s, k),
                    timeout_s=30,
                    every_s=0.1,
                )
            to_bind.append((bound_ms - kill_wall_ms) / 1000)
            cluster.start(leader)
            target = cluster.local_status(new_leader).commit_index
            wait_for(
                "the restarted replica to catch up",
                lambda r=leader, t=target: cluster.local_status(r).last_applied >= t,
                timeout_s=60,
            )
            watch.sample()
            terms_per_kill.append(watch.reading()[0] - term_before)
        kill_s = time.monotonic() - kill_started
        for s in loads:
            s.stop.set()
        for s in loads:
            s.join(timeout=20)
        return {
            "kills": kills,
            "streams": streams,
            "replica_args": extra,
            "kill_free_s": round(quiet, 1),
            "kill_free_acknowledged_writes": quiet_acks,
            "kill_free_elections": quiet_elections,
            "kill_free_leaders_seen": leaders1,
            "kill_phase_s": round(kill_s, 1),
            "elections_per_kill_max": max(terms_per_kill) if terms_per_kill else 0,
            "failover_to_leader_s_p50": _p50(to_leader),
            "failover_to_leader_s_max": _max(to_leader),
            "failover_to_first_write_s_p50": _p50(to_write),
            "failover_to_first_write_s_max": _max(to_write),
            "failover_to_next_bind_s_p50": _p50(to_bind),
            "failover_to_next_bind_s_max": _max(to_bind),
            "failover_to_next_bind_s": [round(x, 3) for x in to_bind],
            "heartbeats_failed": heartbeater.failed,
        }
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        watch.stop.set()
        for s in loads:
            s.stop.set()
        if heartbeater is not None:
            heartbeater.stop.set()
        cluster.close()


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def _max(values: list[float]) -> float:
    return round(max(values), 3) if values else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--quiet-s", type=float, help="kill-free period (default: 3 s a kill)")
    parser.add_argument("--streams", type=int, default=4, help="concurrent submitting clients")
    parser.add_argument("--replica-arg", action="append", default=[], help="a replica flag")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    kills, quiet, streams = args.kills, args.quiet_s, args.streams
    if args.smoke:
        kills, quiet, streams = 1, 2.0, 1
    with tempfile.TemporaryDirectory(prefix="synapse-failover-") as tmp:
        report = {"smoke": args.smoke, **run(Path(tmp), kills, quiet, streams, args.replica_arg)}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
