"""The dashboard's cohort tree section: nested under their parents, with the numbers of
the ListQueues answer; no section for a cluster without cohorts."""

from __future__ import annotations

import re

from synapse_ha.observe.pages import Overview, render_overview
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def _answer() -> pb.ListQueuesResponse:
    return pb.ListQueuesResponse(
        queues=[
            pb.QueueStatus(
                queue=pb.Queue(name="nlp", gpu=32, cohort="research"),
                usage=pb.QueueUsage(used_gpu=56, borrowed_gpu=24),
            ),
            pb.QueueStatus(queue=pb.Queue(name="default")),
        ],
        cohorts=[
            pb.CohortStatus(
                cohort=pb.Cohort(name="org"), defined=True, nominal_gpu=80, used_gpu=76
            ),
            pb.CohortStatus(
                cohort=pb.Cohort(name="research", parent="org", borrowing_limit_gpu=16),
                defined=True,
                nominal_gpu=48,
                used_gpu=56,
                borrowed_gpu=8,
            ),
        ],
    )


def test_the_tree_nests_cohorts_and_queues_with_their_numbers() -> None:
    page = render_overview(Overview(queues=_answer()))
    assert "<h2>Cohort tree (GPUs)</h2>" in page
    tree = page[page.index('<ul id="cohort-tree">') :]
    # org contains research, which contains nlp.
    assert re.search(r'data-cohort="org">.*<ul><li data-cohort="research">.*'
                     r'<ul><li data-queue="nlp">', tree)  # fmt: skip
    assert "<b>research</b> nominal 48, used 56, borrowed 8 (may borrow 16, may lend any)" in tree
    assert "nlp (queue) nominal 32, used 56, borrowed 24" in tree
    assert 'data-queue="default"' not in tree


def test_no_tree_section_without_cohorts_or_queues() -> None:
    assert "Cohort tree" not in render_overview(Overview())
    flat = pb.ListQueuesResponse(queues=[pb.QueueStatus(queue=pb.Queue(name="default"))])
    assert "Cohort tree" not in render_overview(Overview(queues=flat))
