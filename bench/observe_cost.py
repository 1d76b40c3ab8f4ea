"""What observability costs: scraping /metrics every second, and rendering the dashboard.

1. **Scrape cost on the leader's passes.** A replica's state (the placement benchmark's
   cluster: 8-GPU nodes in racks, half of the GPUs held by running gangs, pending gangs)
   behind the apply lock and copy-on-write snapshots, as the Raft replica holds it. The
   "leader" loop applies a submission, runs a scheduling pass on a fresh snapshot and
   cancels the submission (so the queue keeps its length), over and over; we measure the
   mean pass time with no scraper and with a scraper that fetches ``/metrics`` every
   second over HTTPS with a client certificate. The ObserveServer runs in the measured
   process, so its work (TLS, collecting, rendering the text) competes for the
   interpreter as it does in a replica; the scraper is a process of its own, as
   Prometheus is (its handshakes and parsing are not the replica's cost). The phases alternate
   (off, on, off, on, ...) so that drift hits both. Target: <= 2 % more pass time.
2. **Dashboard render** at 10,000 nodes and 5,000 live jobs: the main page's pure render
   function over synthetic API messages (median of several), and one real HTTPS fetch
   of the page from an ObserveServer whose dashboard serves that synthetic overview.
   Target: <= 300 ms.

Prints JSON and writes bench/results/observe_cost.json. ``--smoke`` runs a tiny version
in seconds (and writes nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from placement import build_cluster, gang_spec, make_busy

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.scheduler import CapacityCache, schedule
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked
from synapse_ha.observe.dashboard import Dashboard
from synapse_ha.observe.http import ObserveServer, Request
from synapse_ha.observe.metrics import ReplicaMetrics
from synapse_ha.observe.pages import Overview, render_overview
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import Transport


class Status:
    role = "leader"
    term = 2
    commit_index = 100
    last_applied = 100
    leader = "127.0.0.1:7001"
    has_quorum = True
    tick_stalls = 0
    longest_tick_interval_s = 0.02


class Replica:
    """The live state, its apply lock and its snapshots, as the Raft replica has them."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.lock = threading.Lock()
        self.builder = SnapshotBuilder()

    def snapshot(self) -> ClusterState:
        with self.lock:
            return self.builder.take(self.state)

    def apply(self, command: c.Command) -> c.Result:
        with self.lock:
            return apply_tracked(self.state, command, self.builder.changes)

    def status(self) -> Status:
        return Status()


def measure_passes(
    replica: Replica, seconds: float, rng: random.Random, cache: CapacityCache, counter: list[int]
) -> list[float]:
    """Submit, plan, cancel rounds for ``seconds``; each pass's wall time in ms."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        counter[0] += 1
        now = 1_000_000 + counter[0]
        spec = gang_spec(rng, f"extra-{counter[0]}", with_limit=True)
        job_id = replica.apply(c.SubmitJob(spec, f"bench-{counter[0]}", now)).job_id
        started = time.perf_counter()
        schedule(replica.snapshot(), now, cache=cache)
        times.append((time.perf_counter() - started) * 1000)
        replica.apply(c.CancelJob(job_id, now_ms=now))  # the queue keeps its length
    return times


# A Prometheus stand-in: fetch the URL every second with a client certificate and print
# each scrape's milliseconds; runs until terminated.
_SCRAPER = """
import ssl, sys, time, urllib.request
url, ca, cert, key = sys.argv[1:5]
context = ssl.create_default_context(cafile=ca)
context.load_cert_chain(cert, key)
while True:
    started = time.perf_counter()
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        response.read()
    print(round((time.perf_counter() - started) * 1000, 3), flush=True)
    time.sleep(1.0)
