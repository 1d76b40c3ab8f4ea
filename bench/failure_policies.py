"""Failure policies benchmark: the training workload under GPU failures, lived with by
requeueing the gang whole (``requeue``), by placing only the lost rank again
(``replace``), by placing it on a hot spare first (``replace+spares``), and with every
gang elastic from half its members to all of them, replacing a lost rank
(``elastic``, ``elastic+spares``), through the real scheduler and ``apply``, on the same
failures (synapse_ha.sim.recovery).

Workload: ``synapse_ha.sim.training.training`` on 256 x 8 GPUs (2,048 GPUs, racks of 8
hosts), ``--days`` of arrivals at 85 % offered load; gangs of 16 to 256 GPUs (8 a
member), three in five of them 64 GPUs or more, median run 4 h. One workload and one
failure stream per seed, the same under every policy. GPUs fail at the Llama 3 rate
(0.249 per 1,000 GPU-days) and, in the stress run, at ``--stress-scale`` times it;
checkpoints every 30 min of useful run time, a restart overhead of 60 s after every
failure and after every resize of an elastic gang (every policy), repair 24 h, one spare
per rack under replace+spares and elastic+spares (the stress run adds replace+spares
with one spare per block of 4 racks). An elastic gang's useful work goes at its size
over its max.

Target (judged on replace+spares, requeue's figure beside it): mean ETTR of gangs of
64+ GPUs >= 97 % and restart delay p50 <= 60 s, at the Llama 3 rate.

Prints JSON to stdout (and writes bench/results/failure_policies.json), the tables to
stderr. ``--smoke`` runs one small seed at a high rate in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.sim.gpu_failures import LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS, FailureModel
from synapse_ha.sim.recovery import Recovery, RecoveryModel, outcome, recovery_run
from synapse_ha.sim.recovery_figures import Outcome, figures
from synapse_ha.sim.recovery_report import PASS_INTERVAL_MS, table, targets
from synapse_ha.sim.training import training

RESULTS = Path(__file__).resolve().parent / "results" / "failure_policies.json"
LOAD = 0.85
CHECKPOINT_MS = 30 * 60_000


Variant = tuple[str, Recovery, RecoveryModel]  # a row's name, its policy and model
POLICIES: tuple[Variant, ...] = tuple((str(p), p, RecoveryModel()) for p in Recovery)
# The stress run adds spares at the block level (1 per 4 racks): a quarter of the price.
WITH_BLOCK_SPARES: tuple[Variant, ...] = (
    *POLICIES,
    ("replace+spares/block", Recovery.REPLACE_SPARES, RecoveryModel(spare_level="block")),
)


def measure(
    seeds: list[int], nodes: int, days: float, scale: float, variants: tuple[Variant, ...]
) -> dict[str, Any]:
    """Every variant on every seed's workload and failures; the outcomes merged over the
    seeds, their figures and the targets."""
    merged = {name: Outcome(name) for name, _, _ in variants}
    wall: dict[str, float] = dict.fromkeys(merged, 0.0)
    rate = LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS * scale
    for seed in seeds:
        workload = training(seed=seed, nodes=nodes, days=days, load=LOAD)
        model = FailureModel(per_1000_gpu_days=rate, checkpoint_ms=CHECKPOINT_MS, seed=seed)
        for name, policy, recovery_model in variants:
            started = time.perf_counter()
            run = recovery_run(
                workload, model, policy, recovery_model, pass_interval_ms=PASS_INTERVAL_MS
            )
            run.run()
            merged[name].add(outcome(run))
            wall[name] += time.perf_counter() - started
    by_variant = {name: {**figures(o), "policy": name} for name, o in merged.items()}
    return {
        "times_llama3_rate": scale,
        "gpu_failures_per_1000_gpu_days": round(rate, 4),
        "seeds": seeds,
        "days": days,
        "recovery_models": {name: m.describe() for name, _, m in variants},
        "figures": by_variant,
        "targets": targets(by_variant),
        "wall_s": {name: round(s, 1) for name, s in wall.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--days", type=float, default=10.0, help="days of arrivals per seed")
    parser.add_argument("--stress-scale", type=float, default=10.0, help="times the Llama 3 rate")
    parser.add_argument("--stress-days", type=float, default=7.0)
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.smoke:
        runs = {"smoke": measure([1], 16, 0.5, 1_000.0, POLICIES)}
    else:
        seeds = list(range(1, args.seeds + 1))
        stress = (args.stress_days, args.stress_scale, WITH_BLOCK_SPARES)
        runs = {
            "llama3_rate": measure(seeds, args.nodes, args.days, 1.0, POLICIES),
            "stress": measure([1], args.nodes, *stress),
        }
    nodes = 16 if args.smoke else args.nodes
    out = {
        "workload": f"training on {nodes} x 8 GPUs (racks of 8 hosts) at {LOAD:.0%} load",
        "checkpoint_minutes": CHECKPOINT_MS / 60_000,
        **runs,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    for name, run in runs.items():
        print(f"{name}: {run['times_llama3_rate']:g} x the Llama 3 rate, seeds {run['seeds']}, "
              f"{run['days']:g} days of arrivals each", file=sys.stderr)  # fmt: skip
        print(table(list(run["figures"].values())), file=sys.stderr)
        for target in run["targets"].values():
            print(f"  {target['rule']}: met={target['met']}", file=sys.stderr)
    text = json.dumps(out, indent=2)
    print(text)
    if not args.smoke:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()
