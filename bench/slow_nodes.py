"""Slow-node benchmark: the detector (``synapse_ha.core.health.slowness``) on the
simulator's slow nodes and noise (``synapse_ha.sim.slow_nodes``).

Headline: 256 hosts of 8 GPUs (2,048 GPUs), 7 days of the training mix's multi-node
gangs, nodes turning slow at 20 per 1,000 node-days (20 % to 50 % slower, until marked
and repaired 24 h later), 15-minute windows, the default rule (15 %, 3 of the last 5
windows), seeds 1 to ``--seeds``, pooled. The rate is chosen to give enough slow nodes to
count (a few dozen per seed), not as a field figure.

Target: at least 90 % of slow nodes (>= 20 % slower) marked within 3 gangs,
at most 1 % of healthy nodes ever marked. Printed as met or missed, with the figures.

The sweep changes one thing at a time on fewer seeds: the window's length, the threshold,
the span, flapping slow nodes, slowdowns under the target's 20 %, three times the blips.

Prints JSON to stdout (and writes bench/results/slow_nodes.json), a table to stderr.
``--smoke`` runs one small seed in a few seconds so the benchmark cannot rot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core.health.slowness import SlownessRule
from synapse_ha.sim.slow_nodes import WINDOW_MS, PaceNoise, SlowNodeModel, evaluate

RESULTS = Path(__file__).resolve().parent / "results" / "slow_nodes.json"
MODEL = SlowNodeModel()
NOISE = PaceNoise()
RULE = SlownessRule()
# name -> (model, noise, rule, window ms): one change from the headline each.
SWEEP: dict[str, tuple[SlowNodeModel, PaceNoise, SlownessRule, int]] = {
    "10-minute windows": (MODEL, NOISE, RULE, 600_000),
    "20-minute windows": (MODEL, NOISE, RULE, 1_200_000),
    "threshold 10 %": (MODEL, NOISE, replace(RULE, threshold_pct=10), WINDOW_MS),
    "threshold 20 %": (MODEL, NOISE, replace(RULE, threshold_pct=20), WINDOW_MS),
    "3 of the last 3": (MODEL, NOISE, replace(RULE, span=3), WINDOW_MS),
    "flapping: slow in half the windows": (replace(MODEL, duty=0.5), NOISE, RULE, WINDOW_MS),
    "slowdown 10-20 % (under the target's)": (
        replace(MODEL, slowdown_min=0.1, slowdown_max=0.2),
        NOISE,
        RULE,
        WINDOW_MS,
    ),
    "slowdown 20 % exactly": (
        replace(MODEL, slowdown_min=0.2, slowdown_max=0.2),
        NOISE,
        RULE,
        WINDOW_MS,
    ),
    "slowdown 20 % exactly, threshold 20 %": (
        replace(MODEL, slowdown_min=0.2, slowdown_max=0.2),
        NOISE,
        replace(RULE, threshold_pct=20),
        WINDOW_MS,
    ),
    "3 x the blips": (MODEL, replace(NOISE, blips_per_node_day=12.0), RULE, WINDOW_MS),
    "blips up to 30 min": (MODEL, replace(NOISE, blip_max_ms=1_800_000), RULE, WINDOW_MS),
}
SHOWN = (
    "slow_spells",
    "slow_spells_marked",
    "slow_spells_counted",
    "recall_within_3_gangs",
    "healthy_marked_share",
    "false_marks",
    "hours_onset_to_mark_p50",
    "gpu_hours_lost_to_slow_nodes",
    "gpu_hours_lost_after_the_mark",
    "gpu_hours_lost_without_detector",
)


def _line(name: str, result: dict[str, Any]) -> str:
    f, t = result["figures"], result["targets"]
    if f["recall_within_3_gangs"] is None:
        verdict = f"no slow node >= 20 %; {f['slow_spells_marked']} of {f['slow_spells']} marked"
    else:
        verdict = "met" if all(target["met"] for target in t.values()) else "MISSED"
    return (
        f"{name:<42} slow {f['slow_spells_counted']:>4}  recall {f['recall_within_3_gangs']!s:>6}"
        f"  healthy marked {f['healthy_nodes_marked']:>3}/{f['healthy_nodes']:<5}"
        f" ({f['healthy_marked_share']!s:>6})  to mark p50 {f['hours_onset_to_mark_p50']!s:>5} h"
        f"  GPU-h lost {f['gpu_hours_lost_to_slow_nodes']:>9.1f}"
        f" (after the mark {f['gpu_hours_lost_after_the_mark']:>8.1f})"
        f" (no detector {f['gpu_hours_lost_without_detector']:>9.1f})"
        f"  {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--sweep-seeds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    args = parser.parse_args()
    nodes, days = (32, 1.0) if args.smoke else (args.nodes, args.days)
    seeds = [1] if args.smoke else list(range(1, args.seeds + 1))
    sweep_seeds = [1] if args.smoke else list(range(1, args.sweep_seeds + 1))
    sweep = dict(list(SWEEP.items())[:1]) if args.smoke else SWEEP
    # The smoke run needs slow nodes in one short run: a higher rate.
    model = replace(MODEL, per_1000_node_days=200.0) if args.smoke else MODEL
    started = time.perf_counter()
    headline = evaluate(nodes, days, model, NOISE, RULE, WINDOW_MS, seeds)
    print(_line("headline", headline), file=sys.stderr)
    variants = {}
    for name, (m, noise, rule, window_ms) in sweep.items():
        m = replace(m, per_1000_node_days=model.per_1000_node_days)
        variants[name] = evaluate(nodes, days, m, noise, rule, window_ms, sweep_seeds)
        print(_line(name, variants[name]), file=sys.stderr)
    out = {
        "benchmark": "slow_nodes",
        "cluster": f"{nodes} x 8 GPUs, {days:g} days of the training mix's multi-node gangs",
        "model": model.describe(),
        "noise": NOISE.describe(),
        "rule": {"threshold_pct": RULE.threshold_pct, "strikes": RULE.strikes, "span": RULE.span},
        "window_minutes": WINDOW_MS / 60_000,
        "seeds": seeds,
        "target": "recall_within_3_gangs >= 0.9 and healthy_marked_share <= 0.01",
        "headline": headline,
        "targets_met": all(t["met"] for t in headline["targets"].values()),
        "sweep_seeds": sweep_seeds,
        "sweep": {
            name: {**{k: r["figures"][k] for k in SHOWN}, "targets": r["targets"]}
            for name, r in variants.items()
        },
        "wall_s": round(time.perf_counter() - started, 2),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if not args.smoke:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()
