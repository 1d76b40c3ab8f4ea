"""``synapse-sim``: replay a workload under several policies and compare them.

Examples::

    synapse-sim --workload synthetic --jobs 2000 --nodes 512 --out bench/results/sim
    synapse-sim --workload openb --trace DIR --limit 3000   # the Alibaba trace: docs/simulator.md
    synapse-sim --workload multi-tenant --hours 6          # preemption off/blind/topology
    synapse-sim --workload multi-tenant --estimates        # run-time estimates none/default/learned
    synapse-sim --workload trace --trace-file jobs.csv --nodes 64
    synapse-sim --workload openb --write-trace openb.csv   # convert, then stop
    synapse-sim --workload training --nodes 64 --days 3 --gpu-failures --failure-scale 20
    synapse-sim --workload training --nodes 256 --gpu-failures --checkpoint-minutes 30 \
        --recovery requeue,replace,replace+spares,elastic

A workload with queues (multi-tenant, or a trace) runs the real scheduler under each
preemption mode instead of comparing policies; docs/simulator.md has the trace format.
With --gpu-failures, GPUs fail (a Poisson process per GPU, default the Llama 3 rate of
0.25 per 1,000 GPU-days) and the real scheduler runs once per failure policy
(health-aware, health-blind) on the same failures; with --recovery, once per way of
coming back from a failure (requeue the gang, replace the lost rank, replace it on a hot
spare first, or run the gangs elastic).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from synapse_ha.core.cluster_config import (
    LOCALITY_WAIT_MS,
    MAX_DEFAULT_TIME_LIMIT_MS,
    MAX_LOCALITY_WAIT_MS,
    ClusterConfig,
    PreemptionMode,
)
from synapse_ha.sim.engine import Result, simulate
from synapse_ha.sim.estimates import DEFAULT_TIME_LIMIT_MS, run_estimates, with_reservations
from synapse_ha.sim.estimates import report as estimates_report
from synapse_ha.sim.estimates import table as estimates_table
from synapse_ha.sim.failure_report import parse_policies, run_policies
from synapse_ha.sim.failure_report import report as failure_report
from synapse_ha.sim.failure_report import table as failure_table
from synapse_ha.sim.gpu_failures import LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS, FailureModel
from synapse_ha.sim.pipelines import MODES as PIPELINE_MODES
from synapse_ha.sim.pipelines import pipeline_workload, run_pipelines
from synapse_ha.sim.plots import write_plots
from synapse_ha.sim.policies import POLICIES
from synapse_ha.sim.recovery import RESTART_OVERHEAD_MS, RecoveryModel
from synapse_ha.sim.recovery_report import parse_recoveries, run_recoveries
from synapse_ha.sim.recovery_report import report as recovery_report
from synapse_ha.sim.recovery_report import table as recovery_table
from synapse_ha.sim.tables import Column, results_table
from synapse_ha.sim.tenancy import MODES, PASS_INTERVAL_MS, run_modes
from synapse_ha.sim.tenancy import report as tenancy_report
from synapse_ha.sim.tenancy import table as tenancy_table
from synapse_ha.sim.tenants import from_trace, multi_tenant
from synapse_ha.sim.trace import load_trace, openb_to_trace, write_trace
from synapse_ha.sim.training import training
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
    if args.workload == "pipelines":
        return pipeline_workload(seed=args.seed, hours=args.hours, nodes=args.nodes)
    if args.workload == "training":
        return training(
            seed=args.seed,
            nodes=args.nodes,
            days=args.days,
            load=args.load,
            max_retries=args.max_retries,
        )
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


_COLUMNS: tuple[Column, ...] = (
    ("policy", lambda r: r.policy),
    ("alloc", lambda r: f"{r.metrics['gpu_allocation']:.1%}"),
    ("delay mean", lambda r: f"{r.metrics['queue_delay_s']['mean']:.0f}s"),
    ("p95", lambda r: f"{r.metrics['queue_delay_s']['p95']:.0f}s"),
    ("big max", lambda r: f"{r.metrics['queue_delay_big_gangs_s']['max']:.0f}s"),
    ("one rack*", lambda r: _percent(r.metrics["rack_fitting_gangs_in_one_rack"])),
    ("one rack**", lambda r: _percent(r.metrics["gangs_with_rack_room_at_bind_in_one_rack"])),
    ("frag", lambda r: f"{r.metrics['fragmentation_gpus']:.1f}"),
    ("cpu ms/dec", lambda r: f"{r.metrics['scheduler_cpu_ms_per_decision']:.3f}"),
)


def table(results: list[Result]) -> str:
    lines = results_table(_COLUMNS, results)
    lines.append("*  of multi-member gangs no larger than a rack, the share placed in one rack")
    lines.append("** of multi-member gangs bound while some rack had room, the share in one rack")
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def main(argv: list[str] | None = None) -> int:
    """Run ``synapse-sim`` with ``argv``; the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.pass_interval is not None and not 0 <= args.pass_interval <= 3600:
        parser.error("--pass-interval: seconds between 0 and 3600")
    if not 0 <= args.locality_wait * 1000 <= MAX_LOCALITY_WAIT_MS:
        parser.error(f"--locality-wait: seconds between 0 and {MAX_LOCALITY_WAIT_MS // 1000}")
    if not 0 <= args.default_time_limit * 1000 <= MAX_DEFAULT_TIME_LIMIT_MS:
        parser.error("--default-time-limit: seconds between 0 and 366 days")
    config = ClusterConfig(retention_ms=0, locality_wait_ms=round(args.locality_wait * 1000))
    try:
        config = with_reservations(config, args.reservations)
    except ValueError as exc:
        parser.error(f"--reservations: {exc}")
    if args.write_trace:
        if args.workload != "openb":
            parser.error("--write-trace converts the openb trace: use it with --workload openb")
        _write_trace(args)
        return 0
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    model = _failure_model(args, parser)
    try:
        workload = _workload(args)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot load the {args.workload} workload: {exc}")
    if model is not None:
        if any(j.after_ok for j in workload.jobs):
            parser.error("--gpu-failures: the failure runs do not replay after_ok dependencies")
        if args.recovery is not None:
            _recovery_runs(workload, model, _recovery_model(args, parser), config, args)
        else:
            _failure_runs(workload, model, config, args)
        return 0
    if args.workload == "pipelines":
        _compare_pipelines(workload, config, args)
        return 0
    if args.estimates:
        _compare_estimates(workload, _modes(args.modes, parser)[-1], config, args)
        return 0
    if workload.queues:
        _compare_modes(workload, _modes(args.modes, parser), config, args)
        return 0
    _compare_policies(workload, names, config, args)
    return 0


