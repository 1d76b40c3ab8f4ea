"""The synthetic workload against FIFO first-fit under variants of the head-of-line
reservation: what the issue's targets for that workload (mean delay at most 1.2x FIFO
first-fit's, the longest wait of a gang of 64 GPUs or more no longer than FIFO's, in
every seed) ask of the reservation rule.

DESIGN §3 gives the first gang that cannot be placed a reservation, and no job without a
time limit may use reserved capacity. 70 % of the synthetic jobs have no limit, so a
reservation holds its nodes until everything on them has ended. Each variant is the
shipped planner with one rule changed, for the length of its own runs only (the change
is undone after them); none of them ships:

* ``shipped``: the planner as it is;
* ``none``: no gang reserves (FIFO first-fit's rule, and Kubernetes' default
  scheduler's);
* ``after:S``: a gang reserves only once it has waited ``S`` seconds since its
  submission (a starvation threshold, as LSF's and Volcano's reservations have);
* ``cheapest``: a reservation without a start (one that needs a gang without a time
  limit to end) is placed on the cheapest hosts to drain, as a drain of the
  defragmentation is (``synapse_ha/core/scheduler/defrag.py``), instead of on the best
  fit of the empty cluster; no other drain is made;
* ``cheapest+after:S``: both.

``--no-topology`` runs the jobs without their topology (as FIFO sees them) and without
the locality wait, so that what is left between the two is the reservation alone.

Prints JSON (``--out`` also writes it): per seed, FIFO's and each variant's mean delay,
big-gang maximum, the passes that kept a reservation, and the ratios to FIFO with the
targets met; a summary per variant. ``--smoke`` runs a tiny version in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import emit
from bench.synthetic_gap import add_workload_options, workload_sizes
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.commands import BindPlan
from synapse_ha.core.model import ClusterState
from synapse_ha.core.scheduler import defrag, passes, reservation, schedule
from synapse_ha.sim.engine import simulate
from synapse_ha.sim.policies import FifoFirstFit, Ours
from synapse_ha.sim.workload import Workload, synthetic

TARGET_MEAN_RATIO = 1.2
VARIANTS = ("shipped", "none", "after:3600", "cheapest", "cheapest+after:3600")


class Counted(Ours):
    """Ours, counting the passes whose plan kept a reservation."""

    def __init__(self) -> None:
        super().__init__()
        self.reserving_passes = 0

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None:
        made = schedule(state, now_ms, cache=self.cache)
        self.reserving_passes += bool(made.reservations)
        self.wake_ms = made.wake_ms
        self.preempts = tuple(made.preempt_commands(now_ms))
        self.shrinks = tuple(made.shrink_commands())
        return made.command(now_ms)


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _reserve_after(after_ms: int) -> Callable[..., None]:
    """The pass's ``_wait``, with no reservation for a gang younger than ``after_ms``."""
    shipped_wait = passes._Pass._wait

    def wait(self: Any, gang: Any, depths: list[int]) -> None:
        held = self.reserved
        if self.now_ms - gang.job.submitted_at_ms >= after_ms:
            shipped_wait(self, gang, depths)
            return
        limit, held.limit = held.limit, len(held.made)  # full for this gang
        try:
            shipped_wait(self, gang, depths)
        finally:
            held.limit = limit

    return wait


def _own_untimed_only() -> Callable[..., None]:
    """The defragmentation's ``consider`` for a gang's own reservation without a start
    only: no drain for scattered free GPUs."""
    shipped_consider = defrag.Defrag.consider

    def consider(
        self: Any, gang: Any, depths: list[int], restricted: Any, view: Any, plan: Any
    ) -> None:
        made = plan.reservations[-1] if plan.reservations else None
        if made is None or made.job_id != gang.job.job_id or made.start_ms is not None:
            return
        shipped_consider(self, gang, depths, restricted, view, plan)

    return consider


