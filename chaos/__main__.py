"""``python -m chaos``: preflight, sweep, run scenarios, or re-check a saved run.

    python -m chaos preflight
    python -m chaos sweep
    python -m chaos run [--seeds 1,2 | 1-20] [--duration S] [--out DIR]
                        [--scenarios targeted,random,broken-build,five-membership]
    python -m chaos soak --minutes M [--first-seed N] [--duration S] [--out DIR]
                         [--kinds gpu-xid,node-cannot-run] [--faults N]
    python -m chaos check RUN_DIR
    python -m chaos summary OUT_DIR [OUT_DIR ...]

``run`` prints one line per scenario and then the summary ``chaos: <faults> faults,
<kinds> kinds, <jobs> jobs (<n> sbatch: <steps> steps, <tasks> tasks), <violations>
violations, <skipped> skipped; <scenario>=<faults> ...; <seconds> s``; it exits non-zero
when a scenario has a violation or aborts, when the broken build (self-fencing
disabled) is NOT caught, and when no scenario but the broken build had a fair-share
preemption (the workload did not exercise it; chaos/fair_rules.py). It says when an
elastic kind was played but never made a gang grow or shrink (``elastic-grow``,
``elastic-shrink``; chaos/elasticfaults.py). Each failure prints the line that
reproduces it. ``soak`` runs the random scenario with one seed after
another (and the targeted one every tenth seed) until ``--minutes`` have passed, and
prints the same summary line. ``--kinds`` plays only the kinds named (``run`` too); with
``--faults N`` the soak also stops once its scenarios have played N faults of those kinds
(``make soak-health``: the two node-health kinds until 100 faults).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from chaos import elasticfaults, fair_rules, hosts, ledger, membership, nemesis, net, slowfaults
from chaos.checker import History, Violation, check_run
from chaos.cluster import REPO, SUBMIT_INTERVAL_S, ScenarioConfig
from chaos.history import load_steps
from chaos.report import write_report
from chaos.run import ScenarioResult, lane_load, run_scenario
from chaos.step_rules import step_counts

SCENARIOS = ("targeted", "random", "broken-build", membership.SCENARIO)


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, sep, high = part.partition("-")
        try:
            if sep:
                seeds += list(range(int(low), int(high) + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--seeds: {part!r} is not an integer or a range like 1-20"
            ) from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds: give at least one seed")
    return seeds


def parse_scenarios(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    for name in names:
        if name not in SCENARIOS:
            raise argparse.ArgumentTypeError(
                f"--scenarios: {name!r} is not one of {', '.join(SCENARIOS)}"
            )
    return names


def parse_kinds(text: str, flag: str = "--skip-kinds") -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    for name in names:
        if name not in nemesis.ALL_FAULTS:
            raise argparse.ArgumentTypeError(
                f"{flag}: {name!r} is not one of {', '.join(nemesis.ALL_FAULTS)}"
            )
    return names


def parse_only_kinds(text: str) -> list[str]:
    """``--kinds``: at least one known kind."""
    names = parse_kinds(text, "--kinds")
    if not names:
        raise argparse.ArgumentTypeError("--kinds: name at least one fault kind")
    return names


def parse_faults(text: str) -> int:
    try:
        faults = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--faults: {text!r} is not an integer") from None
    if faults < 0:
        raise argparse.ArgumentTypeError(f"--faults: {faults} is negative (0: no bound)")
    return faults


KINDS_HELP = "play only these fault kinds (comma-separated; default: every kind)"


LANES_HELP = (
    "random scenarios play this many fault schedules at once: one at the control plane, "
    "the others each at a share of the workers"
)


def parse_lanes(text: str) -> int:
    try:
        lanes = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lanes: {text!r} is not an integer") from None
    if not 1 <= lanes <= nemesis.MAX_LANES:
        raise argparse.ArgumentTypeError(
            f"--lanes: {lanes} is not between 1 and {nemesis.MAX_LANES}"
        )
    return lanes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("preflight", help="prove namespaces and nftables partitions work here")
    sub.add_parser("sweep", help="remove namespaces, links, tables and processes of ours")
    run = sub.add_parser("run", help="run scenarios and check them")
    run.add_argument("--seeds", type=parse_seeds, default=[1])
    run.add_argument("--duration", type=float, default=60.0, help="random scenario length (s)")
    run.add_argument("--scenarios", type=parse_scenarios, default=list(SCENARIOS))
    run.add_argument("--out", type=Path, default=REPO / "chaos" / "runs")
    run.add_argument("--skip-kinds", type=parse_kinds, default=[], help="fault kinds not to inject")
    run.add_argument("--lanes", type=parse_lanes, default=1, help=LANES_HELP)
    run.add_argument("--kinds", type=parse_only_kinds, default=[], help=KINDS_HELP)
    soak = sub.add_parser("soak", help="random scenarios, seed after seed, for a given time")
    soak.add_argument("--minutes", type=float, required=True)
    soak.add_argument("--first-seed", type=int, default=1000)
    soak.add_argument("--duration", type=float, default=300.0, help="each scenario's length (s)")
    soak.add_argument("--out", type=Path, default=REPO / "chaos" / "runs")
    soak.add_argument(
        "--skip-kinds", type=parse_kinds, default=[], help="fault kinds not to inject"
    )
    soak.add_argument("--lanes", type=parse_lanes, default=1, help=LANES_HELP)
    soak.add_argument("--kinds", type=parse_only_kinds, default=[], help=KINDS_HELP)
    soak.add_argument(
        "--faults",
        type=parse_faults,
        default=0,
        help="stop once the scenarios played this many faults of the kinds played (0: no bound)",
    )
    summary = sub.add_parser(
        "summary", help="the summary line over saved runs (e.g. a soak spread over days)"
    )
    summary.add_argument("out_dirs", type=Path, nargs="+", help="soak or run output folders")
    check = sub.add_parser("check", help="re-run the checker on a saved run directory")
    check.add_argument("run_dir", type=Path)
    return p


def skipped_kinds(
    backends: net.Backends, asked: list[str], only: list[str] | None = None
) -> dict[str, str]:
    """Kinds not injected in this run, each with the reason; kinds left out by ``--kinds``
    (``only``) are not listed."""
    out = dict.fromkeys(asked, "--skip-kinds")
    if backends.freezer_skip:
        out[nemesis.FREEZE_HOST] = backends.freezer_skip
    return {k: why for k, why in out.items() if not only or k in only}


def played_kinds(skip: dict[str, str], only: list[str]) -> tuple[str, ...]:
    """The kinds a run injects: those of ``only`` (every kind when empty) not skipped."""
    return tuple(k for k in nemesis.ALL_FAULTS if k not in skip and (not only or k in only))


def faults_of(results: list[ScenarioResult], kinds: tuple[str, ...]) -> int:
    """How many faults of ``kinds`` the scenarios played."""
    return sum(n for r in results for k, n in fault_kinds(r.run_dir).items() if k in kinds)


def configs(
    seeds: list[int],
    scenarios: list[str],
    duration_s: float,
    kinds: tuple[str, ...] = nemesis.ALL_FAULTS,
    lanes: int = 1,
) -> list[ScenarioConfig]:
    out: list[ScenarioConfig] = []
    t = nemesis.FaultTimeouts()
    for seed in seeds:
        if "targeted" in scenarios:
            # Workers on relayed streams here (every kind once), on the leader's streams in
            # the random scenario: both ways a worker heartbeats are played.
            out.append(
                ScenarioConfig(
                    "targeted",
                    seed,
                    nemesis.targeted_schedule(seed, t, kinds),
                    relay_heartbeats=True,
                )
            )
        if "random" in scenarios:
            out.append(
                ScenarioConfig(
                    "random",
                    seed,
                    nemesis.random_schedule(seed, duration_s, t, kinds, lanes),
                    submit_interval_s=SUBMIT_INTERVAL_S * lane_load(lanes),
                )
            )
    if membership.SCENARIO in scenarios:
        for seed in seeds:
            steps = membership.schedule(seed)
            out.append(
                ScenarioConfig(
                    membership.SCENARIO,
                    seed,
                    steps,
                    replicas=membership.REPLICAS,
                    relay_heartbeats=True,
                )
            )
    if "broken-build" in scenarios:
        out.append(
            ScenarioConfig(
                "broken-build",
                seeds[0],
                nemesis.broken_build_schedule(),
                member_ms=(15000, 18000),
                # Small gangs and a light load, so that the cut gang's next attempt
                # finds room at once and overlaps the members the broken build leaves
                # running on the cut worker.
                submit_interval_s=5.0,
                gang_sizes=(2,),
                gpus_per_member=(1,),
                unsafe_no_self_fencing=True,
                array_share=0.0,  # no array's tasks to crowd out the cut gang's next attempt
                sbatch_share=0.0,  # nor allocations
                replace_share=0.0,  # every gang requeued whole, as the rules it proves expect
                elastic_share=0.0,  # every gang of one size
                paced_share=0.0,  # nor gangs of members on nodes of their own
            )
        )
    return out


def describe(result: ScenarioResult, duration_s: float) -> str:
    reproduce = (
        f"python -m chaos run --scenarios {result.name} --seeds {result.seed} "
        f"--duration {duration_s:g}" + (f" --lanes {result.lanes}" if result.lanes > 1 else "")
    )
    if result.expect_violations:
        if result.error:
            return f"chaos: broken-build check ABORTED ({result.error}); run dir {result.run_dir}"
        if result.violations:
            kinds = sorted({v.kind for v in result.violations})
            return (
                f"chaos: broken build (self-fencing disabled) caught as it should be: "
                f"{len(result.violations)} violations ({', '.join(kinds)})"
            )
        return (
            "chaos: broken build (self-fencing disabled) was NOT caught; reproduce: "
            f"{reproduce}; run directory kept: {result.run_dir}"
        )
    if result.error:
        return (
            f"chaos: scenario {result.name} seed {result.seed} ABORTED: {result.error}; "
            f"reproduce: {reproduce}; run directory kept: {result.run_dir}"
        )
    if result.violations:
        return (
            f"chaos: {len(result.violations)} violations in scenario {result.name} seed "
            f"{result.seed}; reproduce: {reproduce}; run directory kept: {result.run_dir}"
        )
    return (
        f"chaos: scenario {result.name} seed {result.seed}: {result.faults} faults, "
        f"{result.jobs} jobs, 0 violations ({result.run_dir})"
    )


def soak_plan(
    first_seed: int, duration_s: float, kinds: tuple[str, ...], lanes: int = 1
) -> Iterator[ScenarioConfig]:
    """Endless: a random scenario per seed from ``first_seed`` on, and every tenth seed
    the targeted one too (every kind at least once in a while)."""
    seed = first_seed
    while True:
        names = ["random", "targeted"] if seed % 10 == 0 else ["random"]
        yield from configs([seed], names, duration_s, kinds, lanes)
        seed += 1


def fault_kinds(run_dir: Path) -> Counter[str]:
    """How many faults of each kind a scenario's ``faults.jsonl`` records."""
    return Counter(str(r["kind"]) for r in ledger.read_records(run_dir / ledger.FAULTS))