def _modes(text: str, parser: argparse.ArgumentParser) -> tuple[PreemptionMode, ...]:
    """``--modes``: preemption modes by name, in the order given."""
    known = {str(m): m for m in MODES}
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(
            f"--modes: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(known)}"
        )
    return tuple(known[n] for n in dict.fromkeys(names))


def _interval_ms(args: argparse.Namespace, default_ms: int = PASS_INTERVAL_MS) -> int:
    """``--pass-interval`` in ms, or ``default_ms`` when it is not given."""
    return default_ms if args.pass_interval is None else round(args.pass_interval * 1000)


def _compare_pipelines(workload: Workload, config: ClusterConfig, args: argparse.Namespace) -> None:
    """Pipelines with the dependencies in the scheduler and in a polling orchestrator;
    the makespans side by side (table on stderr, JSON on stdout and in ``--out``)."""
    interval_ms = _interval_ms(args)
    report = run_pipelines(workload, config, pass_interval_ms=interval_ms)
    rows = [("dependencies", "pipelines", "makespan mean", "p95", "max", "alloc")]
    for mode in PIPELINE_MODES:
        m = report[mode]
        span = m["makespan_s"]
        rows.append(
            (mode, f"{m['completed']}/{m['pipelines']}", f"{span['mean']:.0f}s",
             f"{span['p95']:.0f}s", f"{span['max']:.0f}s", f"{m['gpu_allocation']:.1%}")
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)), file=sys.stderr)
    _emit(report, [], args.out)


def _compare_modes(
    workload: Workload,
    modes: tuple[PreemptionMode, ...],
    config: ClusterConfig,
    args: argparse.Namespace,
) -> None:
    """Run a workload with queues under each preemption mode; print both tables (the
    tenancy figures and the placement figures, big gangs included) and the JSON report,
    and with ``--out`` write the report and the plots there."""
    interval_ms = _interval_ms(args)
    results = run_modes(workload, modes, config=config, pass_interval_ms=interval_ms)
    report = tenancy_report(workload, results, pass_interval_ms=interval_ms)
    report["locality_wait_s"] = args.locality_wait
    report["results"] = {r.policy: r.metrics for r in results}
    print(tenancy_table(results), file=sys.stderr)
    print(table(results), file=sys.stderr)
    _emit(report, results, args.out)


