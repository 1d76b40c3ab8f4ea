"""What the cohort tree costs a scheduling pass (core/queues/cohort_tree.py, DESIGN §8).

The same cluster — ``nodes`` nodes of 8 GPUs in racks of 16, ``queues`` queues of 8
nominal GPUs each, three queues of four running a gang of 8 GPUs, one of those a second
one (borrowed from the idle fourth), and
``pending`` gangs of 8 GPUs waiting, spread over the queues — scheduled in two shapes:

* ``flat``: every queue in one cohort without records (the rule as before the tree);
* ``tree``: an organisation with ``teams`` teams, each with its own borrowing and
  lending limits, the queues spread over the teams (two levels of cohort records).

For each shape: the median time of a whole pass (``schedule``) and of the tree's answer
to one queue's "how many GPUs may it still borrow" (``CohortTree.borrowable``: a pass
asks it once per queue and change of usage), over ``rounds`` rounds, the two shapes'
rounds interleaved. Prints JSON. ``--smoke`` runs a tiny version in a second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Cohort, Queue
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, NodeInfo, Resources
from synapse_ha.core.queues.quota import QueueUsage
from synapse_ha.core.scheduler import schedule


def _node(i: int) -> NodeInfo:
    return NodeInfo(
        node_id=f"n{i:05d}",
        address=f"127.0.0.1:{20_000 + i}",
        capacity=Resources(128_000, 1_024 * 1_024, 8),
        topology=(("zone", "z1"), ("block", f"b{i // 128}"), ("rack", f"r{i // 16}")),
    )


def _spec(queue: str) -> JobSpec:
    return JobSpec(
        name="bench", replicas=1, resources=Resources(1_000, 1_024, 8), command=("true",),
        queue=queue,
    )  # fmt: skip


SHAPES = ("flat", "tree")


def build(shape: str, nodes: int, queues: int, teams: int, pending: int) -> ClusterState:
    state = ClusterState(format_floor=FORMAT)
    for i in range(nodes):
        assert apply(state, c.RegisterNode(_node(i), 0)).ok
    if shape == "tree":
        assert apply(state, c.SetCohort(Cohort("org"), 0)).ok
        for t in range(teams):
            team = Cohort(f"team-{t}", "org", borrowing_limit_gpu=64, lending_limit_gpu=64)
            assert apply(state, c.SetCohort(team, 0)).ok
    for q in range(queues):
        cohort = f"team-{q % teams}" if shape == "tree" else "lab"
        assert apply(state, c.SetQueue(Queue(f"q{q:04d}", gpu=8, cohort=cohort), 0)).ok
    # Running: one gang (its nominal) in three queues of four, and one more (borrowed
    # from the idle fourth) in one of them.
    running = [q for q in range(queues) if q % 4 != 3] + [q for q in range(queues) if q % 4 == 0]
    for i, q in enumerate(running):
        made = apply(state, c.SubmitJob(_spec(f"q{q:04d}"), f"run-{i}", 1))
        assert made.ok, made.message
    bind = schedule(state, 2).command(2)
    if bind is not None:
        apply(state, bind)
    for p in range(pending):
        assert apply(state, c.SubmitJob(_spec(f"q{p % queues:04d}"), f"wait-{p}", 3)).ok
    return state


def _once_ms(fn: object) -> float:
    assert callable(fn)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def _every_question(usage: QueueUsage, names: list[str]) -> None:
    """The tree's own answer for each queue, as a pass's first question of it gets it
    (a usage keeps the answer until it changes)."""
    for name in names:
        usage.tree.borrowable(name)


def measure(nodes: int, queues: int, teams: int, pending: int, rounds: int) -> list[dict]:
    """Both shapes, their rounds interleaved (flat, tree, flat, ...) so that a change in
    the machine's load between rounds falls on both alike."""
    states = {shape: build(shape, nodes, queues, teams, pending) for shape in SHAPES}
    passes: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    questions: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for _ in range(rounds):
        for shape, state in states.items():
            passes[shape].append(_once_ms(partial(schedule, state, 4)))
            names = sorted(state.queues)
            ask = partial(_every_question, QueueUsage.of(state), names)
            questions[shape].append(_once_ms(ask) * 1000 / len(names))
    out = []
    for shape, state in states.items():
        out.append(
            {
                "shape": shape,
                "cohort_records": len(state.cohorts),
                "running_gangs": sum(
                    1 for j in state.jobs.values() if j.live_attempt() is not None
                ),
                "pass_ms": round(statistics.median(passes[shape]), 3),
                "pass_ms_each_round": [round(v, 1) for v in passes[shape]],
                "headroom_us": round(statistics.median(questions[shape]), 2),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--queues", type=int, default=256)
    parser.add_argument("--teams", type=int, default=16)
    parser.add_argument("--pending", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    sizes = (
        (32, 16, 4, 50, 2)
        if args.smoke
        else (args.nodes, args.queues, args.teams, args.pending, args.rounds)
    )
    out = {
        "nodes": sizes[0],
        "queues": sizes[1],
        "teams": sizes[2],
        "pending": sizes[3],
        "rounds": sizes[4],
        "shapes": measure(*sizes),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
