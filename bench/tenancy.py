"""Multi-tenancy benchmark: one multi-tenant workload per seed under the three preemption
modes (off, blind, topology), side by side, through the real scheduler and ``apply``.

Workload: ``synapse_ha.sim.tenants.multi_tenant`` (four queues of 64 GPUs in one
cohort on 32 x 8 GPUs: steady, bursty, steady with some whole-rack gangs, and one idle
queue that arrives after two hours with whole-rack gangs, the reclaim case). Every job
marks a checkpoint at its own interval (log-uniform 10-60 min); a victim loses its GPUs x
the time from its attempt's mark (or its bind) to its stop, and resumes from its mark.
Victims take the whole 30 s grace to stop; passes run every 0.5 s as the leader's do.

Each of ``--seeds`` seeds (1, 2, ...) is its own workload, run under every mode. The
report holds, per seed, the headline figures per mode and which targets were met, and
per mode each figure's mean, standard deviation, minimum and maximum over the seeds.

``--tree`` runs the same jobs with the queues in a cohort tree: two organisations below
``research`` (team-a and team-c in org-1, team-b and team-d in org-2), so that a reclaim
takes from the sibling team's borrowing before the other organisation's; it writes
bench/results/tenancy_tree.json.

``--heavy`` runs the long, heavy-tailed workload instead (``heavy_tailed``: eight queues
of 32 GPUs with unequal demand, 1.3x the GPUs in all, jobs of median 10 h capped at a
week, arrivals for ``--weeks``, 3 by default, on 3 seeds by default) and writes
bench/results/tenancy_heavy.json.

Prints JSON to stdout, writes it to bench/results/tenancy.json, and prints a table per
seed and the summary to stderr. ``--smoke`` runs a small version in a few seconds so the
benchmark cannot rot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.sim.tenancy import report, run_modes, table
from synapse_ha.sim.tenants import heavy_tailed, multi_tenant

RESULTS = Path(__file__).resolve().parent / "results" / "tenancy.json"
HEAVY_RESULTS = RESULTS.with_name("tenancy_heavy.json")
TREE_RESULTS = RESULTS.with_name("tenancy_tree.json")
ORGANISATIONS = 2  # --tree

# The figures summarised over the seeds: name -> where it is in a mode's headline figures.
FIGURES: dict[str, tuple[str, ...]] = {
    "gpu_allocation": ("gpu_allocation",),
    "jain_backlogged": ("jain_backlogged",),
    "gpu_hours_lost": ("gpu_hours_lost",),
    "gpu_hours_lost_per_preemptor_placed": ("gpu_hours_lost_per_preemptor_placed",),
    "gpu_hours_lost_without_marks": ("gpu_hours_lost_without_marks",),
    "preemptions": ("preemptions",),
    "preempt_commands": ("preempt_commands",),
    "preemptors_placed": ("preemptor_wait_s", "n"),
    "preemptor_wait_mean_s": ("preemptor_wait_s", "mean"),
    "preemptors_with_topology_in_one_rack": ("preemptors_with_topology_in_one_rack",),
    "quota_back_p95_s": ("quota_back_s", "p95"),
    "quota_back_max_s": ("quota_back_s", "max"),
    "quota_back_reclaimable_p95_s": ("quota_back_reclaimable_s", "p95"),
    "quota_back_reclaimable_max_s": ("quota_back_reclaimable_s", "max"),
    "queue_delay_p50_s": ("queue_delay_s", "all", "p50"),
    "queue_delay_mean_s": ("queue_delay_s", "all", "mean"),
    "checkpoint_marks": ("checkpoint_marks",),
}


def _figure(figures: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = figures
    for key in path:
        value = value[key]
    return value


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, standard deviation (0 for one value), minimum and maximum of ``values``,
    with ``n`` the seeds that had one (a figure can be undefined for a seed: None)."""
    if not values:
        return {"n": 0, "mean": None, "stdev": None, "min": None, "max": None}
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 4),
        "stdev": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def run_seed(
    seed: int, hours: float, hosts: int, heavy: bool = False, organisations: int = 0
) -> dict[str, Any]:
    """One seed's workload under every mode: its headline figures and targets."""
    workload = (
        heavy_tailed(seed=seed, weeks=hours / 168, hosts=hosts)
        if heavy
        else multi_tenant(seed=seed, hours=hours, hosts=hosts, organisations=organisations)
    )
    results = run_modes(workload)
    print(f"seed {seed}: {len(workload.jobs)} jobs", file=sys.stderr)
    print(table(results), file=sys.stderr)
    out = report(workload, results)
    return {
        "workload": out["workload"],
        "modes": {
            mode: {name: _figure(figures, path) for name, path in FIGURES.items()}
            for mode, figures in out["modes"].items()
        },
        "targets": out["targets"],
    }


