"""What job history and the event stream cost: acknowledged submissions per second with
them on (the default) and off (``--no-history``: no apply observer, no SQLite file).

Clusters of 3 scheduler replicas on 127.0.0.1 with mutual TLS, no workers; the client is
an ordinary user with a bearer token (as in ``bench/security_cost.py``). Two workloads,
each measured on a cluster of its own per mode:

* **submit**: ``--threads`` client threads submit ``--submissions`` jobs in total, one
  call at a time; the jobs ask for GPUs no node has, so they wait. Every submission is an
  event (no history row).
* **submit_cancel**: the same, each submission followed by the cancellation of its job,
  so every job finishes: two events and one history row (SQLite write) per submission.
  The rate counts submissions (each with its cancel).

A third measurement needs no cluster and is not disturbed by other work on the machine:
**apply_path**, the time one replica spends applying a command (decode, apply, encode the
result: what every replica does for every log entry) with and without the history
observer (events into the ring, rows queued to the SQLite writer thread, whose writes are
included by a flush at the end), per workload, best of ``--apply-repeats`` runs of
``--apply-commands`` commands. Every replica pays it for every entry, so on one machine
running all three replicas the cluster-level slowdown it implies is about
3 x overhead per submission x the measured submissions/s / the machine's cores (when the
machine is CPU-bound), reported as ``implied_slowdown_percent``; and from CPU time alone
(``history_cpu_us_per_submission``: the applying thread's CPU time with history on less
that with it off, plus the writer thread's), the share of the three replicas' CPU time
per submission it adds, ``implied_cpu_slowdown_percent``.

Two figures that hold still when other work shares the machine, because they count CPU
time and wake-ups rather than rates: in each cluster round, the CPU seconds the three
replica processes used per 1,000 submissions (``replica_cpu_s_per_1000``, from
``/proc``); and in the apply path, the CPU time of the recorder's writer thread and the
number of times it was woken (voluntary context switches), per 1,000 submissions, both
for commands applied back to back and for batches arriving ``--apply-gap-ms`` apart (as
a cluster applies them: a committed entry of ``--apply-batch`` commands at a time).

A submission counts once a replica acknowledged it (committed). Each thread submits once
before the clock starts, so connection set-up is not part of the rate. The modes run
alternately, ``--rounds`` times each, on the same machine; the best rate of each mode is
compared (other work on a shared machine only ever slows a round down) and every round
is recorded with the load average around it.

Prints one JSON object and writes it to ``bench/results/history_cost.json`` (``--out``;
``--smoke`` runs a tiny version and writes only where ``--out`` says).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import wait_for
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.versioned import encode_command
from synapse_ha.core.model import JobSpec, NodeInfo, Resources
from synapse_ha.history.recorder import HistoryRecorder
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.raft.batch import frame
from synapse_ha.raft.replicated_state import ReplicatedState
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

RESULT = Path(__file__).resolve().parent / "results" / "history_cost.json"
MODES = ("history_off", "history_on")
WORKLOADS = ("submit", "submit_cancel")
USER = "bench"
UNLIMITED = {"submit_burst": 1_000_000, "submit_per_s": 1_000_000}


@contextlib.contextmanager
def cluster(root: Path, mode: str) -> Iterator[tuple[LocalReplicas, str]]:
    """3 TLS replicas, history on or off; yields them and the user's token."""
    extra = ["--log-level", "WARNING"]
    if mode == "history_off":
        extra.append("--no-history")
    launcher = Launcher(root / "logs")
    replicas = LocalReplicas(root / "cluster", extra_args=extra, launcher=launcher)
    try:
        replicas.start()
        replicas.serving_leader(timeout_s=60)
        with replicas.client(timeout_s=30.0) as admin:
            # The submission rate limit (a token bucket per user) would measure itself;
            # set before the token, so every replica that knows the token has it too.
            admin.set_limits(UNLIMITED)
            token = admin.create_token(USER).token
            wait_for("the token on every replica", lambda: _token_known(replicas, token), 30)
        yield replicas, token
    except Exception:
        print(replicas.logs(), file=sys.stderr)
        raise
    finally:
        launcher.close()


