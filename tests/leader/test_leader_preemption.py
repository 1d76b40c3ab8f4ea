"""The leader proposes the pass's preemptions after its bind, once per preemption."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig, PreemptionKind, Queue
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.reasons import ReasonCode
from tests.core.harness import job, node
from tests.leader.fakes import FakeLog
from tests.leader.test_leader import elected


def test_a_preemption_is_proposed_once_and_the_preemptor_binds_after_its_victim_stops() -> None:
    log = FakeLog(ClusterState(config=ClusterConfig(locality_wait_ms=0)))
    now = 1_000
    for command in (
        cmd.RegisterNode(node("n1", gpus=8), now),
        cmd.SetQueue(Queue("q", gpu=8), now),
        cmd.SubmitJob(job(queue="q", gpu=8, priority_class="low"), "low", now),
    ):
        assert log.propose(command).result().ok
    loop, liveness = elected(log, now)
    liveness.heard("n1", now)
    assert "proposing to bind 1 gangs" in loop.step(now)
    low = "job-000001"
    assert log.state.jobs[low].state is JobState.SCHEDULED

    assert (
        log.propose(cmd.SubmitJob(job(queue="q", gpu=8, priority_class="high"), "high", now))
        .result()
        .ok
    )
    high = "job-000002"
    log.hold = True
    loop.note_state_changed()
    now += 1_000
    liveness.heard("n1", now)
    said = loop.step(now)
    assert f"{high} preempts {low} (priority)" in said
    # Not proposed again while in flight, nor after it committed.
    for _ in range(3):
        now += 1_000
        liveness.heard("n1", now)
        loop.note_state_changed()
        loop.step(now)
        log.commit_pending()
    preempts = log.of_type(cmd.Preempt)
    assert len(preempts) == 1
    assert preempts[0].kind is PreemptionKind.PRIORITY  # type: ignore[attr-defined]
    attempt = log.state.jobs[low].attempt
    assert attempt is not None and attempt.preempted_by == high
    assert log.state.jobs[high].reason.code is ReasonCode.WAITING_FOR_VICTIMS

    log.hold = False
    event = cmd.MemberEvent(low, attempt.fencing_token, 0, cmd.MemberEventKind.EXITED, 143)
    assert log.propose(cmd.ReportMembers("n1", (event,), now_ms=now)).result().ok
    assert log.state.jobs[low].state is JobState.PENDING
    now += 1_000
    liveness.heard("n1", now)
    loop.note_state_changed()
    loop.step(now)
    assert log.state.jobs[high].state is JobState.SCHEDULED
    assert log.state.jobs[low].state is JobState.PENDING