def sbatch_counts(run_dir: Path) -> Counter[str]:
    """The sbatch jobs, job steps and tasks a scenario's ``steps.jsonl`` records."""
    return Counter(step_counts(History(steps=load_steps(run_dir / ledger.STEPS))))


def summary_line(results: list[ScenarioResult], skipped: list[str], seconds: float) -> str:
    """The one line CI and the soak print: faults, kinds, jobs, violations, skipped kinds,
    faults per scenario, and the time the scenarios took."""
    real = [r for r in results if not r.expect_violations]
    kinds: Counter[str] = Counter()
    per_scenario: Counter[str] = Counter()
    sbatch: Counter[str] = Counter()
    for r in results:
        kinds.update(fault_kinds(r.run_dir))
        per_scenario[r.name] += r.faults
    for r in real:
        sbatch.update(sbatch_counts(r.run_dir))
    return (
        f"chaos: {sum(r.faults for r in results)} faults, {len(kinds)} kinds, "
        f"{sum(r.jobs for r in real)} jobs ({sbatch['jobs']} sbatch: {sbatch['steps']} steps, "
        f"{sbatch['tasks']} tasks), {sum(len(r.violations) for r in real)} violations, "
        f"{len(skipped)} kinds skipped"
        + (f" ({'; '.join(skipped)})" if skipped else "")
        + "; "
        + " ".join(f"{name}={n}" for name, n in sorted(per_scenario.items()))
        + f"; {seconds:.0f} s"
    )


