"""How soon srun's tasks start inside an allocation.

    python bench/srun_latency.py [--nodes 2] [--tasks-per-node 8] [--steps 20] [--smoke]

A ``--nodes``-node allocation's step daemons (synapse_ha.local.allocation: real
processes and sockets, the scheduler left out) run a batch script that starts
``--steps`` steps one after another, each of every allocation task (``srun true``-like:
each task writes the clock). Per step: from the moment srun is started (the clock read
just before it in the script) to its first and its last task's start, and srun's whole
run. Prints JSON: p50, p90 and max of each, in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

from synapse_ha.local.allocation import LocalAllocation

SCRIPT = r"""
i=0
while [ "$i" -lt {steps} ]; do
  echo "srun $i $(date +%s.%N)"
  srun sh -c 'echo "task $SLURM_STEP_ID $(date +%s.%N)"'
  echo "done $i $(date +%s.%N)"
  i=$((i + 1))
done
"""


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 4),
        "p90": round(ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)], 4),
        "max": round(ordered[-1], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks-per-node", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="2 steps of 2 x 2 tasks")
    args = parser.parse_args()
    if args.smoke:
        args.nodes, args.tasks_per_node, args.steps = 2, 2, 2
    with tempfile.TemporaryDirectory(prefix="srun-latency-") as root:
        local = LocalAllocation(Path(root))
        try:
            ran = local.run(
                SCRIPT.format(steps=args.steps),
                nodes=args.nodes,
                tasks_per_node=args.tasks_per_node,
                timeout_s=60.0 + 10.0 * args.steps,
            )
        finally:
            local.close()
    if ran.codes != [0] * args.nodes:
        sys.exit(f"the allocation failed: {ran.codes}\n{ran.outputs[0][-3000:]}")
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    tasks: dict[int, list[float]] = {}
    for line in ran.outputs[0].splitlines():
        word, number, at = [*line.split(), "", "", ""][:3]
        if word == "srun":
            started[int(number)] = float(at)
        elif word == "done":
            ended[int(number)] = float(at)
        elif word == "task":
            tasks.setdefault(int(number), []).append(float(at))
    steps = sorted(started)
    expected = args.nodes * args.tasks_per_node
    if len(steps) != args.steps or any(len(tasks.get(s, [])) != expected for s in steps):
        sys.exit(f"missing task lines:\n{ran.outputs[0][-3000:]}")
    report = {
        "nodes": args.nodes,
        "tasks_per_node": args.tasks_per_node,
        "steps": args.steps,
        "first_task_started_s": _quantiles([min(tasks[s]) - started[s] for s in steps]),
        "last_task_started_s": _quantiles([max(tasks[s]) - started[s] for s in steps]),
        "srun_whole_s": _quantiles([ended[s] - started[s] for s in steps]),
        "smoke": args.smoke,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
