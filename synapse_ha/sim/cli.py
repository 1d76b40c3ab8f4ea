"""``synapse-sim``: replay a workload under several policies and compare them.

Examples::

    synapse-sim --workload synthetic --jobs 2000 --nodes 512 --out bench/results/sim
    synapse-sim --workload openb --trace ../shared/data/alibaba-openb-v2023 --limit 3000
    synapse-sim --workload multi-tenant --hours 6          # preemption off/blind/topology
    synapse-sim --workload trace --trace-file jobs.csv --nodes 64
    synapse-sim --workload openb --write-trace openb.csv   # convert, then stop

A workload with queues (multi-tenant, or a trace) runs the real scheduler under each
preemption mode instead of comparing policies; docs/simulator.md has the trace format.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from synapse_ha.core.model import LOCALITY_WAIT_MS, MAX_LOCALITY_WAIT_MS, ClusterConfig
from synapse_ha.sim.engine import Result, simulate
from synapse_ha.sim.policies import POLICIES
from synapse_ha.sim.tenancy import report as tenancy_report
from synapse_ha.sim.tenancy import run_modes
from synapse_ha.sim.tenancy import table as tenancy_table
from synapse_ha.sim.tenants import from_trace, multi_tenant
from synapse_ha.sim.trace import load_trace, openb_to_trace, write_trace
from synapse_ha.sim.workload import Workload, load_openb, synthetic, synthetic_cluster


def _workload(args: argparse.Namespace) -> Workload:
    if args.workload == "openb":
        return load_openb(Path(args.trace), limit=args.limit)
    if args.workload == "multi-tenant":
        return multi_tenant(seed=args.seed, hours=args.hours, hosts=args.nodes)
    if args.workload == "trace":
        if not args.trace_file:
            raise ValueError("--trace-file is required with --workload trace")
        jobs = load_trace(Path(args.trace_file))
        return from_trace(jobs, synthetic_cluster(args.nodes), name=Path(args.trace_file).name)
    return synthetic(seed=args.seed, jobs=args.jobs, nodes=args.nodes, load=args.load)


def compare(results: list[Result]) -> dict[str, Any]:
    """Side-by-side headline figures, with ratios of ours to each baseline."""
    by_name = {r.policy: r.metrics for r in results}
    ours = by_name.get("ours")
    ratios: dict[str, dict[str, float | None]] = {}
    if ours is not None:
        for name, m in by_name.items():
            if name == "ours":
                continue
            ratios[name] = {
                "mean_queue_delay": _ratio(
                    ours["queue_delay_s"]["mean"], m["queue_delay_s"]["mean"]
                ),
                "big_gang_max_delay": _ratio(
                    ours["queue_delay_big_gangs_s"]["max"], m["queue_delay_big_gangs_s"]["max"]
                ),
                "gpu_allocation": _ratio(ours["gpu_allocation"], m["gpu_allocation"]),
            }
    return {"ours_over_baseline": ratios}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def table(results: list[Result]) -> str:
    rows = [
        (
            "policy",
            "alloc",
            "delay mean",
            "p95",
            "big max",
            "one rack*",
            "one rack**",
            "frag",
            "cpu ms/dec",
        ),
    ]
    for r in results:
        m = r.metrics
        rows.append(
            (
                r.policy,
                f"{m['gpu_allocation']:.1%}",
                f"{m['queue_delay_s']['mean']:.0f}s",
                f"{m['queue_delay_s']['p95']:.0f}s",
                f"{m['queue_delay_big_gangs_s']['max']:.0f}s",
                _percent(m["rack_fitting_gangs_in_one_rack"]),
                _percent(m["gangs_with_rack_room_at_bind_in_one_rack"]),
                f"{m['fragmentation_gpus']:.1f}",
                f"{m['scheduler_cpu_ms_per_decision']:.3f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.append("*  of multi-member gangs no larger than a rack, the share placed in one rack")
    lines.append("** of multi-member gangs bound while some rack had room, the share in one rack")
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def main(argv: list[str] | None = None) -> int:
    """Run ``synapse-sim`` with ``argv``; the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 <= args.locality_wait * 1000 <= MAX_LOCALITY_WAIT_MS:
        parser.error(f"--locality-wait: seconds between 0 and {MAX_LOCALITY_WAIT_MS // 1000}")
    config = ClusterConfig(retention_ms=0, locality_wait_ms=round(args.locality_wait * 1000))
    if args.write_trace:
        if args.workload != "openb":
            parser.error("--write-trace converts the openb trace: use it with --workload openb")
        _write_trace(args)
        return 0
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    try:
        workload = _workload(args)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot load the {args.workload} workload: {exc}")
    if workload.queues:
        results = run_modes(workload, config=config)
        print(tenancy_table(results), file=sys.stderr)
        print(json.dumps(tenancy_report(workload, results), indent=2))
        return 0
    _compare_policies(workload, names, config, args)
    return 0


def _parser() -> argparse.ArgumentParser:
    """The program's options (``--help`` shows the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog="synapse-sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workload", choices=["synthetic", "openb", "multi-tenant", "trace"], default="synthetic"
    )
    parser.add_argument("--trace-file", default=None, help="trace: a CSV in the trace format")
    parser.add_argument("--hours", type=float, default=6.0, help="multi-tenant: hours of arrivals")
    parser.add_argument(
        "--write-trace",
        default=None,
        help="openb: write the pods in the trace format to this file and stop",
    )
    parser.add_argument(
        "--trace",
        default="../shared/data/alibaba-openb-v2023",
        help="folder of the openb CSV files",
    )
    parser.add_argument("--limit", type=int, default=None, help="openb: first N pods only")
    parser.add_argument("--jobs", type=int, default=2_000, help="synthetic: number of jobs")
    parser.add_argument("--nodes", type=int, default=512, help="synthetic: 8-GPU hosts")
    parser.add_argument("--load", type=float, default=0.9, help="synthetic: offered load")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, from {', '.join(POLICIES)}",
    )
    parser.add_argument(
        "--locality-wait",
        type=float,
        default=LOCALITY_WAIT_MS / 1000,
        help="seconds a gang that fits in one rack waits for one with room (0: never); "
        "the cluster's locality_wait_ms (default %(default)g)",
    )
    parser.add_argument("--out", default=None, help="folder for report.json and PNG plots")
    return parser


def _write_trace(args: argparse.Namespace) -> None:
    """Convert the openb pods to the trace format, into ``--write-trace``."""
    with Path(args.write_trace).open("w") as f:
        count = write_trace(openb_to_trace(Path(args.trace), limit=args.limit), f)
    print(f"wrote {count} jobs to {args.write_trace}", file=sys.stderr)


def _compare_policies(
    workload: Workload, names: list[str], config: ClusterConfig, args: argparse.Namespace
) -> None:
    """Run ``workload`` under each named policy; print the table and the JSON report,
    and with ``--out`` write the report and the plots there."""
    results = [simulate(workload, POLICIES[name](), config=config) for name in names]
    report = {
        "workload": workload.notes,
        "locality_wait_s": args.locality_wait,
        "results": {r.policy: r.metrics for r in results},
        **compare(results),
    }
    print(table(results), file=sys.stderr)
    print(json.dumps(report, indent=2))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        from synapse_ha.sim.plots import write_plots

        for line in write_plots(results, out):
            print(line, file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