def write_summary(
    out: Path, results: list[ScenarioResult], skipped: list[str], line: str, duration_s: float
) -> None:
    """``summary.json`` of a run or soak, and its summary line; what kinds found nothing
    to act on, on stderr."""
    real = [r for r in results if not r.expect_violations]
    # An elastic kind that never made a gang grow or shrink tested nothing of it: said and
    # recorded. Not a failure: a fault without a workload's gang to resize submits one of
    # its own, which starts at its min (and cannot shrink) where only one node has room
    # when it is placed (elastic-shrink alone: 23 of 26 faults resized a gang; docs/chaos.md).
    unchanged = elasticfaults.unchanged_kinds([r.run_dir / ledger.FAULTS for r in results])
    # Likewise a slow-node fault that found no paced gang to throttle (chaos/slowfaults.py).
    unfound = slowfaults.unfound([r.run_dir / ledger.FAULTS for r in results])
    preempted = preemption_kinds(results)
    summary = {
        "faults": sum(r.faults for r in results),
        "jobs": sum(r.jobs for r in real),
        "violations": sum(len(r.violations) for r in real),
        "skipped_kinds": skipped,
        "elastic_unchanged": unchanged,
        "slow_unfound": unfound,
        "preemptions": preempted,
        "line": line,
    }
    (out / "summary.json").write_text(
        json.dumps({**summary, "scenarios": [describe(r, duration_s) for r in results]}, indent=2)
        + "\n",
        encoding="utf-8",
    )
    print(line, flush=True)
    kinds = " ".join(f"{k}={n}" for k, n in preempted.items())
    print(f"chaos: preempted attempts: {kinds}", flush=True)
    for text in unchanged:
        print(f"chaos: {text}: the kind never made an elastic gang resize", file=sys.stderr)
    for text in unfound:
        print(f"chaos: {text}: nothing throttled, nothing marked", file=sys.stderr)