def _token_known(replicas: LocalReplicas, token: str) -> bool:
    with replicas.client(timeout_s=5.0, token=token) as client:
        client.list_jobs(limit=1)
    return True


def queued_spec(name: str) -> pb.JobSpec:
    """A job no node can hold: it waits in the queue until cancelled."""
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=10, memory_mib=16, gpu=64),
        shell_command="true",
        wait_for_nodes=True,
    )


def submissions_per_s(
    replicas: LocalReplicas, token: str, count: int, threads: int, cancel: bool
) -> dict[str, Any]:
    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    ready = threading.Barrier(threads + 1)
    go = threading.Event()
    acked = [0] * threads
    errors: list[BaseException] = []
    clients: list[ClusterClient] = [
        replicas.client(timeout_s=30.0, token=token) for _ in range(threads)
    ]

    def one(client: ClusterClient, name: str) -> None:
        job_id = client.submit_job(queued_spec(name)).job_id
        if cancel:
            client.cancel_job(job_id, "history_cost")

    def submitter(i: int) -> None:
        client = clients[i]
        try:
            one(client, f"warm-{i}")  # the connection, outside the clock
        except Exception as exc:  # reported below; the barrier must still be reached
            errors.append(exc)
        ready.wait()
        go.wait()
        if errors:
            return
        try:
            for n in range(per_thread[i]):
                one(client, f"s{i}-{n}")
                acked[i] += 1
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
        for client in clients:
            client.close()
    if errors:
        raise RuntimeError(f"{len(errors)} submitter threads failed, e.g. {errors[0]!r}")
    total = sum(acked)
    return {
        "submissions": total,
        "seconds": round(elapsed, 3),
        "submissions_per_s": round(total / elapsed, 1),
    }


def history_rows(replicas: LocalReplicas, expected: int) -> list[int]:
    """How many finished jobs each replica's history holds, once all hold ``expected``
    (bounded); proves the 'on' runs really wrote history."""

    def probe() -> list[int] | None:
        counts = []
        for r in replicas.replicas:
            with ClusterClient(
                [r.grpc], timeout_s=10.0, channel_factory=replicas.transport.channel
            ) as c:
                counts.append(len(c.list_history(limit=10_000)))
        return counts if all(n >= expected for n in counts) else None

    return wait_for("every replica's history", probe, timeout_s=120)


