"""How long planning and ``explain`` hold the replica's apply lock.

The replica applies every committed command under one lock; whatever else holds it stops
the log (and pysyncobj's answers to its peers). Planning and reads work on copy-on-write
snapshots: taking one holds the lock while the record dictionaries are copied (no record
is), and a command copies a record still shared with a snapshot before it changes it.

Setup (the placement benchmark's cluster): 10,000 nodes of 8 GPUs, half of the GPUs held
by running gangs, 5,000 pending gangs. Then, as the leader loop does, ``passes`` times:
take a snapshot under the lock, plan on it without the lock, apply the bind plan and a
round of member reports under the lock (as the log would), and answer ``explains``
ExplainJob calls, each from a snapshot and the last pass's plan.

Prints JSON: the longest and the p99 lock hold per pass and per explain (target <= 5 ms),
the longest hold by an applied command (its own work and the records it copied:
``apply_lock_hold_ms_max``, the first bind of hundreds of gangs being the longest),
what the same work cost outside the lock (a whole pass; an explain), and, for comparison,
``lock_held_by_a_full_pass_ms``: what a pass held when it planned under the lock.
``--smoke`` runs a tiny version in seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from placement import build_cluster, gang_spec, make_busy

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.scheduler import CapacityCache, Plan, explain, schedule
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked
from synapse_ha.programs.scheduler import tune_gc

copied: list[int] = []  # records the commands copied between two snapshots
applied: list[float] = []  # how long each applied command held the lock (seconds)


class Replica:
    """The live state, its apply lock and its snapshots, as the Raft replica has them."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.lock = threading.Lock()
        self.snapshots = SnapshotBuilder()

    def apply(self, command: c.Command) -> c.Result:
        with self.lock:
            started = time.perf_counter()
            result = apply_tracked(self.state, command, self.snapshots.changes)
            applied.append(time.perf_counter() - started)
            return result

    def snapshot(self) -> tuple[ClusterState, float]:
        """A snapshot and how long the lock was held to take it (seconds)."""
        with self.lock:
            changes = self.snapshots.changes
            copied.append(len(changes.own_nodes) + len(changes.own_jobs))
            started = time.perf_counter()
            snap = self.snapshots.take(self.state)
            return snap, time.perf_counter() - started


def _reports(state: ClusterState, plan_job_ids: list[str], now: int) -> list[c.ReportMembers]:
    """Every member of the newly bound gangs reports it started, one report per node."""
    events: dict[str, list[c.MemberEvent]] = {}
    for job_id in plan_job_ids:
        job = state.jobs[job_id]
        if job.attempt is None or job.state is not JobState.SCHEDULED:
            continue
        for m in job.attempt.members:
            events.setdefault(m.node_id, []).append(
                c.MemberEvent(job_id, job.attempt.fencing_token, m.rank, c.MemberEventKind.STARTED)
            )
    return [c.ReportMembers(n, tuple(evs), 0, now) for n, evs in sorted(events.items())]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def run(
    size: tuple[int, int, int, int], gangs: int, passes: int, explains: int, freeze: bool
) -> dict[str, object]:
    rng = random.Random(1)
    state = build_cluster(*size)
    make_busy(state, rng, 0.5)
    for i in range(gangs):
        spec = gang_spec(rng, f"g-{i}", rng.random() < 0.5)
        assert apply(state, c.SubmitJob(spec, f"g-{i}", 1)).ok
    replica = Replica(state)
    # The first snapshot after start (or a restored dump) copies every record once.
    _, first_snapshot_s = replica.snapshot()
    if freeze:
        tune_gc()

    # For comparison: a pass planned on the live state holds the lock all along.
    started = time.perf_counter()
    with replica.lock:
        schedule(replica.state, 1)
    full_pass_under_lock_s = time.perf_counter() - started

    cache = CapacityCache()
    pass_holds: list[float] = []
    pass_costs: list[float] = []
    explain_holds: list[float] = []
    explain_costs: list[float] = []
    last_plan: Plan | None = None
    bound = 0
    now = 2
    for _ in range(passes):
        snap, held = replica.snapshot()
        pass_holds.append(held)
        started = time.perf_counter()
        last_plan = schedule(snap, now, cache=cache)
        pass_costs.append(time.perf_counter() - started)
        command = last_plan.command(now)
        if command is not None:
            result = replica.apply(command)
            bound += len(result.bound)
            for report in _reports(replica.state, list(result.bound), now + 1):
                replica.apply(report)
        pending = [j for j in snap.jobs.values() if j.state is JobState.PENDING]
        for job in rng.sample(pending, min(explains, len(pending))):
            view, held = replica.snapshot()
            explain_holds.append(held)
            started = time.perf_counter()
            explain(view, job.job_id, now, last_plan)
            explain_costs.append(time.perf_counter() - started)
        now += 1_000
        # Some running gangs finish between passes, so passes have work to do.
        running = sorted(j.job_id for j in replica.state.jobs.values() if j.state.holds_resources)
        for job_id in rng.sample(running, min(20, len(running))):
            attempt = replica.state.jobs[job_id].attempt
            assert attempt is not None
            per_node: dict[str, list[c.MemberEvent]] = {}
            for m in attempt.members:
                per_node.setdefault(m.node_id, []).append(
                    c.MemberEvent(
                        job_id, attempt.fencing_token, m.rank, c.MemberEventKind.EXITED, 0
                    )
                )
            for node_id, evs in sorted(per_node.items()):
                replica.apply(c.ReportMembers(node_id, tuple(evs), 0, now))

    return {
        "benchmark": "lock_hold",
        "nodes": len(state.nodes),
        "pending_gangs": gangs,
        "passes": passes,
        "gangs_bound": bound,
        "explain_calls": len(explain_holds),
        "pass_lock_hold_ms_max": _ms(max(pass_holds)),
        "pass_lock_hold_ms_p99": _ms(_p99(pass_holds)),
        "pass_lock_hold_ms_median": _ms(statistics.median(pass_holds)),
        "explain_lock_hold_ms_max": _ms(max(explain_holds)),
        "explain_lock_hold_ms_p99": _ms(_p99(explain_holds)),
        "first_snapshot_ms": _ms(first_snapshot_s),
        "pass_without_lock_ms_median": _ms(statistics.median(pass_costs)),
        "explain_without_lock_ms_max": _ms(max(explain_costs)),
        "lock_held_by_a_full_pass_ms": _ms(full_pass_under_lock_s),
        "gc_tuned_as_the_replica": freeze,
        "apply_lock_hold_ms_max": _ms(max(applied)),
        "apply_lock_hold_ms_p99": _ms(_p99(applied)),
        "records_copied_between_snapshots_max": max(copied),
        "targets": {"pass_lock_hold_ms_max": 5, "explain_lock_hold_ms_max": 5},
        "note": "a snapshot copies no record; a command copies the shared records it "
        "changes, once between two snapshots",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a tiny cluster, seconds long")
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the garbage collector as Python sets it (the replica tunes it)",
    )
    args = parser.parse_args()
    if args.smoke:
        result = run((2, 2, 3, 4), 60, passes=3, explains=5, freeze=not args.no_freeze)
    else:
        result = run((5, 10, 25, 8), 5000, passes=20, explains=50, freeze=not args.no_freeze)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