def preemption_kinds(results: list[ScenarioResult]) -> dict[str, int]:
    """Preempted attempts of each kind in the scenarios but the broken build (from their
    ``report.json``)."""
    total = dict.fromkeys(fair_rules.KINDS, 0)
    for r in results:
        path = r.run_dir / "report.json"
        if r.expect_violations or not path.exists():
            continue
        for kind, n in json.loads(path.read_text(encoding="utf-8")).get("preemptions", {}).items():
            total[kind] = total.get(kind, 0) + int(n)
    return total


def fair_share_unexercised(results: list[ScenarioResult]) -> str:
    """Why the run did not exercise fair-sharing preemption; "" when a fair-share
    preemption happened, or when no scenario but the broken build ran."""
    real = [r for r in results if not r.expect_violations]
    if not real or preemption_kinds(results)[fair_rules.FAIR_SHARE]:
        return ""
    names = ", ".join(f"{r.name} seed {r.seed}" for r in real)
    return (
        f"no fair-share preemption in {names}: the workload did not exercise fair-sharing "
        f"preemption (report.json: preemptions)"
    )


def cmd_run(args: argparse.Namespace) -> int:
    """The machine lock is taken per scenario, so that a long soak lets other runs take
    turns with it instead of making them wait for hours."""
    try:
        with net.machine_lock():
            backends = net.preflight()
    except net.NetError as exc:
        print(f"chaos: preflight failed: {exc}", file=sys.stderr)
        return 2
    print(
        f"chaos: backends: partitions {backends.partitions}; latency {backends.latency}; "
        f"loss {backends.loss}; freezer {backends.freezer or 'none'}; disks {backends.disks}; "
        f"clock {backends.clock}; toxiproxy {backends.toxiproxy}",
        flush=True,
    )
    skip = skipped_kinds(backends, args.skip_kinds, args.kinds)
    skipped = [f"{kind}: {why}" for kind, why in sorted(skip.items())]
    for line in skipped:
        print(f"chaos: skipping {line}", flush=True)
    kinds = played_kinds(skip, args.kinds)
    if not kinds:
        print("chaos: every kind asked for is skipped: nothing to play", file=sys.stderr)
        return 2
    out = args.out / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    if args.command == "soak":
        deadline = time.monotonic() + args.minutes * 60.0

        plan = soak_plan(args.first_seed, args.duration, kinds, args.lanes)
    else:
        plan = iter(configs(args.seeds, args.scenarios, args.duration, kinds, args.lanes))
    results: list[ScenarioResult] = []
    failed = False
    began = time.monotonic()
    for cfg in plan:
        if args.command == "soak" and time.monotonic() >= deadline:
            break
        if args.command == "soak" and args.faults and faults_of(results, kinds) >= args.faults:
            break
        started = time.monotonic()
        try:
            with net.machine_lock():
                result = run_scenario(cfg, out, backends)
        except net.NetError as exc:
            print(f"chaos: {exc}", file=sys.stderr)
            return 2
        time.sleep(net.LOCK_POLL_S * 3)  # a waiting run gets its turn before the next scenario
        write_report(result.run_dir, result.violations, result.faults, result.jobs)
        results.append(result)
        print(f"{describe(result, args.duration)} [{time.monotonic() - started:.0f} s]", flush=True)
        for v in result.violations[:20] if not result.expect_violations else []:
            print(f"  {v}", flush=True)
        failed = failed or not result.passed
        if args.command == "soak":
            print(summary_line(results, skipped, time.monotonic() - began), flush=True)
    line = summary_line(results, skipped, time.monotonic() - began)
    write_summary(out, results, skipped, line, args.duration)
    # A warning, not a failure: CI's run has seen as few as two fair-share preemptions,
    # and a run without one is a thinner run, not a broken cluster.
    unexercised = fair_share_unexercised(results)
    if unexercised:
        print(f"chaos: WARNING: {unexercised}", file=sys.stderr, flush=True)
    return 1 if failed else 0