"""


def scrape_cost(args: argparse.Namespace, credentials: ClusterCredentials) -> dict[str, object]:
    rng = random.Random(7)
    hosts = args.hosts
    state = build_cluster(1, args.blocks, args.racks, hosts)
    make_busy(state, rng, 0.5)
    for i in range(args.pending):
        spec = gang_spec(rng, f"pending-{i}", with_limit=rng.random() < 0.7)
        assert apply(state, c.SubmitJob(spec, f"p-{i}", 500_000 + i)).ok
    replica = Replica(state)
    metrics = ReplicaMetrics("r1", replica)
    server = ObserveServer("127.0.0.1:0", metrics.registry, credentials.replica_tls("r1"))
    server.start()
    tls = credentials.client_tls()
    scraper_argv = [
        sys.executable,
        "-c",
        _SCRAPER,
        server.metrics_url,
        str(credentials.ca),
        str(tls.cert),
        str(tls.key),
    ]
    scrapes: list[float] = []
    scraper: subprocess.Popen[str] | None = None

    def stop_scraper() -> None:
        nonlocal scraper
        if scraper is None:
            return
        scraper.terminate()
        try:
            out, _ = scraper.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            scraper.kill()
            out, _ = scraper.communicate()
        scrapes.extend(float(line) for line in out.split())
        scraper = None

    cache = CapacityCache()
    counter = [0]
    measure_passes(replica, args.warmup_s, rng, cache, counter)
    off: list[float] = []
    on: list[float] = []
    try:
        for _ in range(args.rounds):
            off += measure_passes(replica, args.phase_s, rng, cache, counter)
            scraper = subprocess.Popen(scraper_argv, stdout=subprocess.PIPE, text=True)
            on += measure_passes(replica, args.phase_s, rng, cache, counter)
            stop_scraper()
    finally:
        stop_scraper()
        server.stop()
    mean_off, mean_on = statistics.fmean(off), statistics.fmean(on)
    return {
        "nodes": len(state.nodes),
        "jobs": len(state.jobs),
        "passes_without_scraper": len(off),
        "passes_with_scraper": len(on),
        "pass_ms_mean_without_scraper": round(mean_off, 2),
        "pass_ms_mean_with_scraper": round(mean_on, 2),
        "pass_ms_median_without_scraper": round(statistics.median(off), 2),
        "pass_ms_median_with_scraper": round(statistics.median(on), 2),
        "pass_time_increase_percent": round(100 * (mean_on - mean_off) / mean_off, 2),
        "scrapes": len(scrapes),
        "scrape_ms_median": round(statistics.median(scrapes), 2) if scrapes else None,
        "target_increase_percent_max": 2.0,
    }


def synthetic_overview(nodes: int, jobs: int, rng: random.Random) -> Overview:
    replicas = [
        pb.ReplicaStatus(
            replica_id=f"r{i}",
            role="leader" if i == 1 else "follower",
            term=3,
            commit_index=1000,
            last_applied=1000,
            leader_id="r1",
            healthy=True,
            grpc_address=f"10.0.0.{i}:7101",
            dashboard_url=f"https://10.0.0.{i}:9101/",
        )
        for i in (1, 2, 3)
    ]
    status = pb.GetClusterStatusResponse(
        answered_by="r1", leader_id="r1", replicas=replicas, nodes=nodes, jobs=jobs
    )
    node_msgs = []
    for i in range(nodes):
        used = sorted(rng.sample(range(8), rng.randint(0, 8)))
        node_msgs.append(
            pb.Node(
                node_id=f"n{i:05d}",
                status="ready",
                capacity=pb.Resources(cpu_milli=128_000, memory_mib=1 << 20, gpu=8),
                allocated_gpus=used,
                topology=[
                    pb.TopologyLabel(level="zone", value="z1"),
                    pb.TopologyLabel(level="rack", value=f"rack{i // 40:03d}"),
                ],
            )
        )
    job_msgs = []
    for i in range(jobs):
        running = i % 2 == 0
        members = [
            pb.Member(rank=r, node_id=f"n{(i * 4 + r) % nodes:05d}", gpus=[0, 1], state="running")
            for r in range(4)
        ]
        job_msgs.append(
            pb.Job(
                job_id=f"job-{i:06d}",
                spec=pb.JobSpec(
                    name=f"train-{i}", replicas=4, resources=pb.Resources(gpu=2), priority=i % 3
                ),
                state="RUNNING" if running else "PENDING",
                reason="running"
                if running
                else "needs 4 members x 2 GPU in one rack; best rack rack012 has 3 free hosts",
                reason_code="running" if running else "waiting_capacity",
                owner=f"user{i % 20}",
                attempt=pb.Attempt(number=1, members=members) if running else None,
            )
        )
    return Overview(status=status, jobs=job_msgs, nodes=node_msgs)


class SyntheticDashboard(Dashboard):
    """The real dashboard app, with its overview from memory instead of the API."""

    def __init__(self, overview: Overview) -> None:
        super().__init__(["127.0.0.1:1"], Transport.insecure())
        self._overview = overview

    def overview(self, token: str) -> Overview:
        return self._overview


def render_cost(args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(11)
    overview = synthetic_overview(args.dashboard_nodes, args.dashboard_jobs, rng)
    times = []
    size = 0
    for _ in range(args.render_repeats):
        started = time.perf_counter()
        page = render_overview(overview, "bench")
        times.append((time.perf_counter() - started) * 1000)
        size = len(page)
    app = SyntheticDashboard(overview)
    server = ObserveServer("127.0.0.1:0", ReplicaMetrics("r1", Replica(ClusterState())).registry,
                           None, app=app)  # fmt: skip
    server.start()
    try:
        assert app(Request("GET", "/", {}, b"", False)).status == 200
        started = time.perf_counter()
        with urllib.request.urlopen(server.url + "/", timeout=30) as response:
            body = response.read()
        fetch_ms = (time.perf_counter() - started) * 1000
    finally:
        server.stop()
    assert b'id="nodes"' in body and len(body) > size // 2
    return {
        "nodes": args.dashboard_nodes,
        "jobs": args.dashboard_jobs,
        "render_ms_median": round(statistics.median(times), 1),
        "render_ms_max": round(max(times), 1),
        "http_fetch_ms": round(fetch_ms, 1),
        "page_bytes": size,
        "target_ms_max": 300,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.blocks, args.racks, args.hosts, args.pending = 1, 4, 10, 50
        args.warmup_s, args.phase_s, args.rounds = 0.2, 1.2, 1
        args.dashboard_nodes, args.dashboard_jobs, args.render_repeats = 200, 100, 2
    else:
        # 2,000 nodes and 2,000 pending gangs: passes of tens of milliseconds.
        args.blocks, args.racks, args.hosts, args.pending = 5, 10, 40, 2000
        args.warmup_s, args.phase_s, args.rounds = 5.0, 10.0, 4
        args.dashboard_nodes, args.dashboard_jobs, args.render_repeats = 10_000, 5_000, 7
    with tempfile.TemporaryDirectory() as tmp:
        credentials = ClusterCredentials.ensure(Path(tmp) / "credentials")
        report = {
            "scrape_every_1s": scrape_cost(args, credentials),
            "dashboard_main_page": render_cost(args),
        }
    text = json.dumps(report, indent=2)
    print(text)
    if not args.smoke:
        out = Path(__file__).resolve().parent / "results" / "observe_cost.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
