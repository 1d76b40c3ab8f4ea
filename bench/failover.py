"""Failover benchmark: leader faults under load, and elections without faults.

Three real replicas on loopback (mutual TLS, the benchmark calling as the admin by
certificate). The load: ``--streams`` clients each submitting one small job at a time
through the redirect-following :class:`~synapse_ha.client.cluster.ClusterClient`, a few
simulated nodes heartbeating, so every submission is bound by the leader's planning loop,
and two real ``synapse-worker`` processes (mock GPUs) running one long two-member gang.

1. **Fault-free period.** The load runs for ``--quiet-s`` seconds (by default 3 s a
   fault) with no fault; the benchmark samples every replica's Raft term and the leader
   it names. Every term a replica enters is one election; under load with no fault there
   must be none.
2. **Faults** (``--fault kill|freeze|partition``, repeatable; default all three),
   ``--faults`` of each (:mod:`bench.faults`): ``kill`` is ``kill -9`` of the leader
   (restarted and caught up after the next bind); ``freeze`` is SIGSTOP of the leader,
   SIGCONT a second after the next bind; ``partition`` drops loopback TCP to and from
   the leader's ports (nftables, root), healed a second after the next bind. For each:
   the time from the fault to a replica serving as leader, to the first acknowledged
   write sent after the fault, and to the next committed bind (the earliest
   ``bound_at`` after the fault); and whether the gang's attempt survived the fault
   (same fencing token, still running, both its members alive, no worker node declared
   dead): ``gangs_survived``.

Prints one JSON object (``--out`` also writes it to a file): the kill figures under the
keys of earlier versions, and every kind's under ``faults``. ``--smoke`` runs 1 fault of
each kind. Extra flags for the replicas (``--replica-arg=--election-min=300ms``) let the
same run compare settings.
Targets on a two-core machine: kill -> next committed bind p50 <= 0.1 s, max <= 0.5 s;
freeze and partition -> p50 <= 1 s, max <= 2 s; every gang survives; 0 elections in
the fault-free period.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults import FAULTS, Fault, sweep
from bench.loopback import wait_for
from bench.quorum import Heartbeater, Stream, lift_member_limits, loopback_host, register_request
from bench.report import emit
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import NodeStatus
from synapse_ha.local.process import Replica, Worker
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import node_status, replica_role
from synapse_ha.worker.pidns import ECHO_PID, host_pid


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


class Gang:
    """Two real workers (one mock GPU each) running one long two-member gang."""

    def __init__(self, cluster: LocalReplicas, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.out = root / "gang-out"
        self.node_ids = ["gw-1", "gw-2"]
        self.workers: list[Worker] = []
        self.job_id = ""
        self.token = 0
        self.pids: list[int] = []

    def start(self, client: ClusterClient) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for node_id in self.node_ids:
            worker = self.cluster.launcher.worker(
                self.cluster.grpc_addresses,
                node_id,
                self.root / node_id,
                extra=[
                    *("--no-cgroups", "--stop-grace", "1s", "--fence-grace", "200ms"),
                    *("--cpu", "1", "--memory", "1Gi", "--mock-gpus", "1"),
                ],
            )
            self.cluster.launcher.start(worker)
            self.workers.append(worker)
        spec = pb.JobSpec(
            name="long-gang",
            replicas=2,
            # All of each worker's CPU and GPU, and its memory but its supervisor's share.
            resources=pb.Resources(cpu_milli=1000, memory_mib=1000, gpu=1),
            shell_command=f"{ECHO_PID} > $OUT/pid-$RANK; exec sleep 100000",
            env=[pb.EnvVar(name="OUT", value=str(self.out))],
        )
        self.job_id = client.submit_job(spec, timeout_s=60).job_id
        job = wait_for(
            "the gang running",
            lambda: (j := client.get_job(self.job_id)).state == "RUNNING" and j,
            timeout_s=60,
        )
        self.token = job.attempt.fencing_token
        said = [
            wait_for(f"pid {r}", lambda r=r: _read(self.out / f"pid-{r}"), 30) for r in range(2)
        ]
        pids = [host_pid(s) for s in said]  # each member may be PID 2 of a namespace
        if None in pids:
            raise RuntimeError(f"a member of the gang ended before it ran: {said}")
        self.pids = [p for p in pids if p is not None]

    def survived(self, client: ClusterClient) -> tuple[bool, str]:
        """Whether the attempt running before the faults still runs, and if not, why."""
        job = client.get_job(self.job_id)
        statuses = {n.node_id: node_status(n) for n in client.list_nodes()}
        dead = [n for n in self.node_ids if statuses.get(n) is not NodeStatus.READY]
        gone = [p for p in self.pids if not _alive(p)]
        why = []
        if job.state != "RUNNING" or job.attempt.fencing_token != self.token:
            why.append(f"job {job.state} attempt token {job.attempt.fencing_token}")
        if dead:
            why.append(f"nodes not ready: {dead}")
        if gone:
            why.append(f"members gone: {gone}")
        if why:
            why += [line for w in self.workers for line in _telling(w.log_tail(20_000))]
        return not why, "; ".join(why)


def _telling(log: str) -> list[str]:
    """The worker log lines that say why members were killed."""
    words = ("fenced", "killed", "dead", "does not know", "registering again")
    return [line for line in log.splitlines() if any(w in line for w in words)][-8:]


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def serving_leader_except(cluster: LocalReplicas, faulty: Replica, timeout_s: float) -> Replica:
    """The first other replica that says it leads and answers a leader-only read."""

    def probe() -> Replica | None:
        for r in cluster.replicas:
            if r is faulty or not r.alive:
                continue
            with contextlib.suppress(grpc.RpcError):
                status = cluster.local_status(r, timeout_s=0.3)
                if replica_role(status) is ReplicaRole.LEADER:
                    with cluster.channel(r.grpc) as channel:
                        stub = pb_grpc.SchedulerServiceStub(channel)
                        stub.ListNodes(pb.ListNodesRequest(), timeout=0.5)
                    return r
        return None

    return wait_for("a new serving leader", probe, timeout_s=timeout_s, every_s=0.01)


class Figures:
    """What one fault kind measured."""

    def __init__(self) -> None:
        self.to_leader: list[float] = []
        self.to_write: list[float] = []
        self.to_bind: list[float] = []
        self.terms: list[int] = []
        self.survived = 0
        self.lost: list[str] = []

    def report(self) -> dict[str, Any]:
        n = len(self.to_bind)
        return {
            "faults": n,
            "elections_per_fault_max": max(self.terms) if self.terms else 0,
            "failover_to_leader_s_p50": _p50(self.to_leader),
            "failover_to_leader_s_max": _max(self.to_leader),
            "failover_to_first_write_s_p50": _p50(self.to_write),
            "failover_to_first_write_s_max": _max(self.to_write),
            "failover_to_next_bind_s_p50": _p50(self.to_bind),
            "failover_to_next_bind_s_max": _max(self.to_bind),
            "failover_to_next_bind_s": [round(x, 3) for x in self.to_bind],
            "gangs_survived": f"{self.survived}/{n}",
            "gangs_lost": self.lost,
        }


def one_fault(
    kind: str, cluster: LocalReplicas, loads: list[Stream], watch: TermWatch, figures: Figures
) -> None:
    """Fault the leader, measure, undo the fault and wait until the replica caught up."""
    leader = cluster.serving_leader(timeout_s=30)
    watch.sample()
    term_before, _ = watch.reading()
    wait_for("acks before the fault", lambda: all(s.acks for s in loads), timeout_s=30)
    time.sleep(0.3)
    fault = Fault(kind, leader)
    fault_mono, fault_wall_ms = time.monotonic(), time.time() * 1000
    try:
        fault.begin()
        # Only what was sent or decided once the fault was in place counts (on a loaded
        # machine the signal or the rules can take tens of milliseconds); the time is
        # counted from before the fault.
        begun_mono, begun_wall_ms = time.monotonic(), time.time() * 1000
        new_leader = serving_leader_except(cluster, leader, timeout_s=30)
        figures.to_leader.append(time.monotonic() - fault_mono)
        first = wait_for(
            "a write after the fault",
            lambda t=begun_mono, s=loads[0]: s.first_ack_after(t),
            30,
        )
        figures.to_write.append(first - fault_mono)
        with cluster.channel(new_leader.grpc) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)
            bound_ms = wait_for(
                "a bind after the fault",
                lambda s=stub, k=begun_wall_ms: earliest_bind_after(s, k),
                timeout_s=30,
                every_s=0.1,
            )
        figures.to_bind.append((bound_ms - fault_wall_ms) / 1000)
        if kind != "kill":
            time.sleep(1.0)  # the fault lasts a second beyond the next bind
    finally:
        fault.end()
    if kind == "kill":
        cluster.start(leader)
    target = cluster.local_status(new_leader).commit_index
    wait_for(
        "the faulted replica to catch up",
        lambda r=leader, t=target: cluster.local_status(r).last_applied >= t,
        timeout_s=60,
    )
    watch.sample()
    figures.terms.append(watch.reading()[0] - term_before)


def run(
    root: Path,
    kinds: list[str],
    per_kind: int,
    quiet_s: float | None,
    streams: int,
    extra: list[str],
) -> dict[str, Any]:
    swept = sweep() if "partition" in kinds else []
    cluster = LocalReplicas(root / "fo", extra_args=extra)
    loads: list[Stream] = []
    heartbeater: Heartbeater | None = None
    watch = TermWatch(cluster)
    by_kind = {kind: Figures() for kind in kinds}
    gang = Gang(cluster, root)
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        node_ids = [f"fo-{i}" for i in range(4)]
        with cluster.client(timeout_s=60.0) as client:
            lift_member_limits(client)
            gang.start(client)  # first: the small jobs never land on its workers
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

        # 1. fault-free period under the same load
        quiet = quiet_s if quiet_s is not None else max(5.0, 3.0 * per_kind * len(kinds))
        term0, _ = watch.reading()
        acks0 = sum(len(s.acks) for s in loads)
        time.sleep(quiet)
        watch.sample()
        term1, leaders1 = watch.reading()
        quiet_acks = sum(len(s.acks) for s in loads) - acks0

        # 2. faults
        started = time.monotonic()
        for kind in kinds:
            figures = by_kind[kind]
            for _ in range(per_kind):
                one_fault(kind, cluster, loads, watch, figures)
                with cluster.client(timeout_s=30.0) as client:
                    ok, why = gang.survived(client)
                figures.survived += ok
                if not ok:
                    figures.lost.append(why)
                    break  # the gang is gone: later faults would measure nothing
        fault_s = time.monotonic() - started
        for s in loads:
            s.stop.set()
        for s in loads:
            s.join(timeout=20)
        reports = {kind: f.report() for kind, f in by_kind.items()}
        kill = reports.get("kill")
        legacy = {k: v for k, v in (kill or {}).items() if k.startswith("failover_")}
        return {
            "kills": kill["faults"] if kill else 0,
            "streams": streams,
            "replica_args": extra,
            "kill_free_s": round(quiet, 1),
            "kill_free_acknowledged_writes": quiet_acks,
            "kill_free_elections": term1 - term0,
            "kill_free_leaders_seen": leaders1,
            "kill_phase_s": round(fault_s, 1),
            "elections_per_kill_max": kill["elections_per_fault_max"] if kill else 0,
            **legacy,
            "heartbeats_failed": heartbeater.failed,
            "gangs_survived": _survived(by_kind.values()),
            "faults": reports,
            "nft_tables_swept": swept,
        }
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        for w in gang.workers:
            print(f"----- {w.node_id} -----\n{w.log_tail(3000)}", file=sys.stderr)
        raise
    finally:
        watch.stop.set()
        for s in loads:
            s.stop.set()
        if heartbeater is not None:
            heartbeater.stop.set()
        cluster.close()


def _survived(figures: Iterable[Figures]) -> str:
    done = list(figures)
    return f"{sum(f.survived for f in done)}/{sum(len(f.to_bind) for f in done)}"


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def _max(values: list[float]) -> float:
    return round(max(values), 3) if values else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument(
        "--fault", action="append", choices=FAULTS, help="a fault kind (default: all three)"
    )
    parser.add_argument("--faults", type=int, default=20, help="faults of each kind")
    parser.add_argument("--quiet-s", type=float, help="fault-free period (default: 3 s a fault)")
    parser.add_argument("--streams", type=int, default=4, help="concurrent submitting clients")
    parser.add_argument("--replica-arg", action="append", default=[], help="a replica flag")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    kinds = list(dict.fromkeys(args.fault or FAULTS))
    per_kind, quiet, streams = args.faults, args.quiet_s, args.streams
    if args.smoke:
        per_kind, quiet, streams = 1, 2.0, 1
    with tempfile.TemporaryDirectory(prefix="synapse-failover-") as tmp:
        figures = run(Path(tmp), kinds, per_kind, quiet, streams, args.replica_arg)
        report = {"smoke": args.smoke, **figures}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
