"""A requeued attempt's members that never started are still confirmed stopped.

When one member of a gang is lost before the others were reported running, the attempt
ends with those others ``bound``. The next attempt waits until every member of the ended
one is confirmed stopped (DESIGN §4), so their nodes must be told about them: the desired
list keeps them, marked ``ended``, and the worker answers with an immediate exit.
"""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.model import JobState, MemberState
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.views import desired_members
from synapse_ha.rpc.to_proto import ENDED_ATTEMPT, desired_to_proto
from tests.core.harness import Cluster, job, node


def test_bound_members_of_a_requeued_attempt_stay_desired_until_confirmed_stopped() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8), node("n3", gpus=8))
    j = cl.submit(job(replicas=2, gpu=8))
    cl.run_pass()
    old = cl.state.jobs[j].attempt
    assert old is not None
    first, second = old.members
    # Rank 0 starts and is fenced; rank 1 was never reported running.
    started = c.MemberEvent(j, old.fencing_token, 0, c.MemberEventKind.STARTED)
    cl.do(c.ReportMembers(first.node_id, (started,), now_ms=cl.now))
    fenced = c.MemberEvent(
        j, old.fencing_token, 0, c.MemberEventKind.EXITED, 137, "fenced", c.ExitCause.FENCED
    )
    cl.do(c.ReportMembers(first.node_id, (fenced,), now_ms=cl.now))
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert old.member_status[1].state is MemberState.BOUND
    cl.run_pass()
    assert record.reason.code is ReasonCode.WAITING_STOP_CONFIRMED

    # The never-started member is still in its node's desired list, marked ended.
    desired = desired_members(cl.state, second.node_id)
    assert [(d.job_id, d.fencing_token, d.rank, d.ended) for d in desired] == [
        (j, old.fencing_token, 1, True)
    ]
    assert desired_to_proto(desired[0]).preemption == ENDED_ATTEMPT
    assert desired_members(cl.state, first.node_id) == []  # rank 0 is confirmed

    # The worker records it as exited without running it; that confirms the stop.
    gone = c.MemberEvent(
        j, old.fencing_token, 1, c.MemberEventKind.EXITED, 143, "not started", c.ExitCause.LOST
    )
    cl.do(c.ReportMembers(second.node_id, (gone,), now_ms=cl.now))
    assert old.member_status[1].state is MemberState.EXITED
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    new = cl.state.jobs[j].attempt
    assert new is not None and new.fencing_token > old.fencing_token
    for n in ("n1", "n2", "n3"):
        assert all(not d.ended for d in desired_members(cl.state, n))


def test_a_running_member_of_an_ended_attempt_is_not_listed_again() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8), node("n3", gpus=8))
    j = cl.submit(job(replicas=2, gpu=8))
    cl.run_pass()
    cl.start_all(j)
    old = cl.state.jobs[j].attempt
    assert old is not None
    cl.exit_member(j, 0, 3)
    assert cl.state_of(j) is JobState.FAILED or cl.state_of(j) is JobState.PENDING
    # Rank 1 was reported running: its worker knows it, stops it and reports its exit.
    assert desired_members(cl.state, old.members[1].node_id) == []
