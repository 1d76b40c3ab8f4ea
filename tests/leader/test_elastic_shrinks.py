"""The leader proposes the shrinks a scheduling pass chose as a preemptor's victims
(leader/elastic.py): once, never while another resize is in flight, and nudges the shrunk
gang's nodes once the shrink committed."""

from __future__ import annotations

from concurrent.futures import Future

from synapse_ha.core import commands as c
from synapse_ha.core.model import ClusterState
from synapse_ha.leader.elastic import Elasticity
from synapse_ha.leader.in_flight import InFlight
from tests.core.harness import job
from tests.core.test_elastic_reclaim import HOUR, elastic, lab, start


def test_the_pass_shrinks_are_proposed_once_and_their_nodes_nudged_after() -> None:
    cl = lab(16, 16)
    big = start(cl, elastic(job("big", queue="b", gpu=8, replicas=4, priority=5), 1))
    cl.now += HOUR
    cl.submit(job("mine", queue="a", gpu=8, replicas=1))
    shrinks = cl.plan().shrink_commands()
    assert [s.job_id for s in shrinks] == [big]
    proposed: list[tuple[c.Command, Future[c.Result]]] = []

    def propose(command: c.Command, now_ms: int) -> InFlight:
        future: Future[c.Result] = Future()
        proposed.append((command, future))
        return InFlight(future, now_ms, 10_000)

    elasticity = Elasticity(propose)
    state: ClusterState = cl.state
    said = elasticity.shrink_for_preemptors(state, shrinks, cl.now)
    assert said == [f"{shrinks[0].for_job} shrinks {big} to 3 members"]
    assert [command for command, _ in proposed] == shrinks
    # In flight: not proposed again, and no other resize either.
    assert elasticity.shrink_for_preemptors(state, shrinks, cl.now) == []
    assert elasticity.step(state, cl.now) == ([], ())
    proposed[0][1].set_result(cl.do(proposed[0][0]))
    _, nudged = elasticity.step(state, cl.now)
    attempt = cl.state.jobs[big].attempt
    assert attempt is not None
    assert nudged == tuple(sorted({m.node_id for m in attempt.members}))
