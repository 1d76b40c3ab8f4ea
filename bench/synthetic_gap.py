"""What stands between our scheduler and FIFO first-fit's queueing delay on the synthetic
workload: the same jobs under both, one run per seed, then ours again with one cause
taken away at a time.

The synthetic workload (``synapse_ha.sim.workload.synthetic``) gives 30% of its jobs a
time limit and makes 30% of its multi-host gangs require one rack or block. FIFO
first-fit sees the jobs without topology (it cannot honour it) and reserves nothing, so
small jobs overtake big ones for ever. Ours honours the topology, lets a gang that fits
in one rack wait up to ``locality_wait_ms`` for one, and reserves capacity for the first
gang that cannot be placed: later gangs may use the reserved nodes only when their time
limit ends before the reservation starts (a job without a limit never ends, for this).

Runs, each on the same jobs as FIFO's run of its row:

* ``ours``: as shipped (``ours_no_locality_wait``: ``locality_wait_ms`` 0);
* ``ours_no_topology``: the jobs FIFO sees, no topology requirement (and
  ``ours_no_topology_no_locality_wait``);
* ``limited_fifo``, ``limited_ours``, ``limited_ours_no_topology_no_locality_wait``:
  the same workload with a time limit on every job (1.2-3x its duration, as the 30%
  have), so that every reservation knows when it starts and backfill can use its nodes.

For each run: mean queueing delay of all jobs, and the big gangs' (64 GPUs or more, a
rack's worth) p50, mean, p99 and max; for each ``ours*`` run its ratios to the FIFO run on the
same jobs, against the targets (mean ≤ 1.5x; big-gang p99 and max ≤ 1x).

Prints JSON (``--out`` also writes it); ``--smoke`` runs a tiny version in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import emit
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.sim.engine import simulate
from synapse_ha.sim.policies import FifoFirstFit, Ours, Policy
from synapse_ha.sim.workload import Workload, synthetic

TARGET_MEAN_RATIO = 1.5
TARGET_BIG_TAIL_RATIO = 1.0


def figures(workload: Workload, policy: Policy, config: ClusterConfig) -> dict[str, float]:
    """The delays of one run (seconds)."""
    metrics = simulate(workload, policy, config=config).metrics
    every, big = metrics["queue_delay_s"], metrics["queue_delay_big_gangs_s"]
    return {
        "mean": every["mean"],
        "big_gangs": big["n"],
        "big_p50": big["p50"],
        "big_mean": big["mean"],
        "big_p99": big["p99"],
        "big_max": big["max"],
    }


def ratios(ours: dict[str, float], fifo: dict[str, float]) -> dict[str, Any]:
    """Ours over FIFO on the same jobs, and whether each target is met."""
    out: dict[str, Any] = {}
    for key, target in (
        ("mean", TARGET_MEAN_RATIO),
        ("big_p99", TARGET_BIG_TAIL_RATIO),
        ("big_max", TARGET_BIG_TAIL_RATIO),
    ):
        ratio = round(ours[key] / fifo[key], 3) if fifo[key] else None
        out[key] = ratio
        out[f"{key}_met"] = ours[key] <= target * fifo[key]
    return out


def one_seed(seed: int, jobs: int, nodes: int) -> dict[str, Any]:
    base = ClusterConfig(retention_ms=0)
    no_wait = replace(base, locality_wait_ms=0)
    shipped = synthetic(seed=seed, jobs=jobs, nodes=nodes)
    limited = synthetic(seed=seed, jobs=jobs, nodes=nodes, time_limit_share=1.0)
    runs = {
        "fifo": figures(shipped, FifoFirstFit(), base),
        "ours": figures(shipped, Ours(), base),
        "ours_no_locality_wait": figures(shipped, Ours(), no_wait),
        "ours_no_topology": figures(shipped.without_topology(), Ours(), base),
        "ours_no_topology_no_locality_wait": figures(shipped.without_topology(), Ours(), no_wait),
        "limited_fifo": figures(limited, FifoFirstFit(), base),
        "limited_ours": figures(limited, Ours(), base),
        "limited_ours_no_topology_no_locality_wait": figures(
            limited.without_topology(), Ours(), no_wait
        ),
    }
    over_fifo = {
        name: ratios(run, runs["limited_fifo" if name.startswith("limited") else "fifo"])
        for name, run in runs.items()
        if "ours" in name
    }
    return {"runs": runs, "over_fifo": over_fifo}


def summary(per_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per ``ours*`` run: in how many seeds each target is met, and the mean ratios."""
    seeds = list(per_seed.values())
    out: dict[str, Any] = {}
    for name in seeds[0]["over_fifo"]:
        rows = [s["over_fifo"][name] for s in seeds]
        out[name] = {
            **{
                f"{key}_met_in_seeds": f"{sum(r[f'{key}_met'] for r in rows)}/{len(rows)}"
                for key in ("mean", "big_p99", "big_max")
            },
            "mean_ratio": round(statistics.fmean(r["mean"] for r in rows if r["mean"]), 3),
        }
    return out


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    """The options that size the synthetic runs, with ``--out``."""
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--out", help="where the JSON goes too")


def workload_sizes(args: argparse.Namespace) -> tuple[int, int, int]:
    """Seeds, jobs and hosts: the options', or the smoke run's."""
    return (2, 120, 32) if args.smoke else (args.seeds, args.jobs, args.nodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_options(parser)
    args = parser.parse_args(argv)
    seeds, jobs, nodes = workload_sizes(args)
    per_seed = {str(seed): one_seed(seed, jobs, nodes) for seed in range(1, seeds + 1)}
    report = {
        "benchmark": "synthetic_gap",
        "workload": f"synthetic, {jobs} jobs on {nodes} x 8 GPUs, seeds 1-{seeds}",
        "targets": {
            "mean": f"<= {TARGET_MEAN_RATIO}x FIFO first-fit",
            "big_p99": "<= FIFO first-fit",
            "big_max": "<= FIFO first-fit",
        },
        "per_seed": per_seed,
        "summary": summary(per_seed),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