def summary(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per mode, each figure's spread over the seeds; per target, the seeds that met it."""
    runs = list(per_seed.values())
    modes = {
        mode: {
            name: spread(
                [r["modes"][mode][name] for r in runs if r["modes"][mode][name] is not None]
            )
            for name in FIGURES
        }
        for mode in runs[0]["modes"]
    }
    met = {
        name: f"{sum(1 for r in runs if r['targets'][name]['met'])}/{len(runs)}"
        for name in runs[0]["targets"]
    }
    return {"modes": modes, "targets_met_in_seeds": met}


def summary_table(modes: dict[str, Any]) -> str:
    """Mean (min-max) per mode of the headline figures."""
    shown = (
        ("lost GPU-h", "gpu_hours_lost"),
        ("lost/placed", "gpu_hours_lost_per_preemptor_placed"),
        ("Jain", "jain_backlogged"),
        ("delay p50", "queue_delay_p50_s"),
        ("delay mean", "queue_delay_mean_s"),
        ("quota back p95", "quota_back_p95_s"),
        ("reclaimable p95", "quota_back_reclaimable_p95_s"),
    )
    rows = [("mode", *(label for label, _ in shown))]
    for mode, figures in modes.items():
        cells = []
        for _, name in shown:
            f = figures[name]
            cells.append(
                "-" if f["mean"] is None else f"{_n(f['mean'])} ({_n(f['min'])}-{_n(f['max'])})"
            )
        rows.append((mode, *cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


def _n(value: float) -> str:
    """A figure for the table: whole numbers from 100 up, three digits below."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=None, help="seeds 1..N (default 5; smoke 2)")
    parser.add_argument("--hours", type=float, default=12.0, help="hours of arrivals")
    parser.add_argument("--hosts", type=int, default=32, help="8-GPU hosts, 8 to a rack")
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    parser.add_argument("--heavy", action="store_true", help="the long, heavy-tailed workload")
    parser.add_argument("--weeks", type=float, default=3.0, help="--heavy: weeks of arrivals")
    parser.add_argument(
        "--tree", action="store_true", help="the queues in two organisations (a cohort tree)"
    )
    args = parser.parse_args()
    if args.tree and args.heavy:
        parser.error("--tree: the multi-tenant workload only, not with --heavy")
    default_seeds = 2 if args.smoke else 3 if args.heavy else 5
    seeds = args.seeds if args.seeds is not None else default_seeds
    if seeds < 1:
        parser.error(f"--seeds: at least 1, got {seeds}")
    hours = args.weeks * 168 if args.heavy else args.hours
    hours, hosts = (1.0 if not args.heavy else 12.0, 16) if args.smoke else (hours, args.hosts)
    started = time.perf_counter()
    orgs = ORGANISATIONS if args.tree else 0
    per_seed = {
        seed: run_seed(seed, hours, hosts, args.heavy, orgs) for seed in range(1, seeds + 1)
    }
    over = summary(per_seed)
    kind = "heavy-tailed" if args.heavy else "multi-tenant"
    if args.tree:
        kind += f" in a cohort tree of {orgs} organisations"
    out = {
        "workload": f"{kind}, {hours:g} h of arrivals on {hosts} x 8 GPUs, seeds 1-{seeds}",
        "summary": over,
        "per_seed": per_seed,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    print(summary_table(over["modes"]), file=sys.stderr)
    text = json.dumps(out, indent=2)
    print(text)
    if not args.smoke:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        path = HEAVY_RESULTS if args.heavy else TREE_RESULTS if args.tree else RESULTS
        path.write_text(text + "\n")


if __name__ == "__main__":
    main()