@contextlib.contextmanager
def variant(name: str, config: ClusterConfig) -> Iterator[ClusterConfig]:
    """The planner changed as ``name`` says while the block runs, and the configuration
    its runs use."""
    with contextlib.ExitStack() as stack:
        for part in name.split("+"):
            if part == "shipped":
                continue
            if part == "none":
                stack.enter_context(patched(reservation.Reserved, "full", lambda self: True))
            elif part.startswith("after:"):
                after_ms = int(float(part.removeprefix("after:")) * 1000)
                stack.enter_context(patched(passes._Pass, "_wait", _reserve_after(after_ms)))
            elif part == "cheapest":
                stack.enter_context(patched(defrag.Defrag, "consider", _own_untimed_only()))
                config = replace(config, defrag_share_pct=100)
            else:
                raise ValueError(f"unknown variant {part!r} (of {', '.join(VARIANTS)})")
        yield config


def figures(
    workload: Workload, policy: Ours | FifoFirstFit, config: ClusterConfig
) -> dict[str, Any]:
    metrics = simulate(workload, policy, config=config).metrics
    big = metrics["queue_delay_big_gangs_s"]
    out: dict[str, Any] = {"mean": metrics["queue_delay_s"]["mean"], "big_max": big["max"]}
    out["big_gangs"] = big["n"]
    if isinstance(policy, Counted):
        out["reserving_passes"] = policy.reserving_passes
    return out


def one_seed(
    seed: int, jobs: int, nodes: int, variants: list[str], topology: bool = True
) -> dict[str, Any]:
    base = ClusterConfig(retention_ms=0)
    workload = synthetic(seed=seed, jobs=jobs, nodes=nodes)
    if not topology:
        workload, base = workload.without_topology(), replace(base, locality_wait_ms=0)
    fifo = figures(workload, FifoFirstFit(), base)
    runs: dict[str, Any] = {}
    for name in variants:
        with variant(name, base) as config:
            run = figures(workload, Counted(), config)
        run["mean_over_fifo"] = round(run["mean"] / fifo["mean"], 3) if fifo["mean"] else None
        run["big_max_over_fifo"] = (
            round(run["big_max"] / fifo["big_max"], 3) if fifo["big_max"] else None
        )
        run["mean_met"] = run["mean"] <= TARGET_MEAN_RATIO * fifo["mean"]
        run["big_max_met"] = run["big_max"] <= fifo["big_max"]
        runs[name] = run
    return {"fifo": fifo, "variants": runs}


def summary(per_seed: dict[str, dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    seeds = list(per_seed.values())
    out = {}
    for name in variants:
        rows = [s["variants"][name] for s in seeds]
        ratios = [r["mean_over_fifo"] for r in rows if r["mean_over_fifo"] is not None]
        out[name] = {
            "mean_met_in_seeds": f"{sum(r['mean_met'] for r in rows)}/{len(rows)}",
            "big_max_met_in_seeds": f"{sum(r['big_max_met'] for r in rows)}/{len(rows)}",
            "both_met_in_seeds": (
                f"{sum(r['mean_met'] and r['big_max_met'] for r in rows)}/{len(rows)}"
            ),
            "mean_over_fifo": round(statistics.fmean(ratios), 3) if ratios else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_options(parser)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--no-topology", action="store_true", help="jobs without topology")
    args = parser.parse_args(argv)
    seeds, jobs, nodes = workload_sizes(args)
    variants = [v for v in args.variants.split(",") if v]
    for name in variants:  # an unknown name fails before any run
        with variant(name, ClusterConfig()):
            pass
    topology = not args.no_topology
    per_seed = {str(s): one_seed(s, jobs, nodes, variants, topology) for s in range(1, seeds + 1)}
    emit(
        {
            "benchmark": "reservation_variants",
            "workload": f"synthetic, {jobs} jobs on {nodes} x 8 GPUs, seeds 1-{seeds}"
            + ("" if topology else ", without topology or locality wait"),
            "targets": {
                "mean": f"<= {TARGET_MEAN_RATIO}x FIFO first-fit",
                "big_max": "<= FIFO first-fit",
            },
            "per_seed": per_seed,
            "summary": summary(per_seed, variants),
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