def saved_result(run_dir: Path) -> ScenarioResult:
    """A finished scenario as its ``report.json`` recorded it."""
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    meta = json.loads((run_dir / "meta.json").read_text(encoding="utf-8"))
    violations = []
    for text in report.get("violations", []):
        m = re.fullmatch(r"(\S+) \[(.*?)\]: (.*)", text, flags=re.DOTALL)
        kind, job, detail = m.groups() if m else ("unparsed", "", text)
        violations.append(Violation(kind, "" if job == "-" else job, detail))
    return ScenarioResult(
        name=str(meta["scenario"]),
        seed=int(meta["seed"]),
        run_dir=run_dir,
        faults=int(report["faults"]),
        jobs=int(report["jobs"]),
        violations=violations,
        expect_violations=bool(report.get("unsafe_no_self_fencing")),
        error=str(report.get("error", "")),
        lanes=int(meta.get("lanes", 1)),
    )


def cmd_summary(args: argparse.Namespace) -> int:
    """One summary line over every finished scenario below the given folders (a scenario
    without ``report.json`` was cut short and is left out); the time is the sum of the
    scenarios' own times (cluster start to check), without the gaps between runs."""
    results: list[ScenarioResult] = []
    seconds = 0.0
    for out in args.out_dirs:
        if not out.is_dir():
            print(f"chaos summary: {out} is not a folder", file=sys.stderr)
            return 2
        for report in sorted(out.rglob("report.json")):
            result = saved_result(report.parent)
            results.append(result)
            meta = json.loads((report.parent / "meta.json").read_text(encoding="utf-8"))
            seconds += (int(meta.get("end_ns", 0)) - int(meta.get("start_ns", 0))) / 1e9
            if not result.passed:
                what = result.error or f"{len(result.violations)} violations"
                print(f"chaos: {result.name} seed {result.seed}: {what} ({result.run_dir})")
    if not results:
        print(f"chaos summary: no finished scenario below {', '.join(map(str, args.out_dirs))}")
        return 2
    print(f"chaos summary: {len(results)} scenarios")
    print(summary_line(results, [], seconds))
    failed = any(not r.passed for r in results)
    return 1 if failed else 0


def cmd_check(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not (run_dir / "meta.json").exists():
        print(f"chaos check: {run_dir} is not a run directory (no meta.json)", file=sys.stderr)
        return 2
    violations = check_run(run_dir)
    for v in violations:
        print(v)
    print(f"chaos check: {len(violations)} violations in {run_dir}")
    return 1 if violations else 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args.command == "preflight":
        try:
            with net.machine_lock():
                backends = net.preflight()
        except net.NetError as exc:
            print(f"chaos: preflight failed: {exc}", file=sys.stderr)
            return 2
        print("chaos: preflight ok")
        print(
            f"  partitions: {backends.partitions}\n  latency: {backends.latency}\n"
            f"  toxiproxy: {backends.toxiproxy}"
        )
        return 0
    if args.command == "sweep":
        try:
            with net.machine_lock():
                removed = [*net.sweep(), *hosts.sweep()]
        except net.NetError as exc:
            print(f"chaos: sweep failed: {exc}", file=sys.stderr)
            return 2
        for item in removed:
            print(f"removed {item}")
        return 0
    if args.command in ("run", "soak"):
        return cmd_run(args)
    if args.command == "summary":
        return cmd_summary(args)
    return cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
