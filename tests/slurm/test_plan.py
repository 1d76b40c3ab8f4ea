"""Where a step's tasks run (synapse_ha.slurm.plan): Slurm's -N/-n/--ntasks-per-node/-w/-x
rules inside an allocation, block order, and SLURM_TASKS_PER_NODE."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse_ha.slurm.plan import StepAsk, StepRefused, Task, plan, tasks_per_node_text

HOSTS = ("a", "b", "c")


def where(tasks: list[Task]) -> list[tuple[int, int, int]]:
    return [(t.rank, t.node, t.local) for t in tasks]


def test_by_default_a_step_runs_the_allocations_tasks_on_every_node() -> None:
    assert where(plan(HOSTS, 1, StepAsk())) == [(0, 0, 0), (1, 1, 0), (2, 2, 0)]
    two = plan(("a", "b"), 2, StepAsk())
    assert where(two) == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert tasks_per_node_text(two) == "2(x2)"


def test_n_alone_uses_as_many_nodes_as_it_needs_and_blocks_the_rest() -> None:
    assert where(plan(HOSTS, 1, StepAsk(ntasks=1))) == [(0, 0, 0)]
    five = plan(HOSTS, 1, StepAsk(ntasks=5))
    assert [t.node for t in five] == [0, 0, 1, 1, 2]
    assert tasks_per_node_text(five) == "2(x2),1"


def test_nodes_nodelist_and_exclude() -> None:
    assert [t.node for t in plan(HOSTS, 1, StepAsk(nodes=1))] == [0]
    assert [t.node for t in plan(HOSTS, 1, StepAsk(nodelist=("c",)))] == [2]
    assert [t.node for t in plan(HOSTS, 1, StepAsk(nodes=2, nodelist=("c",)))] == [0, 2]
    assert [t.node for t in plan(HOSTS, 1, StepAsk(exclude=("a",)))] == [1, 2]
    per_node = plan(HOSTS, 1, StepAsk(nodes=2, ntasks_per_node=3))
    assert [t.node for t in per_node] == [0, 0, 0, 1, 1, 1]
    # A host holding two members is two nodes: -w names it twice to use both.
    same = ("h", "h")
    assert [t.node for t in plan(same, 1, StepAsk(nodelist=("h", "h")))] == [0, 1]


@pytest.mark.parametrize(
    ("ask", "rule"),
    [
        (StepAsk(nodes=4), "the allocation has 3 node(s)"),
        (StepAsk(nodes=2, exclude=("a", "b")), "has 1 node(s) this step may use"),
        (StepAsk(nodelist=("z",)), "-w z: not a node of this allocation"),
        (StepAsk(nodes=1, nodelist=("a", "b")), "-w names 2 nodes"),
        (StepAsk(nodes=3, ntasks=2), "fewer tasks than the step's 3"),
        (StepAsk(nodes=1, ntasks=3, ntasks_per_node=2), "more than --ntasks-per-node 2"),
        (StepAsk(ntasks=0), "give 1 or more"),
    ],
)
def test_a_step_the_allocation_cannot_hold_is_refused(ask: StepAsk, rule: str) -> None:
    with pytest.raises(StepRefused, match=rule.replace("(", r"\(").replace(")", r"\)")):
        plan(HOSTS, 1, ask)


@given(
    st.integers(1, 6),
    st.integers(1, 4),
    st.one_of(st.none(), st.integers(1, 6)),
    st.one_of(st.none(), st.integers(1, 30)),
)
def test_tasks_are_numbered_in_block_order_with_balanced_shares(
    nodes: int, per_node: int, step_nodes: int | None, ntasks: int | None
) -> None:
    hosts = tuple(f"n{i}" for i in range(nodes))
    try:
        tasks = plan(hosts, per_node, StepAsk(nodes=step_nodes, ntasks=ntasks))
    except StepRefused:
        return
    assert [t.rank for t in tasks] == list(range(len(tasks)))
    assert [t.node for t in tasks] == sorted(t.node for t in tasks)
    counts = [sum(1 for t in tasks if t.node == n) for n in sorted({t.node for t in tasks})]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)
    for node in {t.node for t in tasks}:
        assert [t.local for t in tasks if t.node == node] == list(range(counts[0]))[
            : sum(1 for t in tasks if t.node == node)
        ]
    if ntasks is not None:
        assert len(tasks) == ntasks
