"""Fresh-client failover benchmark: how soon a write from a *new* process lands after the
leader freezes (SIGSTOP) or dies (kill -9).

Three real replicas on loopback (mutual TLS, called as the admin by certificate). Each
run waits for a serving leader, faults it and at once starts a new process that submits
one job and exits: ``synctl --cluster a,b,c submit job.yaml`` (``--client synctl``, the
default), or a small Python program with a fresh
:class:`~synapse_ha.client.cluster.ClusterClient` (``--client python``, which also says
when its imports were done, so the client's own share is seen apart from the start-up of
the interpreter). A new process remembers no leader: with ``--order leader-first`` (the
default) the faulted leader is the first address it is given, the case where it has most
to lose; ``--order given`` keeps the replicas' order. The time is counted from just
before the signal to the moment the process printed the job's id (its write
acknowledged). The fault is then undone (SIGCONT, or a restart after a kill) and the
replica waited for until it has caught up.

Fault kinds (``--fault``, repeatable): ``none`` (no fault: the cost of a fresh process
against a healthy cluster), ``freeze``, ``kill``; ``--runs`` of each (default 5), one of
each kind in turn, so that a change in the machine's load weighs on every kind alike.

Before the faults, the cost of a call to a healthy cluster: ``--healthy`` submissions one
after another through one (warm) client, their latency and how many RPCs each sent.

Prints one JSON object and writes it to ``--out`` (default
``bench/results/fresh_client_failover.json``). Every process it starts is stopped on the
way out, also on failure; every wait is bounded.
Targets on a two-core machine: freeze -> write p50 <= 1 s, max <= 1.5 s; kill -> write
p50 <= 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults import Fault
from bench.loopback import wait_for
from bench.report import emit
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.local.process import Replica
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

KINDS = ("none", "freeze", "kill")
RESULTS = Path(__file__).resolve().parent / "results" / "fresh_client_failover.json"
ANSWER_S = 30.0  # the longest a fresh process may take to acknowledge its write
SETTLE_S = 1.0  # a steady cluster before each fault: every follower heard the leader

JOB_YAML = """\
name: fresh-client
replicas: 1
resources: {gpu: 0, cpu: 100m, memory: 64Mi}
command: "true"
"""

# The ``--client python`` program: a new ClusterClient, one submission, two wall-clock
# instants on stdout (imports done, write acknowledged) and the job's id.
PYTHON_CLIENT = """\
import os, sys, time
from pathlib import Path
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.tls import TlsFiles, Transport
ready = time.time()
tls = TlsFiles(*(Path(os.environ[f"SYNAPSE_{k}"]) for k in ("CA", "CERT", "KEY")))
spec = pb.JobSpec(name="fresh-client", replicas=1, shell_command="true",
                  resources=pb.Resources(cpu_milli=100, memory_mib=64))
channels = Transport(tls).channel
with ClusterClient(sys.argv[1].split(","), channel_factory=channels) as client:
    job_id = client.submit_job(spec).job_id
print(ready, time.time(), job_id, flush=True)
"""


class FreshProcess:
    """One new client process submitting one job; :meth:`close` always stops it."""

    def __init__(self, client: str, addresses: list[str], spec: Path, env: dict[str, str]):
        cluster = ",".join(addresses)
        if client == "synctl":
            argv = [sys.executable, "-m", "synapse_ha.cli", "--cluster", cluster]
            argv += ["submit", str(spec)]
        else:
            argv = [sys.executable, "-c", PYTHON_CLIENT, cluster]
        # Run from the spec's folder: the interpreter imports the package as installed
        # (or from $PYTHONPATH), never from the current directory by accident.
        self.process = subprocess.Popen(
            argv,
            cwd=spec.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def first_line(self, timeout_s: float) -> tuple[float, str]:
        """The monotonic time the process printed its first line, and the line."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        data = b""
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer within {timeout_s} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError(f"the client exited without an answer: {self.errors()}")
                data += chunk
        return time.monotonic(), data.decode().splitlines()[0]

    def errors(self) -> str:
        self.close()
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=10.0)


def client_env(cluster: LocalReplicas) -> dict[str, str]:
    assert cluster.credentials is not None
    tls = cluster.credentials.admin_tls()
    env = {**os.environ, "SYNAPSE_CA": str(tls.ca), "SYNAPSE_CERT": str(tls.cert)}
    env["SYNAPSE_KEY"] = str(tls.key)
    return env


def client_order(cluster: LocalReplicas, leader: Replica, order: str) -> list[str]:
    addresses = cluster.grpc_addresses
    if order == "leader-first":
        return [leader.grpc, *(a for a in addresses if a != leader.grpc)]
    return addresses


