"""The scheduler's quality report: a synthetic, a multi-tenant and a trace workload under
every policy side by side, through the real scheduler and ``apply``, in one table.

Parts (``--parts``, all three by default):

* ``synthetic``: ``synapse_ha.sim.workload.synthetic`` (``--jobs`` jobs on ``--nodes``
  8-GPU hosts, offered load 90 %) under ours, naive and FIFO first-fit, a pass at every
  instant something happens; one workload per seed.
* ``multi-tenant``: ``synapse_ha.sim.tenants.multi_tenant`` (``--hours`` of arrivals on
  ``--hosts`` 8-GPU hosts, four queues of 64 GPUs) under ours with preemption off,
  blind and topology, topology with fair-sharing preemption on in the cohort (``fair``),
  and the two baselines, a pass every 0.5 s; one workload per seed.
* ``trace``: ``--trace-file``, a trace in the simulator's format, on ``--trace-hosts``
  8-GPU hosts; without it, the Alibaba openb v2023 trace (``--openb``) converted as
  ``synapse-sim --workload openb --write-trace`` converts it, on one in ``--openb-every``
  of each of its node shapes. Arrivals ``--trace-speedup`` times the trace's pace;
  ``--trace-checkpoint-interval S`` has every job without an interval of its own mark a
  checkpoint every S seconds of run time; ``--trace-estimates`` gives its queues run-time
  estimates for backfill (``none``; ``learned``: each queue's ``learned_estimates``, the
  finished jobs kept a day; ``learned:S``: learned, else a default of S seconds;
  ``default:S``: each queue's ``default_time_limit_ms``, :mod:`synapse_ha.sim.estimates`).
  The trace is not drawn: it runs once, whatever ``--seeds``.

``--reservations K`` has every policy of ours keep a reservation for each of the first K
gangs of a pass that cannot be placed (``ClusterConfig.reservations_per_pass``, default 1).

In a workload whose jobs mark checkpoints, victims save on notice: a victim marks a
checkpoint 5-20 s after its notice (drawn, seeded) and exits, ending its grace then
(``synapse_ha.sim.quality.saving_on_notice``); ``--no-save-on-notice`` lets every victim
run out its grace instead.

Per workload and policy, the table holds the queueing delay (mean, p50, p95), the
longest wait of a gang of 64 GPUs or more, Jain's index among backlogged queues, the
GPU-hours lost to preemption (in all and per preemptor placed), the quota-back p95, the
share of preemptors with a topology placed in one rack, and the GPU allocation: the mean
over ``--seeds`` seeds (1..N, default 5) with the range. The JSON adds each policy's delay
CDF, every seed's jobs pooled.

Writes ``quality.json`` and ``quality.md`` to ``--out`` (default bench/results) and, per
workload, seed 1's plots (``delay_cdf.png``, ``allocation.png``, ``queue.png``) to
``<out>/quality/<workload>/``; prints the JSON on stdout and the table on stderr.
``--smoke`` runs small versions of every part on 2 seeds in under a minute and writes
only where ``--out`` says.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.sim.engine import Result
from synapse_ha.sim.estimates import (
    keeping_history,
    parse_estimates,
    with_estimates,
    with_reservations,
)
from synapse_ha.sim.plots import write_plots
from synapse_ha.sim.quality import (
    SAVE_ON_NOTICE_MS,
    markdown,
    openb_workload,
    run_policies,
    saving_on_notice,
    summarise,
    trace_file_workload,
)
from synapse_ha.sim.tenants import multi_tenant
from synapse_ha.sim.trace import TraceError
from synapse_ha.sim.workload import Workload, synthetic

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OPENB = ROOT.parent / "shared" / "data" / "alibaba-openb-v2023"
PARTS = ("synthetic", "multi-tenant", "trace")
# --smoke: the sizes of each part.
SMOKE = {"jobs": 150, "nodes": 32, "hours": 1.0, "hosts": 16, "openb_limit": 400}


def run_part(
    name: str,
    make: Callable[[int], Workload],
    seeds: int,
    plots: Path | None,
    config: ClusterConfig | None = None,
) -> dict[str, Any]:
    """The workload ``make(seed)`` of each seed under every policy (on ``config``): the
    notes of seed 1's workload, the summary per policy, and seed 1's plots under ``plots``."""
    per_seed: list[list[Result]] = []
    notes = ""
    started = time.perf_counter()
    for seed in range(1, seeds + 1):
        workload = make(seed)
        notes = notes or workload.notes
        results = run_policies(workload, config)
        print(f"{name} seed {seed}: {len(workload.jobs)} jobs", file=sys.stderr)
        per_seed.append(results)
        if plots is not None and seed == 1:
            plots.mkdir(parents=True, exist_ok=True)
            for line in write_plots(results, plots):
                print(line, file=sys.stderr)
    return {
        "workload": notes,
        "seeds": f"seed 1-{seeds}" if seeds > 1 else "seed 1",
        "policies": summarise(per_seed),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def _makers(args: argparse.Namespace) -> dict[str, Callable[[int], Workload]]:
    """Each part's workload of a seed (the trace's is the same for every seed), its
    victims saving on notice unless ``--no-save-on-notice``."""
    every_s = args.trace_checkpoint_interval
    variant, default_ms = args.estimates
    if args.trace_file:
        trace = Path(args.trace_file)
        speedup = args.trace_speedup
        hosts = args.trace_hosts

        def loaded(_: int) -> Workload:
            return trace_file_workload(trace, hosts, speedup, every_s)
    else:
        folder, every, limit = Path(args.openb), args.openb_every, args.openb_limit

        def loaded(_: int) -> Workload:
            return openb_workload(folder, every, args.trace_speedup, limit, every_s)

    def traced(seed: int) -> Workload:
        workload = with_estimates(loaded(seed), variant, default_ms)
        if variant == "none":
            return workload
        notes = f"{workload.notes}; estimates {args.trace_estimates}"
        return dataclasses.replace(workload, notes=notes)

    bounds = None if args.no_save_on_notice else SAVE_ON_NOTICE_MS
    makers: dict[str, Callable[[int], Workload]] = {
        "synthetic": lambda seed: synthetic(seed=seed, jobs=args.jobs, nodes=args.nodes),
        "multi-tenant": lambda seed: multi_tenant(seed=seed, hours=args.hours, hosts=args.hosts),
        "trace": traced,
    }

    def saving(make: Callable[[int], Workload]) -> Callable[[int], Workload]:
        return lambda seed: saving_on_notice(make(seed), bounds)

    return {part: saving(make) for part, make in makers.items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds 1..N (default 5; smoke 2)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, of %(default)s")
    parser.add_argument("--jobs", type=int, default=2_000, help="synthetic: jobs")
    parser.add_argument("--nodes", type=int, default=512, help="synthetic: 8-GPU hosts")
    parser.add_argument("--hours", type=float, default=12.0, help="multi-tenant: hours of arrivals")
    parser.add_argument("--hosts", type=int, default=32, help="multi-tenant: 8-GPU hosts")
    parser.add_argument("--trace-file", default=None, help="trace: a CSV in the trace format")
    parser.add_argument(
        "--trace-hosts", type=int, default=64, help="--trace-file: 8-GPU hosts (default 64)"
    )
    parser.add_argument(
        "--trace-speedup",
        type=float,
        default=1.0,
        help="trace: arrivals this many times the trace's pace (default 1)",
    )
    parser.add_argument(
        "--trace-checkpoint-interval",
        type=float,
        default=None,
        metavar="S",
        help="trace: every job without an interval marks a checkpoint every S s (>= 1)",
    )
    parser.add_argument(
        "--trace-estimates",
        default="none",
        metavar="E",
        help="trace: run-time estimates of its queues: none, learned, learned:S or "
        "default:S (S seconds; default %(default)s)",
    )
    parser.add_argument(
        "--no-save-on-notice",
        action="store_true",
        help="victims never mark a checkpoint after their notice: each runs out its grace",
    )
    parser.add_argument("--openb", default=str(OPENB), help="folder of the openb CSV files")
    parser.add_argument(
        "--openb-every",
        type=int,
        default=100,
        help="openb: one node in this many of each node shape (default %(default)s)",
    )
    parser.add_argument("--openb-limit", type=int, default=None, help="openb: first N pods")
    parser.add_argument("--out", default=None, help="folder for the report (default bench/results)")
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    parser.add_argument(
        "--reservations",
        type=int,
        default=1,
        metavar="K",
        help="reservations per pass, for the first K gangs that cannot be placed "
        "(ClusterConfig.reservations_per_pass; default 1)",
    )
    parser.add_argument(
        "--defrag-share",
        type=int,
        default=0,
        metavar="PCT",
        help="drain up to PCT %% of the nodes for scattered gangs of starved queues "
        "(ClusterConfig.defrag_share_pct; default 0: off)",
    )
    return parser


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The parts asked for; a bad option stops the program naming it and its rule."""
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        parser.error(f"--parts: unknown {', '.join(unknown) or '(none given)'}; of {PARTS}")
    for flag, value in (
        ("--seeds", args.seeds),
        ("--jobs", args.jobs),
        ("--nodes", args.nodes),
        ("--hosts", args.hosts),
        ("--trace-hosts", args.trace_hosts),
        ("--openb-every", args.openb_every),
    ):
        if value is not None and value < 1:
            parser.error(f"{flag}: at least 1, got {value}")
    if not 0 < args.hours < float("inf"):
        parser.error(f"--hours: a number above 0, got {args.hours}")
    if not 0 < args.trace_speedup < float("inf"):
        parser.error(f"--trace-speedup: a number above 0, got {args.trace_speedup}")
    interval = args.trace_checkpoint_interval
    if interval is not None and not 1 <= interval < float("inf"):
        parser.error(f"--trace-checkpoint-interval: at least 1 second, got {interval}")
    try:
        args.estimates = parse_estimates(args.trace_estimates)
    except ValueError as exc:
        parser.error(f"--trace-estimates: {exc}")
    if args.smoke:
        args.jobs, args.nodes = SMOKE["jobs"], SMOKE["nodes"]
        args.hours, args.hosts = SMOKE["hours"], SMOKE["hosts"]
        if args.openb_limit is None:
            args.openb_limit = SMOKE["openb_limit"]
    if not 0 <= args.defrag_share <= 100:
        parser.error(f"--defrag-share must be between 0 and 100 (percent), got {args.defrag_share}")
    try:
        with_reservations(ClusterConfig(), args.reservations)
    except ValueError as exc:
        parser.error(f"--reservations: {exc}")
    return parts


