"""Fair-sharing preemption on the multi-tenant workload, seed by seed: ``blind``,
``topology`` and ``fair`` (topology with ``fair_sharing_preemption`` on in the cohort,
:func:`synapse_ha.sim.tenancy.with_fair_sharing`), through the real scheduler and
``apply``, a pass every 0.5 s as the leader plans.

Per seed and policy: Jain's index among backlogged queues, the queueing delay (mean,
p50, p95), GPU-hours lost to preemption in all and per preemptor placed, and the
preemptions by kind. For ``fair``, where the rest of Jain's shortfall lies, split as
``bench/jain_gaps.py`` splits it (its categories: a queue below its nominal that reclaim
could serve, one it could not, one whose every pending gang is bigger than what it
misses to its nominal, and unequal borrowing). ``summary`` gives each figure's mean and
range over the seeds, and each seed's ``fair`` Jain against the 0.95 target; the same
shortfall split by phase (while jobs arrive, after the last arrival) and, for a gang too
big, by cause (the cohort full, or no room: ``bench/jain_gaps.py``).

``--half-life-h`` sets ``fair_share_half_life_ms`` for every policy (the default is the
cluster's, 7 days: over a 12-hour workload the shares are then what queues hold now).
``--reservations K`` keeps a reservation for each of the first K gangs of a pass that
cannot be placed (``ClusterConfig.reservations_per_pass``, default 1) for every policy.
``--format N`` runs every policy on a cluster that reads format N (default: this
release's newest), to compare the rules of a format with those of the one before.

Prints JSON (``--out`` also writes it); ``--smoke`` runs one seed of one hour on 16 hosts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.jain_gaps import CATEGORIES, PHASES, TOO_BIG_CAUSES, DiagnosedRun
from synapse_ha.core.cluster_config import (
    FAIR_SHARE_HALF_LIFE_MS,
    ClusterConfig,
    PreemptionMode,
)
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.model import ClusterState
from synapse_ha.sim.engine import GRACE_MS, Pacing, Result, Run, build_cluster
from synapse_ha.sim.estimates import with_reservations
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.tenancy import FAIR, JAIN_TARGET, PASS_INTERVAL_MS, with_fair_sharing
from synapse_ha.sim.tenants import multi_tenant
from synapse_ha.sim.workload import Workload

MODES = (PreemptionMode.BLIND, PreemptionMode.TOPOLOGY)


def _figures(result: Result) -> dict[str, Any]:
    m = result.metrics
    t = m["tenancy"]
    delay = m["queue_delay_s"]
    return {
        "jain_backlogged": t["jain_backlogged"],
        "delay_mean_s": delay["mean"],
        "delay_p50_s": delay["p50"],
        "delay_p95_s": delay["p95"],
        "gpu_hours_lost": t["gpu_hours_lost"],
        "gpu_hours_lost_per_preemptor_placed": t["gpu_hours_lost_per_preemptor_placed"],
        "preemptions_by_kind": t["preemptions_by_kind"],
        "preempt_commands_rejected": t["preempt_commands_rejected"],
    }


def _state(workload: Workload, config: ClusterConfig, floor: int | None) -> ClusterState:
    """The cluster of ``workload`` on ``config``, reading format ``floor`` when given."""
    state = build_cluster(workload, config)
    if floor is not None:
        state.format_floor = floor
    return state


def _mode(workload: Workload, config: ClusterConfig, floor: int | None) -> Result:
    """One mode's run, as ``simulate`` runs it, on a cluster reading format ``floor``."""
    run = Run(workload, Ours(), _state(workload, config, floor), Pacing(GRACE_MS, PASS_INTERVAL_MS))
    started = time.perf_counter()
    run.run()
    return run.result(time.perf_counter() - started)


