"""Incremental planning benchmark: what a leader's pass costs when little changed.

Setup (the placement benchmark's cluster): 10,000 nodes of 8 GPUs, half of the GPUs held
by running gangs, then 20,000 pending gangs of the placement benchmark's shapes. The
state is driven as the leader drives it: commands applied through ``apply_tracked``,
snapshots from a ``SnapshotBuilder``, one :class:`IncrementalPlanner` kept throughout,
each plan's ``BindPlan`` applied, until a pass changes nothing (the cluster is as full
as the queue can make it and every reason is recorded). Then, with the clock 500 ms on
each time:

* ``unchanged_ms``: a pass with nothing changed (but the reasons the previous pass
  recorded);
* ``one_submission_ms``: a pass after one more submission (a gang that comes last in
  the queue), its snapshot taken first (``snapshot_ms``);
* ``full_pass_ms``: the same pass done in full (``schedule`` with the kept capacity
  table), for comparison.

``--timed`` gives the running and pending gangs time limits as the placement benchmark
does (half of them): the head-of-line reservation then has a start time, the gangs
waiting for it say how far off that is, and a kept plan has those reasons brought up to
date; a plan stands only until the reservation starts or a gang may no longer backfill
before it (``plans_by_kind`` says how often a full pass was needed).

The collector is set as the scheduler program sets it once its state is loaded
(``gc.freeze()``, a larger threshold). ``cold_pass_s``: the placement benchmark's pass
(5,000 pending gangs) with the capacity table built from scratch, as a new leader's
first pass. ``--profile`` prints its cProfile to stderr. Prints JSON; ``--smoke`` runs a
tiny version in seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from placement import build_cluster, gang_spec, make_busy

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.scheduler import CapacityCache, IncrementalPlanner, schedule
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked

TARGETS = {"unchanged_ms": 5.0, "one_submission_ms": 10.0, "cold_pass_s": 0.5}


class Leader:
    """A live state, its snapshots and the planner, as a leader keeps them."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.builder = SnapshotBuilder()
        self.planner = IncrementalPlanner()
        self.now = 10_000

    def do(self, command: c.Command) -> c.Result:
        return apply_tracked(self.state, command, self.builder.changes)

    def settle(self, limit: int = 20) -> int:
        """Passes, each plan applied, until one binds and preempts nothing (and that
        one's reasons applied); how many it took."""
        for passes in range(1, limit + 1):
            self.now += 500
            plan = self.planner.plan(self.builder.take(self.state), self.now)
            command = plan.command(self.now)
            if command is not None:
                self.do(command)
            if not plan.placements and not plan.preemptions:
                return passes
        raise AssertionError(f"no steady state after {limit} passes")


def _as_the_server_runs() -> None:
    """The collector as ``synapse-scheduler`` sets it once the state is loaded."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def steady(
    size: tuple[int, int, int, int], pending: int, rounds: int, seed: int, timed: bool
) -> dict[str, object]:
    rng = random.Random(seed)
    state = build_cluster(*size)
    make_busy(state, rng, 0.5, timed=timed)
    leader = Leader(state)
    for i in range(pending):
        spec = gang_spec(rng, f"g-{i}", timed and rng.random() < 0.5)
        leader.do(c.SubmitJob(spec, f"g-{i}", leader.now))
    _as_the_server_runs()
    started = time.perf_counter()
    passes = leader.settle()
    settle_s = time.perf_counter() - started
    counts_before = dict(leader.planner.counts)
    unchanged: list[float] = []
    submission: list[float] = []
    snapshots: list[float] = []
    full: list[float] = []
    cache = CapacityCache()
    for r in range(rounds):
        leader.now += 500
        snap = leader.builder.take(leader.state)
        t0 = time.perf_counter()
        leader.planner.plan(snap, leader.now)
        unchanged.append(time.perf_counter() - t0)
        spec = replace(gang_spec(rng, f"late-{r}", False), priority=0)
        leader.do(c.SubmitJob(spec, f"late-{r}", leader.now))
        leader.now += 500
        t0 = time.perf_counter()
        snap = leader.builder.take(leader.state)
        t1 = time.perf_counter()
        plan = leader.planner.plan(snap, leader.now)
        t2 = time.perf_counter()
        snapshots.append(t1 - t0)
        submission.append(t2 - t1)
        schedule(snap, leader.now, cache=cache)  # the cache warm, as the leader's is
        t0 = time.perf_counter()
        assert schedule(snap, leader.now, cache=cache) == plan
        full.append(time.perf_counter() - t0)
        command = plan.command(leader.now)
        if command is not None:
            leader.do(command)
    counts = dict(leader.planner.counts)
    during = {k: v - counts_before.get(k, 0) for k, v in counts.items()}
    return {
        "pending_gangs": sum(1 for j in leader.state.jobs.values() if j.state.value == "PENDING"),
        "passes_to_settle": passes,
        "settle_s": round(settle_s, 3),
        "unchanged_ms": _ms(statistics.median(unchanged)),
        "unchanged_ms_max": _ms(max(unchanged)),
        "one_submission_ms": _ms(statistics.median(submission)),
        "one_submission_ms_max": _ms(max(submission)),
        "snapshot_ms": _ms(statistics.median(snapshots)),
        "full_pass_ms": _ms(statistics.median(full)),
        "plans_by_kind": {k: v for k, v in sorted(during.items()) if v},
    }


def cold(size: tuple[int, int, int, int], gangs: int, seed: int, profile: bool) -> float:
    """The placement benchmark's pass with its table built from scratch, in seconds."""
    rng = random.Random(seed)
    state = build_cluster(*size)
    make_busy(state, rng, 0.5)
    for i in range(gangs):
        apply(state, c.SubmitJob(gang_spec(rng, f"g-{i}", rng.random() < 0.5), f"g-{i}", 1))
    _as_the_server_runs()
    profiler = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    schedule(state, 1, cache=CapacityCache())
    if profiler is not None:
        profiler.disable()
    took = time.perf_counter() - t0
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a tiny cluster, seconds long")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--timed", action="store_true", help="gangs with time limits")
    parser.add_argument("--profile", action="store_true", help="cProfile the cold pass")
    args = parser.parse_args()
    size = (1, 2, 3, 4) if args.smoke else (5, 10, 25, 8)
    pending = 200 if args.smoke else 20_000
    gangs = 60 if args.smoke else 5_000
    rounds = 3 if args.smoke else args.rounds
    result: dict[str, object] = {
        "benchmark": "incremental",
        "nodes": size[0] * size[1] * size[2] * size[3],
        "timed": args.timed,
        **steady(size, pending, rounds, args.seed, args.timed),
        "cold_pass_gangs": gangs,
        "cold_pass_s": round(cold(size, gangs, args.seed, args.profile), 3),
        "targets": TARGETS,
    }
    result["meets_targets"] = all(
        float(result[name]) <= limit  # type: ignore[arg-type]
        for name, limit in TARGETS.items()
        if not args.timed or name == "cold_pass_s"
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