def _compare_estimates(
    workload: Workload, mode: PreemptionMode, config: ClusterConfig, args: argparse.Namespace
) -> None:
    """Run a workload without run-time estimates, with a queue default time limit, with
    learned estimates and with the oracle's (synapse_ha.sim.estimates), in preemption
    ``mode``; print the delays side by side and the JSON report."""
    interval_ms = _interval_ms(args, PASS_INTERVAL_MS if workload.queues else 0)
    default_ms = round(args.default_time_limit * 1000)
    results = run_estimates(
        workload, default_ms=default_ms, mode=mode, config=config, pass_interval_ms=interval_ms
    )
    report = estimates_report(results, default_ms, mode)
    report["workload"] = workload.notes
    report["results"] = {r.policy: r.metrics for r in results}
    print(estimates_table(results), file=sys.stderr)
    _emit(report, results, args.out)


def _parser() -> argparse.ArgumentParser:
    """The program's options (``--help`` shows the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog="synapse-sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workload",
        choices=["synthetic", "openb", "multi-tenant", "trace", "training", "pipelines"],
        default="synthetic",
    )
    parser.add_argument("--trace-file", default=None, help="trace: a CSV in the trace format")
    parser.add_argument(
        "--hours", type=float, default=6.0, help="multi-tenant, pipelines: hours of arrivals"
    )
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
    parser.add_argument("--nodes", type=int, default=512, help="synthetic, pipelines: 8-GPU hosts")
    parser.add_argument("--load", type=float, default=0.9, help="synthetic, training: offered load")
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
    parser.add_argument(
        "--pass-interval",
        type=float,
        default=None,
        help="seconds between two scheduling passes, as the leader's schedule period "
        f"(default: {PASS_INTERVAL_MS / 1000:g} for workloads with queues; 0, a pass at "
        "every instant something happens, for the policy comparison)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(str(m) for m in MODES),
        help="workloads with queues: the preemption modes to run, comma-separated "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--estimates",
        action="store_true",
        help="compare run-time estimates for backfill (none, the "
        "queues' --default-time-limit, learned from finished runs, and the oracle bound: "
        "every job's own run time) in the last of --modes",
    )
    parser.add_argument(
        "--default-time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_MS / 1000,
        help="--estimates: the queues' default time limit in seconds (default %(default)g)",
    )
    parser.add_argument("--reservations", type=int, default=1, help="reservations per pass")
    parser.add_argument("--days", type=float, default=3.0, help="training: days of arrivals")
    parser.add_argument("--max-retries", type=int, default=3, help="training: retries per job")
    _failure_options(parser)
    return parser


def _failure_options(parser: argparse.ArgumentParser) -> None:
    """The GPU failure model's options."""
    group = parser.add_argument_group("GPU failures (docs/simulator.md)")
    group.add_argument(
        "--gpu-failures",
        type=float,
        nargs="?",
        const=LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS,
        default=None,
        metavar="PER_1000_GPU_DAYS",
        help="GPUs fail at this rate (alone: the Llama 3 rate, "
        f"{LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS:g}); off when not given",
    )
    group.add_argument(
        "--failure-scale", type=float, default=1.0, help="multiply the failure rate by this"
    )
    group.add_argument("--repair-hours", type=float, default=24.0, help="failure until repaired")
    group.add_argument(
        "--operator-delay-hours",
        type=float,
        default=1.0,
        help="health-blind: failure until an operator cordons the node",
    )
    group.add_argument(
        "--crash-after-s",
        type=float,
        default=300.0,
        help="health-blind: how long a gang placed on a failed GPU runs before it fails",
    )
    group.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=0.0,
        help="gangs keep their work up to the last checkpoint at this period (0: none)",
    )
    group.add_argument(
        "--failure-policies",
        default=None,
        help="comma-separated, from health-aware, health-blind (default: both)",
    )
    group.add_argument(
        "--recovery",
        default=None,
        metavar="POLICIES",
        help="compare ways of coming back from a failure instead, comma-separated, from "
        "requeue, replace, replace+spares, elastic, elastic+spares (the core learns of "
        "every failure)",
    )
    group.add_argument(
        "--restart-overhead-s",
        type=float,
        default=RESTART_OVERHEAD_MS / 1000,
        help="--recovery: a gang's restart after a failure, until useful work (default "
        "%(default)g)",
    )
    group.add_argument(
        "--spares",
        type=int,
        default=1,
        help="--recovery replace+spares, elastic+spares: hot spare nodes per domain of "
        "--spare-level (default %(default)s)",
    )
    group.add_argument(
        "--spare-level",
        default="rack",
        choices=("zone", "block", "rack"),
        help="--recovery replace+spares, elastic+spares: the topology level whose domains "
        "each keep --spares spares (default %(default)s)",
    )
    group.add_argument(
        "--elastic-min-share",
        type=float,
        default=0.5,
        help="--recovery elastic: an elastic gang's min, as a share of its members "
        "(rounded down, at least one; default %(default)g)",
    )
    group.add_argument(
        "--failure-seed", type=int, default=None, help="seed of the failures (default --seed)"
    )


