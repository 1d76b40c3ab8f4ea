"""Durability of acknowledged submissions, and what the journal's fsync mode costs.

Two parts, each against 3 ``synapse-scheduler`` replicas on 127.0.0.1 with mutual TLS:

* **cycles** (``bench/results/durability.json``): ``--cycles`` times, ``--threads``
  client threads submit jobs without pause; at a random moment (uniform in
  ``--kill-after``) every replica gets SIGKILL at once; all are restarted; once a leader
  serves and has acknowledged a marker job (so every earlier entry is committed), every
  replica's encoded state (GetReplicaState) is fetched until the three are byte-identical
  and hold the marker. Checked after each cycle: every submission a replica acknowledged (OK
  answer, at any cycle so far) is in the state, the states are identical, and the core
  invariants hold. The jobs ask for more GPUs than any node has (there are no nodes), so
  they stay queued and nothing removes them. A small ``--compaction-entries`` makes the
  replicas write snapshots and trim their journals between kills.
* **cost** (``bench/results/fsync_cost.json``): acknowledged submissions per second with
  the fsync mode off and on, ``--cost-threads`` client threads (each its own connection)
  submitting ``--cost-submissions`` jobs, and one thread alone (the latency of one
  acknowledgement: leader append, follower append, commit).

``--part`` picks ``cycles``, ``cost`` or ``both``; ``--smoke`` runs a tiny version and
writes only where ``--out``/``--cost-out`` say. Every process is stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core import invariants
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.local.waiting import RPC_ERRORS, wait_until
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

RESULTS = Path(__file__).resolve().parent / "results"
CYCLES_RESULT = RESULTS / "durability.json"
COST_RESULT = RESULTS / "fsync_cost.json"


def queued_spec(name: str) -> pb.JobSpec:
    """A job no node can hold: it waits in the queue for ever."""
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=10, memory_mib=16, gpu=64),
        shell_command="true",
        wait_for_nodes=True,
    )


@contextlib.contextmanager
def cluster(
    root: Path, fsync: bool, compaction_entries: int | None = None
) -> Iterator[LocalReplicas]:
    extra = ["--raft-fsync" if fsync else "--no-raft-fsync", "--log-level", "WARNING"]
    if compaction_entries is not None:
        extra += ["--compaction-entries", str(compaction_entries)]
    replicas = LocalReplicas(root, 3, extra)
    try:
        replicas.start()
        replicas.serving_leader(timeout_s=60)
        yield replicas
    except Exception:
        print(replicas.logs(), file=sys.stderr)
        raise
    finally:
        replicas.close()


# ------------------------------------------------------------------------ cycles


class Submitters:
    """Client threads submitting queued jobs until stopped; remembers every job id a
    replica acknowledged. A call that fails (the replicas are being killed) has an
    unknown outcome and is not counted."""

    def __init__(self, replicas: LocalReplicas, threads: int, prefix: str) -> None:
        self.acked: list[tuple[str, str]] = []  # (job id, job name) per acknowledgement
        self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients = [
            replicas.client(timeout_s=2.0, per_try_timeout_s=1.0) for _ in range(threads)
        ]
        self._threads = [
            threading.Thread(target=self._run, args=(i, f"{prefix}-t{i}"), daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _run(self, i: int, prefix: str) -> None:
        client = self._clients[i]
        n = 0
        while not self._stop.is_set():
            n += 1
            name = f"{prefix}-{n}"
            try:
                job_id = client.submit_job(queued_spec(name)).job_id
            except RPC_ERRORS:
                with self._lock:
                    self.failed += 1
                continue
            with self._lock:
                self.acked.append((job_id, name))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        for c in self._clients:
            c.close()


def converged_states(
    replicas: LocalReplicas, timeout_s: float, marker: str
) -> dict[str, pb.GetReplicaStateResponse]:
    """Every replica's GetReplicaState answer once all are byte-identical and hold job
    ``marker``, acknowledged after the restart: an entry of the new leader's term is
    committed, so is every entry before it, and identical states that hold it are not
    three copies lagging at the same older index; bounded."""

    def probe() -> dict[str, pb.GetReplicaStateResponse] | None:
        with replicas.client(timeout_s=10.0, per_try_timeout_s=10.0) as client:
            states = {r.replica_id: client.replica_state(r.grpc) for r in replicas.replicas}
        if len({s.encoded_state for s in states.values()}) != 1:
            return None
        if marker not in decode_state(next(iter(states.values())).encoded_state).jobs:
            return None
        return states

    return wait_until(
        "byte-identical replica states", probe, timeout_s, every_s=0.1, retry_on=RPC_ERRORS
    )


def kill_all(replicas: LocalReplicas) -> None:
    """SIGKILL every replica at once (signals first, then reap each)."""
    for r in replicas.replicas:
        if r.alive:
            r.signal_group(signal.SIGKILL)
    for r in replicas.replicas:
        r.kill(signal.SIGKILL)


def run_cycles(
    root: Path,
    cycles: int,
    *,
    fsync: bool,
    threads: int = 3,
    kill_after_s: tuple[float, float] = (0.3, 2.0),
    compaction_entries: int | None = 300,
    seed: int = 1,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """The cycles part; returns its report (``lost`` lists acknowledged jobs missing)."""
    rng = random.Random(seed)
    # Every acknowledgement as job id -> the name it was acknowledged for: an id answered
    # for two different names, or held in the state under another name, is a lost job
    # whose id was handed out again.
    acked: dict[str, str] = {}
    reused: set[str] = set()
    lost: set[str] = set()
    diverged = 0
    violations: list[str] = []
    per_cycle: list[dict[str, Any]] = []
    with cluster(root, fsync, compaction_entries) as replicas:
        for cycle in range(1, cycles + 1):
            submitters = Submitters(replicas, threads, f"c{cycle}")
            wait_s = rng.uniform(*kill_after_s)
            time.sleep(wait_s)  # the fault's random moment, not a wait for a condition
            kill_all(replicas)
            submitters.stop()
            for job_id, name in submitters.acked:
                if acked.setdefault(job_id, name) != name:
                    reused.add(job_id)
            restart = time.monotonic()
            replicas.start()
            replicas.serving_leader(timeout_s=timeout_s)
            leader_s = time.monotonic() - restart
            with replicas.client(timeout_s=timeout_s) as client:
                marker = client.submit_job(queued_spec(f"c{cycle}-marker")).job_id
            if acked.setdefault(marker, f"c{cycle}-marker") != f"c{cycle}-marker":
                reused.add(marker)
            states = converged_states(replicas, timeout_s, marker)
            converge_s = time.monotonic() - restart
            answers = list(states.values())
            if len({a.state_sha256 for a in answers}) != 1:
                diverged += 1
            state = decode_state(answers[0].encoded_state)
            missing = {
                job_id
                for job_id, name in acked.items()
                if job_id not in state.jobs or state.jobs[job_id].spec.name != name
            } | reused
            lost |= missing
            found = invariants.check(state)
            violations += [f"cycle {cycle}: {v}" for v in found]
            per_cycle.append(
                {
                    "cycle": cycle,
                    "kill_after_s": round(wait_s, 3),
                    "acked": len(submitters.acked),
                    "unknown_outcome": submitters.failed,
                    "lost": len(missing),
                    "jobs_in_state": len(state.jobs),
                    "leader_after_s": round(leader_s, 3),
                    "identical_after_s": round(converge_s, 3),
                    "last_applied": answers[0].last_applied,
                }
            )
            print(json.dumps(per_cycle[-1]), file=sys.stderr)
    restarts = [c["identical_after_s"] for c in per_cycle]
    return {
        "replicas": 3,
        "tls": True,
        "fsync": fsync,
        "cycles": cycles,
        "client_threads": threads,
        "kill_after_s": list(kill_after_s),
        "compaction_entries": compaction_entries,
        "seed": seed,
        "acknowledged": len(acked),
        "job_ids_handed_out_twice": sorted(reused)[:10],
        "acknowledged_lost": len(lost),
        "lost_examples": sorted(lost)[:10],
        "cycles_with_diverged_states": diverged,
        "invariant_violations": violations[:20],
        "identical_after_restart_s_p50": round(statistics.median(restarts), 3),
        "identical_after_restart_s_max": round(max(restarts), 3),
        "per_cycle": per_cycle,
    }


# -------------------------------------------------------------------------- cost


def submissions_per_s(replicas: LocalReplicas, count: int, threads: int) -> dict[str, Any]:
    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    clients: list[ClusterClient] = [replicas.client(timeout_s=30.0) for _ in range(threads)]
    ready = threading.Barrier(threads + 1)
    go = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def submitter(i: int) -> None:
        client = clients[i]
        try:
            client.submit_job(queued_spec(f"warm-{i}"))  # the connection, outside the clock
        except Exception as exc:
            errors.append(exc)
        ready.wait()
        go.wait()
        try:
            for n in range(per_thread[i]):
                started = time.perf_counter()
                client.submit_job(queued_spec(f"s{i}-{n}"))
                latencies[i].append(time.perf_counter() - started)
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
        for c in clients:
            c.close()
    if errors:
        raise RuntimeError(f"{len(errors)} submitter threads failed, e.g. {errors[0]!r}")
    flat = sorted(x for per in latencies for x in per)
    return {
        "client_threads": threads,
        "submissions": len(flat),
        "seconds": round(elapsed, 3),
        "submissions_per_s": round(len(flat) / elapsed, 1),
        "latency_ms_p50": round(1000 * flat[len(flat) // 2], 2),
        "latency_ms_p99": round(1000 * flat[min(len(flat) - 1, int(0.99 * len(flat)))], 2),
    }


def run_cost(root: Path, submissions: int, threads: int) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    for fsync in (False, True):
        name = "fsync_on" if fsync else "fsync_off"
        with cluster(root / name, fsync) as replicas:
            load_before = os.getloadavg()[0]
            modes[name] = {
                "concurrent": submissions_per_s(replicas, submissions, threads),
                "one_thread": submissions_per_s(replicas, max(1, submissions // 4), 1),
                "load_average_1m_before": round(load_before, 2),
                "load_average_1m_after": round(os.getloadavg()[0], 2),
            }
    off, on = modes["fsync_off"], modes["fsync_on"]
    return {
        "replicas": 3,
        "tls": True,
        "filesystem_of_data_dirs": _filesystem(root),
        **modes,
        "throughput_ratio_on_vs_off": round(
            on["concurrent"]["submissions_per_s"] / off["concurrent"]["submissions_per_s"], 3
        ),
        "one_thread_latency_ratio_on_vs_off": round(
            on["one_thread"]["latency_ms_p50"] / max(off["one_thread"]["latency_ms_p50"], 1e-6), 3
        ),
    }


def _filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path`` (from /proc/mounts; '' if unknown)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return ""
    best = ("", "")
    target = str(path.resolve())
    for fields in mounts:
        if len(fields) >= 3 and target.startswith(fields[1]) and len(fields[1]) > len(best[0]):
            best = (fields[1], fields[2])
    return best[1]


# -------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("cycles", "cost", "both"), default="both")
    p.add_argument("--cycles", type=int, default=100)
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compaction-entries", type=int, default=300)
    p.add_argument("--cost-submissions", type=int, default=2000)
    p.add_argument("--cost-threads", type=int, default=16)
    p.add_argument("--root", help="directory for the clusters (default: a temporary one)")
    p.add_argument("--out", help=f"cycles JSON (default {CYCLES_RESULT})")
    p.add_argument("--cost-out", help=f"cost JSON (default {COST_RESULT})")
    p.add_argument("--smoke", action="store_true", help="a tiny run; writes only to --out")
    args = p.parse_args(argv)
    if args.smoke:
        args.cycles, args.cost_submissions, args.cost_threads = 1, 40, 4
    out = args.out or (None if args.smoke else str(CYCLES_RESULT))
    cost_out = args.cost_out or (None if args.smoke else str(COST_RESULT))
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="durability-", dir=args.root) as tmp:
        root = Path(tmp)
        if args.part in ("cycles", "both"):
            cycles = run_cycles(
                root / "cycles",
                args.cycles,
                fsync=args.fsync,
                threads=args.threads,
                compaction_entries=args.compaction_entries,
                seed=args.seed,
            )
            report["cycles"] = cycles
            _write(out, cycles)
        if args.part in ("cost", "both"):
            cost = run_cost(root / "cost", args.cost_submissions, args.cost_threads)
            report["cost"] = cost
            _write(cost_out, cost)
    print(json.dumps(report, indent=2))
    lost = report.get("cycles", {}).get("acknowledged_lost", 0)
    return 1 if lost else 0


def _write(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