def one_run(
    kind: str, cluster: LocalReplicas, client: str, order: str, spec: Path
) -> dict[str, Any]:
    """Fault the leader, time a fresh process's write, undo the fault, wait for the
    replica to catch up."""
    leader = cluster.serving_leader(timeout_s=60)
    time.sleep(SETTLE_S)
    addresses = client_order(cluster, leader, order)
    env = client_env(cluster)
    fault = Fault(kind, leader) if kind != "none" else None
    fresh: FreshProcess | None = None
    started, started_wall = time.monotonic(), time.time()
    try:
        if fault is not None:
            fault.begin()
        fresh = FreshProcess(client, addresses, spec, env)
        acked, line = fresh.first_line(ANSWER_S)
    finally:
        if fresh is not None:
            fresh.close()
        if fault is not None:
            fault.end()
    record: dict[str, Any] = {
        "fault": kind,
        "leader_position": addresses.index(leader.grpc),
        "to_write_s": round(acked - started, 3),
    }
    if client == "python":
        ready, done, _ = line.split()
        record["imports_s"] = round(float(ready) - started_wall, 3)
        record["client_s"] = round(float(done) - float(ready), 3)
    if kind == "kill":
        cluster.start(leader)
    caught_up(cluster, leader)
    return record


def caught_up(cluster: LocalReplicas, faulted: Replica) -> None:
    """Wait (bounded) until one replica serves as leader and ``faulted`` has applied
    what it had committed."""
    leader = cluster.serving_leader(timeout_s=60)
    target = cluster.local_status(leader).commit_index
    wait_for(
        "the faulted replica to catch up",
        lambda: cluster.local_status(faulted).last_applied >= target,
        timeout_s=60,
    )


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["to_write_s"] for r in records]
    out: dict[str, Any] = {
        "runs": len(records),
        "to_write_s_p50": round(statistics.median(times), 3),
        "to_write_s_max": round(max(times), 3),
        "to_write_s": times,
    }
    shares = [r["client_s"] for r in records if "client_s" in r]
    if shares:
        out["client_s_p50"] = round(statistics.median(shares), 3)
        out["client_s_max"] = round(max(shares), 3)
        out["imports_s_p50"] = round(statistics.median(r["imports_s"] for r in records), 3)
    return out


class CountingRpcs(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Counts the unary RPCs sent on the channels it wraps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        with self.lock:
            self.sent += 1
        return continuation(details, request)


def healthy_calls(cluster: LocalReplicas, calls: int) -> dict[str, Any]:
    """Submissions one after another through one warm client of a healthy cluster:
    latency (ms) and RPCs sent per submission."""
    counter = CountingRpcs()
    client = ClusterClient(
        cluster.grpc_addresses,
        channel_factory=lambda a: grpc.intercept_channel(cluster.transport.channel(a), counter),
    )
    spec = pb.JobSpec(
        name="healthy",
        replicas=1,
        shell_command="true",
        resources=pb.Resources(cpu_milli=100, memory_mib=64),
    )
    latencies: list[float] = []
    with client:
        client.submit_job(spec)  # finds the leader, opens the channel
        sent_before = counter.sent
        for _ in range(calls):
            started = time.perf_counter()
            client.submit_job(spec)
            latencies.append((time.perf_counter() - started) * 1000)
    latencies.sort()
    return {
        "calls": calls,
        "latency_ms_p50": round(statistics.median(latencies), 2),
        "latency_ms_p99": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
        "rpcs_per_call": round((counter.sent - sent_before) / calls, 3),
    }


def run(
    root: Path, kinds: list[str], runs: int, client: str, order: str, healthy: int
) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    cluster = LocalReplicas(root / "cluster")
    spec = root / "job.yaml"
    spec.write_text(JOB_YAML)
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        with cluster.client(timeout_s=30.0) as warm:
            for i in range(3):
                spec_i = pb.JobSpec(
                    name=f"before-{i}",
                    replicas=1,
                    shell_command="true",
                    resources=pb.Resources(cpu_milli=100, memory_mib=64),
                )
                warm.submit_job(spec_i)
        healthy_report = healthy_calls(cluster, healthy) if healthy else {}
        for _ in range(runs):
            for kind in kinds:
                by_kind[kind].append(one_run(kind, cluster, client, order, spec))
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        for r in cluster.replicas:
            if r.paused:
                r.resume()
        cluster.close()
    return {
        "client": client,
        "order": order,
        # The machine's 1-minute load average: a fresh process's start-up (its imports)
        # is most of its time to write, and grows with the load.
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "healthy": healthy_report,
        "faults": {kind: summary(records) for kind, records in by_kind.items()},
        "runs": by_kind,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", action="append", choices=KINDS, help="default: all three")
    parser.add_argument("--runs", type=int, default=5, help="runs of each fault kind")
    parser.add_argument("--client", choices=("synctl", "python"), default="synctl")
    parser.add_argument("--order", choices=("leader-first", "given"), default="leader-first")
    parser.add_argument("--healthy", type=int, default=200, help="healthy calls timed (0: none)")
    parser.add_argument("--smoke", action="store_true", help="one run of each kind")
    parser.add_argument("--out", default=str(RESULTS), help="also write the JSON here")
    args = parser.parse_args()
    kinds = list(dict.fromkeys(args.fault or KINDS))
    runs, healthy = (1, 20) if args.smoke else (args.runs, args.healthy)
    with tempfile.TemporaryDirectory(prefix="synapse-fresh-client-") as tmp:
        figures = run(Path(tmp), kinds, runs, args.client, args.order, healthy)
    report = {"smoke": args.smoke, **figures}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
