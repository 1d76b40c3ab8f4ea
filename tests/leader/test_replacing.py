"""The leader's side of member replacement (leader/replacing.py): lost ranks are placed
again at the next housekeeping step, the gang's nodes are nudged once that commits, and a
rank that cannot be placed within its timeout requeues the gang whole."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.model import JobState
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.replacement import ReplacePolicy
from tests.core.harness import job, node
from tests.leader.fakes import FakeLog
from tests.leader.test_leader import elected


class Nudges:
    def __init__(self) -> None:
        self.targets: list[list[tuple[str, str]]] = []

    def nudge(self, targets: Sequence[tuple[str, str]]) -> None:
        self.targets.append(list(targets))


def running(nodes: Sequence[str], timeout_ms: int = 300_000) -> tuple[FakeLog, str]:
    log = FakeLog()
    log.propose(cmd.RaiseFormat(FORMAT))
    for n in nodes:
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    spec = dataclasses.replace(job("g", replicas=2, gpu=8), replace=ReplacePolicy(timeout_ms))
    result = log.propose(cmd.SubmitJob(spec=spec, request_id="r", now_ms=0))
    job_id = result.result().job_id
    return log, job_id


def start(log: FakeLog, job_id: str, now: int) -> None:
    attempt = log.state.jobs[job_id].attempt
    assert attempt is not None
    for m in attempt.members:
        event = cmd.MemberEvent(job_id, attempt.fencing_token, m.rank, cmd.MemberEventKind.STARTED)
        log.propose(cmd.ReportMembers(m.node_id, (event,), now_ms=now))


def test_a_lost_rank_is_placed_again_and_the_gangs_nodes_are_nudged() -> None:
    log, job_id = running(["a", "b", "c"])
    nudges = Nudges()
    loop, _ = elected(log, nudger=nudges)
    loop.step(1_100)
    start(log, job_id, 1_150)
    lost = log.state.jobs[job_id].attempt.members[1].node_id  # type: ignore[union-attr]
    log.propose(cmd.MarkNodeDead(lost, "silent", 1, 1_200))
    log.hold = True
    said = loop.step(1_400)
    assert f"placing lost members again: {job_id} rank 1 on " in said
    assert len(log.of_type(cmd.ReplaceMembers)) == 1
    assert "placing" not in loop.step(1_450)  # one proposal in flight at a time
    log.commit_pending()
    nudged_before = len(nudges.targets)
    loop.step(1_600)
    attempt = log.state.jobs[job_id].attempt
    assert attempt is not None and attempt.members[1].generation == 1
    new_nodes = {n for n, _ in nudges.targets[nudged_before]}
    assert {m.node_id for m in attempt.members} <= new_nodes
    assert len(log.of_type(cmd.ReplaceMembers)) == 1  # nothing lost any more


def test_a_rank_with_nowhere_to_go_requeues_its_gang_at_the_timeout() -> None:
    log, job_id = running(["a", "b"], timeout_ms=5_000)
    loop, _ = elected(log)
    loop.step(1_100)
    start(log, job_id, 1_150)
    lost = log.state.jobs[job_id].attempt.members[0].node_id  # type: ignore[union-attr]
    log.propose(cmd.MarkNodeDead(lost, "silent", 1, 1_200))
    loop.step(1_400)
    assert log.of_type(cmd.ReplaceMembers) == [] and log.of_type(cmd.FailAttempt) == []
    said = loop.step(6_300)
    assert f"requeueing {job_id}: rank(s) 0 not placed again within 5s" in said
    job = log.state.jobs[job_id]
    assert job.state is JobState.PENDING
    assert job.reason.code is ReasonCode.REQUEUED_REPLACE_TIMEOUT