def _fair(
    workload: Workload, config: ClusterConfig, floor: int | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fair run's figures and the split of its Jain shortfall."""
    fair = with_fair_sharing(workload)
    state = _state(fair, replace(config, preemption=PreemptionMode.TOPOLOGY), floor)
    run = DiagnosedRun(fair, Ours(), state, Pacing(GRACE_MS, PASS_INTERVAL_MS))
    started = time.perf_counter()
    run.run()
    figures = _figures(run.result(time.perf_counter() - started))
    diagnosis = run.diagnosis()
    split = {cat: diagnosis["categories"][cat]["share_of_shortfall"] for cat in CATEGORIES}
    split |= diagnosis["by_phase"] | diagnosis["gang_too_big_by_cause"]
    return figures, split


def one_seed(
    seed: int,
    hours: float,
    hosts: int,
    half_life_ms: int,
    floor: int | None = None,
    reservations: int = 1,
) -> dict[str, Any]:
    workload = multi_tenant(seed=seed, hours=hours, hosts=hosts)
    config = ClusterConfig(retention_ms=0, fair_share_half_life_ms=half_life_ms)
    config = with_reservations(config, reservations)
    out: dict[str, Any] = {"seed": seed, "jobs": len(workload.jobs), "policies": {}}
    for mode in MODES:
        result = _mode(workload, replace(config, preemption=mode), floor)
        out["policies"][str(mode)] = _figures(result)
    fair, split = _fair(workload, config, floor)
    out["policies"][FAIR] = fair
    out["fair_jain_shortfall_split"] = split
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {
        "mean": round(statistics.fmean(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(runs[0]["policies"])
    keys = [k for k, v in runs[0]["policies"][names[0]].items() if not isinstance(v, dict)]
    out: dict[str, Any] = {
        name: {
            key: _spread(
                [r["policies"][name][key] for r in runs if r["policies"][name][key] is not None]
            )
            for key in keys
        }
        for name in names
    }
    jain = [r["policies"][FAIR]["jain_backlogged"] for r in runs]
    out["fair_jain_target"] = {
        "target": f"Jain's index among backlogged queues >= {JAIN_TARGET} in every seed",
        "per_seed": jain,
        "met": all(j is not None and j >= JAIN_TARGET for j in jain),
    }
    out["fair_jain_shortfall_split"] = {
        cat: round(statistics.fmean(r["fair_jain_shortfall_split"][cat] for r in runs), 4)
        for cat in (*CATEGORIES, *PHASES, *TOO_BIG_CAUSES)
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument(
        "--half-life-h",
        type=float,
        default=FAIR_SHARE_HALF_LIFE_MS / 3_600_000,
        help="fair_share_half_life for every policy, hours (default: the cluster's)",
    )
    parser.add_argument(
        "--format", type=int, default=None, help="the format the cluster reads (default: newest)"
    )
    parser.add_argument(
        "--reservations", type=int, default=1, metavar="K", help="reservations per pass"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--smoke", action="store_true", help="one seed, one hour, 16 hosts")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.hours, args.hosts = 1, 1.0, 16
    for flag, value in (("--seeds", args.seeds), ("--hosts", args.hosts)):
        if value < 1:
            parser.error(f"{flag}: at least 1, got {value}")
    for flag, number in (("--hours", args.hours), ("--half-life-h", args.half_life_h)):
        if not number > 0:
            parser.error(f"{flag}: a number above 0, got {number}")
    try:
        with_reservations(ClusterConfig(), args.reservations)
    except ValueError as exc:
        parser.error(f"--reservations: {exc}")
    half_life_ms = max(round(args.half_life_h * 3_600_000), 1)
    started = time.perf_counter()
    runs = [
        one_seed(seed, args.hours, args.hosts, half_life_ms, args.format, args.reservations)
        for seed in range(1, args.seeds + 1)
    ]
    result = {
        "bench": "fair_preemption",
        "hours": args.hours,
        "hosts": args.hosts,
        "fair_share_half_life_h": round(half_life_ms / 3_600_000, 3),
        "format": args.format or FORMAT,
        "reservations": args.reservations,
        "summary": summary(runs),
        "runs": runs,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