def _failure_model(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> FailureModel | None:
    """The failure model the options ask for (None: no failures); a bad value stops
    the program with the option's name and rule."""
    if args.gpu_failures is None:
        return None
    for flag, value, least in (
        ("--gpu-failures", args.gpu_failures, 0.0),
        ("--failure-scale", args.failure_scale, 0.0),
        ("--repair-hours", args.repair_hours, 1 / 3_600_000),
        ("--operator-delay-hours", args.operator_delay_hours, 0.0),
        ("--crash-after-s", args.crash_after_s, 0.0),
        ("--checkpoint-minutes", args.checkpoint_minutes, 0.0),
    ):
        if not least <= value < float("inf"):
            parser.error(f"{flag}: a number of at least {least:g}, got {value}")
    if args.recovery is not None and args.failure_policies is not None:
        parser.error("--recovery and --failure-policies: choose one comparison")
    if args.failure_policies is None:
        args.failure_policies = "health-aware,health-blind"
    try:
        parse_policies(args.failure_policies)
        if args.recovery is not None:
            parse_recoveries(args.recovery)
        model = FailureModel(
            per_1000_gpu_days=args.gpu_failures * args.failure_scale,
            repair_ms=round(args.repair_hours * 3_600_000),
            operator_delay_ms=round(args.operator_delay_hours * 3_600_000),
            crash_after_ms=round(args.crash_after_s * 1000),
            checkpoint_ms=round(args.checkpoint_minutes * 60_000),
            seed=args.seed if args.failure_seed is None else args.failure_seed,
        )
        model.check()
    except ValueError as exc:
        parser.error(str(exc))
    return model


def _failure_runs(
    workload: Workload, model: FailureModel, config: ClusterConfig, args: argparse.Namespace
) -> None:
    """Run ``workload`` under ``model`` once per failure policy; print the table and
    the JSON report, and with ``--out`` write the report and the plots there."""
    results = run_policies(workload, model, parse_policies(args.failure_policies), config)
    report = failure_report(workload, model, results)
    print(failure_table(results), file=sys.stderr)
    _emit(report, results, args.out)


def _recovery_model(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RecoveryModel:
    """The recovery options as a model; a bad value stops the program naming the option."""
    if not 0 <= args.restart_overhead_s <= 86_400:
        parser.error(f"--restart-overhead-s: between 0 and 86400 s, got {args.restart_overhead_s}")
    if not 0 <= args.spares <= 64:
        parser.error(f"--spares: between 0 and 64, got {args.spares}")
    model = RecoveryModel(
        restart_overhead_ms=round(args.restart_overhead_s * 1000),
        spares=args.spares,
        spare_level=args.spare_level,
        elastic_min_share=args.elastic_min_share,
    )
    try:
        model.check()
    except ValueError as exc:
        parser.error(f"--elastic-min-share: {exc}")
    return model


def _recovery_runs(
    workload: Workload,
    model: FailureModel,
    recovery_model: RecoveryModel,
    config: ClusterConfig,
    args: argparse.Namespace,
) -> None:
    """Run ``workload`` under ``model`` once per recovery policy; print the table and
    the JSON report, and with ``--out`` write the report and the plots there."""
    results = run_recoveries(
        workload,
        model,
        parse_recoveries(args.recovery),
        recovery_model,
        config,
        pass_interval_ms=_interval_ms(args),
    )
    report = recovery_report(workload, model, recovery_model, results)
    print(recovery_table([r.metrics["recovery"] for r in results]), file=sys.stderr)
    _emit(report, results, args.out)


def _emit(report: dict[str, Any], results: list[Result], out_dir: str | None) -> None:
    """Print the JSON report; with ``out_dir``, write it and the plots there."""
    print(json.dumps(report, indent=2))
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        if not results:
            return  # nothing to plot (the pipelines' report is figures only)
        for line in write_plots(results, out):
            print(line, file=sys.stderr)


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
    interval_ms = _interval_ms(args, 0)
    results = [
        simulate(workload, POLICIES[name](), config=config, pass_interval_ms=interval_ms)
        for name in names
    ]
    report = {
        "workload": workload.notes,
        "locality_wait_s": args.locality_wait,
        "pass_interval_s": interval_ms / 1000,
        "results": {r.policy: r.metrics for r in results},
        **compare(results),
    }
    print(table(results), file=sys.stderr)
    _emit(report, results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
