"""Multi-tenancy benchmark: one multi-tenant workload under the three preemption modes
(off, blind, topology), side by side, through the real scheduler and ``apply``.

Workload: ``synapse_ha.sim.tenants.multi_tenant`` (four queues of 64 GPUs in one
cohort on 32 x 8 GPUs: steady, bursty, steady with some whole-rack gangs, and one idle
queue that arrives after two hours with whole-rack gangs, the reclaim case). Victims
take the whole 30 s grace to stop; passes run every 0.5 s as the leader's do.

Prints JSON (the figures per mode and the targets evaluated) to stdout, writes it to
bench/results/tenancy.json, and prints the side-by-side table to stderr. ``--smoke``
runs a small version in a few seconds so the benchmark cannot rot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.sim.tenancy import report, run_modes, table
from synapse_ha.sim.tenants import multi_tenant

RESULTS = Path(__file__).resolve().parent / "results" / "tenancy.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=12.0, help="hours of arrivals")
    parser.add_argument("--hosts", type=int, default=32, help="8-GPU hosts, 8 to a rack")
    parser.add_argument("--smoke", action="store_true", help="a small, quick run")
    args = parser.parse_args()
    hours = 4.0 if args.smoke else args.hours
    workload = multi_tenant(seed=args.seed, hours=hours, hosts=args.hosts)
    started = time.perf_counter()
    results = run_modes(workload)
    out = report(workload, results)
    out["seed"] = args.seed
    out["wall_s"] = round(time.perf_counter() - started, 2)
    print(table(results), file=sys.stderr)
    text = json.dumps(out, indent=2)
    print(text)
    if not args.smoke:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()