def replica_cpu_s(replicas: LocalReplicas) -> float:
    """User and system CPU seconds the replica processes used so far (all threads)."""
    ticks = 0
    for r in replicas.replicas:
        with open(f"/proc/{r.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def measure(root: Path, mode: str, workload: str, count: int, threads: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with cluster(root, mode) as (replicas, token):
        cancel = workload == "submit_cancel"
        cpu_before = replica_cpu_s(replicas)
        result = submissions_per_s(replicas, token, count, threads, cancel)
        cpu = replica_cpu_s(replicas) - cpu_before
        result["replica_cpu_s_per_1000"] = round(cpu / max(1, result["submissions"]) * 1000, 3)
        if mode == "history_on" and cancel:
            # every measured job and each thread's warm-up job
            result["history_rows_per_replica"] = history_rows(replicas, count + threads)
    result["load_average_1m"] = {"before": round(load_before, 2), "after": _load()}
    return result


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# ------------------------------------------------------------------- apply path


def _commands(count: int, cancel: bool) -> list[bytes]:
    spec = JobSpec(name="queued", replicas=1, resources=Resources(10, 16, 64), command=("true",))
    out = []
    for i in range(count):
        out.append(encode_command(cmd.SubmitJob(spec, f"req-{i}", 1_000 + i, owner=USER)))
        if cancel:
            out.append(encode_command(cmd.CancelJob(f"job-{i + 1:06d}", now_ms=1_000 + i)))
    return out


def _thread_cpu_s(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _thread_wakeups(thread: threading.Thread) -> int:
    """How often ``thread`` gave up the CPU to wait (its voluntary context switches)."""
    with open(f"/proc/self/task/{thread.native_id}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


def _apply(
    commands: list[bytes], history: bool, data_dir: Path, batch: int, gap_s: float
) -> dict[str, float]:
    """Apply ``commands`` as committed entries of ``batch`` commands, ``gap_s`` apart;
    the seconds it took (with the writer's flush), the applying thread's CPU seconds, and
    the writer thread's CPU seconds and wake-ups."""
    recorder = HistoryRecorder.in_dir(data_dir) if history else None
    machine = ReplicatedState(observer=recorder)
    node = NodeInfo("n1", "127.0.0.1:1", Resources(64_000, 262_144, 8))
    machine._apply_one(encode_command(cmd.RegisterNode(node, now_ms=1)))
    entries = [frame(commands[i : i + batch]) for i in range(0, len(commands), batch)]
    writer: threading.Thread | None = getattr(recorder, "_writer", None)
    try:
        cpu = _thread_cpu_s(writer) if writer is not None else 0.0
        wakeups = _thread_wakeups(writer) if writer is not None else 0
        start = time.perf_counter()
        applying = 0.0
        for entry in entries:
            began = time.thread_time()
            machine.apply_commands(entry, _doApply=True)
            applying += time.thread_time() - began
            if gap_s:
                time.sleep(gap_s)
        if recorder is not None and not recorder.flush(120.0):
            raise RuntimeError("the history writer did not catch up")
        seconds = time.perf_counter() - start - gap_s * len(entries)
        if writer is not None:
            cpu = _thread_cpu_s(writer) - cpu
            wakeups = _thread_wakeups(writer) - wakeups
        return {
            "seconds": seconds,
            "apply_cpu_s": applying,
            "writer_cpu_s": cpu,
            "writer_wakeups": wakeups,
        }
    finally:
        if recorder is not None:
            recorder.close()


def apply_path(count: int, repeats: int, batch: int, gap_ms: float) -> dict[str, Any]:
    # The collector settings of a running replica (programs/scheduler.py tune_gc): with
    # the interpreter's defaults, collections over the growing state dominate the timing.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    out: dict[str, Any] = {
        "gc_threshold": list(gc.get_threshold()),
        "commands_per_entry": batch,
        "paced_gap_ms": gap_ms,
    }
    per_1000 = 1000 / count
    for workload in WORKLOADS:
        commands = _commands(count, cancel=workload == "submit_cancel")
        best: dict[str, float] = {}
        apply_cpu: dict[str, float] = {}
        writer: dict[str, float] = {}
        by_mode: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(repeats):  # the modes alternate, as the load on the machine moves
            for mode in MODES:
                with tempfile.TemporaryDirectory(prefix="synapse-history-apply-") as tmp:
                    history = mode == "history_on"
                    by_mode[mode].append(_apply(commands, history, Path(tmp), batch, 0.0))
        for mode, runs in by_mode.items():
            best[mode] = min(r["seconds"] for r in runs)
            apply_cpu[mode] = min(r["apply_cpu_s"] for r in runs) * 1e6 / count
            if mode == "history_on":
                writer["cpu_ms_per_1000"] = min(r["writer_cpu_s"] for r in runs) * 1e3 * per_1000
                writer["wakeups_per_1000"] = min(r["writer_wakeups"] for r in runs) * per_1000
        with tempfile.TemporaryDirectory(prefix="synapse-history-apply-") as tmp:
            paced = _apply(commands, True, Path(tmp), batch, gap_ms / 1000)
        per_submission_us = {m: round(best[m] / count * 1e6, 1) for m in MODES}
        out[workload] = {
            "submissions": count,
            "commands": len(commands),
            "us_per_submission": per_submission_us,
            "overhead_us_per_submission": round(
                per_submission_us["history_on"] - per_submission_us["history_off"], 1
            ),
            "apply_thread_cpu_us_per_submission": {m: round(apply_cpu[m], 1) for m in MODES},
            # What history costs in CPU time per submission: on the applying thread and
            # on the writer thread (not disturbed by other work waiting for a core).
            "history_cpu_us_per_submission": round(
                apply_cpu["history_on"] - apply_cpu["history_off"] + writer["cpu_ms_per_1000"],
                1,
            ),
            "writer_cpu_ms_per_1000": round(writer["cpu_ms_per_1000"], 1),
            "writer_wakeups_per_1000": round(writer["wakeups_per_1000"], 1),
            "paced_writer_cpu_ms_per_1000": round(paced["writer_cpu_s"] * 1e3 * per_1000, 1),
            "paced_writer_wakeups_per_1000": round(paced["writer_wakeups"] * per_1000, 1),
        }
    return out


def run(count: int, threads: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {m: [] for m in MODES} for w in WORKLOADS
    }
    for _ in range(rounds):
        for workload in WORKLOADS:
            for mode in MODES:
                with tempfile.TemporaryDirectory(prefix=f"synapse-history-{mode}-") as tmp:
                    runs[workload][mode].append(measure(Path(tmp), mode, workload, count, threads))
    summary: dict[str, Any] = {}
    for workload, by_mode in runs.items():
        best = {m: max(r["submissions_per_s"] for r in by_mode[m]) for m in MODES}
        ratio = best["history_on"] / best["history_off"] if best["history_off"] else 0.0
        rates = {m: sorted(r["submissions_per_s"] for r in by_mode[m]) for m in MODES}
        summary[workload] = {
            "best_submissions_per_s": best,
            "median_submissions_per_s": {m: rates[m][len(rates[m]) // 2] for m in MODES},
            "history_on_over_off": round(ratio, 3),
            "slowdown_percent": round((1 - ratio) * 100, 1),
            "rounds": by_mode,
        }
    return {
        "benchmark": "history_cost",
        "replicas": 3,
        "transport": "mutual TLS, user bearer token",
        "client_threads": threads,
        "submissions_per_round": count,
        "rounds": rounds,
        "target": "history on lowers acknowledged submissions/s by at most 5%",
        **summary,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny run (seconds)")
    p.add_argument("--submissions", type=int, default=2000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--apply-commands", type=int, default=5000)
    p.add_argument("--apply-repeats", type=int, default=5)
    p.add_argument("--apply-batch", type=int, default=8, help="commands per applied entry")
    p.add_argument("--apply-gap-ms", type=float, default=4.0, help="between entries, paced")
    p.add_argument("--apply-only", action="store_true", help="the apply path only")
    p.add_argument("--out", type=Path, help=f"where to write the JSON (default {RESULT})")
    args = p.parse_args()
    if args.apply_only:
        applied = apply_path(
            args.apply_commands, args.apply_repeats, args.apply_batch, args.apply_gap_ms
        )
        print(json.dumps({"apply_path": applied}, indent=2))
        return 0
    if args.smoke:
        report = {"smoke": True, **run(100, 4, 1)}
        report["apply_path"] = apply_path(200, 1, args.apply_batch, args.apply_gap_ms)
        out = args.out
    else:
        report = {"smoke": False, **run(args.submissions, args.threads, args.rounds)}
        report["apply_path"] = apply_path(
            args.apply_commands, args.apply_repeats, args.apply_batch, args.apply_gap_ms
        )
        out = args.out or RESULT
    cores = os.cpu_count() or 1
    report["cores"] = cores
    for workload in WORKLOADS:
        applied = report["apply_path"][workload]
        overhead_s = applied["overhead_us_per_submission"] / 1e6
        rate = report[workload]["best_submissions_per_s"]["history_off"]
        applied["implied_slowdown_percent"] = round(100 * 3 * overhead_s * rate / cores, 2)
        # The same from CPU time alone: the three replicas' CPU per submission without
        # history (the least of the rounds) against what history adds to it.
        cluster_s = min(
            r["replica_cpu_s_per_1000"] / 1000 for r in report[workload]["rounds"]["history_off"]
        )
        added_s = 3 * applied["history_cpu_us_per_submission"] / 1e6
        applied["implied_cpu_slowdown_percent"] = round(
            100 * added_s / (cluster_s + added_s) if cluster_s + added_s > 0 else 0.0, 2
        )
    text = json.dumps(report, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
