"""The dashboard's cohort tree names a cohort's fair-sharing preemption switch when it
is on."""

from __future__ import annotations

from synapse_ha.observe.cohort_tree_page import render_cohort_tree
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def test_a_cohort_with_the_switch_on_says_so() -> None:
    answer = pb.ListQueuesResponse(
        cohorts=[
            pb.CohortStatus(cohort=pb.Cohort(name="lab", fair_sharing_preemption=True)),
            pb.CohortStatus(cohort=pb.Cohort(name="org")),
        ]
    )
    tree = render_cohort_tree(answer)
    assert "(may borrow any, may lend any), fair-sharing preemption</li>" in tree
    assert tree.count("fair-sharing preemption") == 1