def _config(args: argparse.Namespace, part: str) -> ClusterConfig | None:
    """The cluster configuration the policies of ``part`` run on (None: the simulator's
    default); the trace's keeps finished jobs for learned estimates."""
    learned = part == "trace" and args.estimates[0] == "learned"
    if not args.defrag_share and not learned and args.reservations == 1:
        return None
    config = ClusterConfig(retention_ms=0, defrag_share_pct=args.defrag_share)
    config = with_reservations(config, args.reservations)
    return keeping_history(config, args.estimates[0]) if part == "trace" else config


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    parts = _check(args, parser)
    seeds = args.seeds or (2 if args.smoke else 5)
    out = Path(args.out) if args.out else None if args.smoke else RESULTS
    makers = _makers(args)
    started = time.perf_counter()
    workloads: dict[str, Any] = {}
    for part in parts:
        drawn = seeds if part != "trace" else 1
        plots = out / "quality" / part if out is not None else None
        try:
            workloads[part] = run_part(part, makers[part], drawn, plots, _config(args, part))
        except (OSError, TraceError, ValueError) as exc:
            parser.error(f"cannot run the {part} workload: {exc}")
    report = {
        "parts": parts,
        "workloads": workloads,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    table = markdown(workloads)
    print(table, file=sys.stderr)
    text = json.dumps(report, indent=2)
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "quality.json").write_text(text + "\n")
        (out / "quality.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
