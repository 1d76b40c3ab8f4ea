"""Snapshot stall benchmark: how long a replica's Raft thread stops while a large state is
written to its snapshot file.

pysyncobj's thread ticks every few milliseconds (heartbeats to followers, elections, log
replication). This benchmark builds a state in process (``--nodes`` machines and
``--jobs`` one-member jobs, as ``bench/memory.py`` does), runs a stand-in for that
thread (sleep ``--tick-ms``, note the time) and writes the snapshot twice:

* ``thread``: encoding and writing on a thread of this process, the way replicas wrote
  snapshots before they forked a writer;
* ``fork``: :class:`synapse_ha.raft.snapshot_file.ForkedWrite`, as replicas do now.

It also times one full cyclic garbage collection with the state in memory (any thread
that allocates can trigger one, and it holds the interpreter lock throughout) and again
after ``gc.freeze()``.

For each writer it reports the write's wall time, the longest gap between two ticks and the
count of gaps over 100 ms and over the default election timeout's lower bound (a gap
that long lets followers elect another leader), and for the fork the time the fork call
itself took. Prints one JSON object (``--out`` also writes it); ``--smoke`` runs a tiny
state in seconds. Target: no gap over 100 ms with the fork at 10,000 nodes and 50,000
jobs.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.memory import build_state
from bench.report import emit
from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import full_copy
from synapse_ha.raft.replica import RaftTiming
from synapse_ha.raft.snapshot_file import ForkedWrite, replace_snapshot

ENTRIES = ((b"newest", 2, 1), (b"older", 1, 1))


class Ticker(threading.Thread):
    """Sleeps ``tick_s`` in a loop and keeps the gaps between its wake-ups."""

    def __init__(self, tick_s: float) -> None:
        super().__init__(name="ticker", daemon=True)
        self.tick_s = tick_s
        self.stop = threading.Event()
        self.gaps: list[float] = []

    def run(self) -> None:
        last = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(self.tick_s)
            now = time.perf_counter()
            self.gaps.append(now - last)
            last = now


def _thread_write(path: str, state: ClusterState) -> float:
    started = time.perf_counter()
    writer = threading.Thread(target=replace_snapshot, args=(path, state, ENTRIES))
    writer.start()
    writer.join()
    return time.perf_counter() - started


def _fork_write(path: str, state: ClusterState) -> tuple[float, float]:
    write = ForkedWrite(path, state, ENTRIES)
    if not write.wait(600):
        raise RuntimeError(f"the forked writer failed (exit code {write.exit_code})")
    return write.seconds or 0.0, write.fork_seconds


def measure(state: ClusterState, root: Path, tick_s: float, mode: str) -> dict[str, Any]:
    election_s = RaftTiming().election_min_s
    ticker = Ticker(tick_s)
    ticker.start()
    time.sleep(0.5)  # a baseline of ordinary ticks
    out: dict[str, Any] = {}
    path = str(root / f"{mode}.dump")
    if mode == "thread":
        out["write_s"] = round(_thread_write(path, state), 3)
    else:
        seconds, fork_seconds = _fork_write(path, state)
        out["write_s"] = round(seconds, 3)
        out["fork_ms"] = round(fork_seconds * 1000, 2)
    time.sleep(0.5)
    ticker.stop.set()
    ticker.join()
    gaps = sorted(ticker.gaps)
    out["file_mb"] = round(Path(path).stat().st_size / 2**20, 2)
    out["ticks"] = len(gaps)
    out["longest_gap_ms"] = round(gaps[-1] * 1000, 1)
    out["gap_p99_ms"] = round(gaps[int(len(gaps) * 0.99)] * 1000, 1)
    out["gaps_over_100ms"] = sum(1 for g in gaps if g > 0.1)
    out[f"gaps_over_election_min_{election_s:g}s"] = sum(1 for g in gaps if g > election_s)
    return out


def _full_collection_ms() -> float:
    started = time.perf_counter()
    gc.collect()
    return round((time.perf_counter() - started) * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny state, in seconds")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--tick-ms", type=float, default=5.0)
    parser.add_argument("--full", action="store_true", help="the full encoding, not compact")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    nodes, jobs = (50, 200) if args.smoke else (args.nodes, args.jobs)
    built = time.perf_counter()
    state = build_state(nodes, jobs)
    state.config = replace(state.config, compact_state=not args.full)
    state = full_copy(state)  # what the replica hands its writer: a snapshot of the state
    report: dict[str, Any] = {
        "smoke": args.smoke,
        "nodes": nodes,
        "jobs": jobs,
        "compact_state": not args.full,
        "tick_ms": args.tick_ms,
        "build_s": round(time.perf_counter() - built, 1),
    }
    with tempfile.TemporaryDirectory(prefix="synapse-stall-") as tmp:
        for mode in ("thread", "fork"):
            report[mode] = measure(state, Path(tmp), args.tick_ms / 1000, mode)
    report["full_collection_ms"] = _full_collection_ms()
    gc.freeze()
    report["full_collection_after_freeze_ms"] = _full_collection_ms()
    gc.unfreeze()
    report["target"] = {"fork_longest_gap_ms": 100}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
