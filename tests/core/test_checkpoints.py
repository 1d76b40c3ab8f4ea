"""Checkpoint marks (core/workflows/checkpoints.py): each member's newest mark on its attempt, the
attempt's mark (the oldest of the members' newest), the step a job's next attempt resumes
from, and the format gate."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.codec.from_plain import from_plain
from synapse_ha.core.codec.to_plain import to_plain
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.views import desired_members
from synapse_ha.core.workflows.checkpoints import (
    AttemptMark,
    CheckpointMark,
    attempt_mark,
    with_mark,
)
from tests.core.harness import Cluster, job, node
from tests.core.test_preempt_apply import cluster as preemption_cluster
from tests.core.test_preempt_apply import preempted_pair


def _running(retries: int = 1) -> tuple[Cluster, str]:
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    j = cl.submit(job(replicas=2, gpu=8, retries=retries, backoff_s=0))
    cl.run_pass()
    cl.start_all(j)
    assert cl.state_of(j) is JobState.RUNNING
    return cl, j


def _mark(
    cl: Cluster, j: str, rank: int, step: int | None, seq: int, token: int | None = None
) -> c.Result:
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    event = c.MemberEvent(
        j,
        attempt.fencing_token if token is None else token,
        rank,
        c.MemberEventKind.CHECKPOINT,
        step=step,
        mark_seq=seq,
    )
    return cl.do(c.ReportMembers(attempt.members[rank].node_id, (event,), now_ms=cl.now))


def test_each_member_keeps_its_newest_mark_at_the_commands_time() -> None:
    cl, j = _running()
    cl.now = 5_000
    assert _mark(cl, j, 0, 100, 1).accepted_events == 1
    cl.now = 6_000
    _mark(cl, j, 0, 200, 2)
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    assert attempt.marks == (CheckpointMark(rank=0, at_ms=6_000, step=200, seq=2),)
    assert attempt.mark() is None  # rank 1 has not marked yet
    assert cl.state_of(j) is JobState.RUNNING


def test_the_attempts_mark_is_the_oldest_of_the_members_newest() -> None:
    cl, j = _running()
    cl.now = 5_000
    _mark(cl, j, 1, 40, 1)
    cl.now = 7_000
    _mark(cl, j, 0, 60, 1)
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None
    assert attempt.mark() == AttemptMark(at_ms=5_000, step=40)
    cl.now = 9_000
    _mark(cl, j, 1, 80, 2)
    assert attempt.mark() == AttemptMark(at_ms=7_000, step=60)


def test_a_mark_without_a_step_keeps_the_time_and_the_others_step() -> None:
    assert attempt_mark((CheckpointMark(0, 10, None, 1), CheckpointMark(1, 20, 7, 1)), 2) == (
        AttemptMark(at_ms=10, step=7)
    )
    assert attempt_mark((CheckpointMark(0, 10, None, 1),), 1) == AttemptMark(10, None)
    assert attempt_mark((), 0) is None


def test_duplicate_or_older_marks_change_nothing() -> None:
    marks = with_mark((), 0, 100, 5, 2)
    assert marks is not None
    assert with_mark(marks, 0, 200, 9, 2) is None
    assert with_mark(marks, 0, 200, 9, 1) is None
    cl, j = _running()
    _mark(cl, j, 0, 5, 2)
    cl.now += 1_000
    _mark(cl, j, 0, 3, 1)  # reordered: older than the mark kept
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None and attempt.marks[0].step == 5


def test_a_stale_token_or_another_nodes_mark_is_ignored() -> None:
    cl, j = _running()
    token = cl.state.jobs[j].fencing_token
    result = _mark(cl, j, 0, 5, 1, token=token - 1)
    assert (result.accepted_events, result.stale_events) == (0, 1)
    event = c.MemberEvent(j, token, 0, c.MemberEventKind.CHECKPOINT, step=5, mark_seq=1)
    assert cl.do(c.ReportMembers("n2", (event,), now_ms=cl.now)).stale_events == 1
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None and attempt.marks == ()


@pytest.mark.parametrize(("step", "seq"), [(-1, 1), (3, 0)])
def test_a_mark_that_breaks_its_rules_is_not_recorded(step: int, seq: int) -> None:
    cl, j = _running()
    _mark(cl, j, 0, step, seq)
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None and attempt.marks == ()


def test_the_next_attempt_resumes_from_the_last_marked_step() -> None:
    cl, j = _running(retries=2)
    _mark(cl, j, 0, 5, 1)
    _mark(cl, j, 1, 5, 1)
    cl.exit_member(j, 1, 1)
    cl.exit_member(j, 0, 143)  # rank 0 confirmed stopped
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING and record.resume_step == 5
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    members = desired_members(cl.state, "n1") + desired_members(cl.state, "n2")
    assert {m.resume_step for m in members} == {5}
    assert record.attempt is not None and record.attempt.marks == ()
    # An attempt that ends without a mark keeps the earlier step.
    cl.start_all(j)
    cl.exit_member(j, 0, 1)
    cl.exit_member(j, 1, 143)
    assert record.resume_step == 5


def test_a_requeued_gang_resumes_from_its_mark() -> None:
    cl, j = _running(retries=0)
    cl.add(node("n3", gpus=8))
    _mark(cl, j, 0, 12, 1)
    _mark(cl, j, 1, 10, 1)
    cl.do(c.MarkNodeDead("n2", "silent", now_ms=cl.now))
    assert cl.state.jobs[j].resume_step == 10
    cl.exit_member(j, 0, 143)  # rank 0 on n1 confirmed stopped
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    assert {m.resume_step for m in desired_members(cl.state, "n1")} == {10}


def test_no_mark_no_resume_step() -> None:
    cl, j = _running()
    _mark(cl, j, 0, 12, 1)  # rank 1 never marked: the gang has no common point
    cl.exit_member(j, 0, 1)
    assert cl.state.jobs[j].resume_step is None


def test_marks_survive_the_codec() -> None:
    cl, j = _running()
    _mark(cl, j, 0, None, 1)
    _mark(cl, j, 1, 4, 3)
    cl.exit_member(j, 0, 1)
    state = decode_state(encode_state(cl.state))
    assert state.jobs[j].attempt.marks == cl.state.jobs[j].attempt.marks  # type: ignore[union-attr]
    assert state.jobs[j].resume_step == 4
    event = c.MemberEvent(j, 3, 1, c.MemberEventKind.CHECKPOINT, step=4, mark_seq=2)
    command = c.ReportMembers("n1", (event,), now_ms=5)
    assert from_plain(c.ReportMembers, to_plain(command)) == command


def test_marks_need_format_5_and_plain_reports_do_not() -> None:
    mark = c.MemberEvent("j", 1, 0, c.MemberEventKind.CHECKPOINT, step=4, mark_seq=1)
    started = c.MemberEvent("j", 1, 0, c.MemberEventKind.STARTED)
    assert format_needed(c.ReportMembers("n1", (mark,))) == 5
    assert format_needed(c.ReportMembers("n1", (started,))) < 5
    state = ClusterState()
    assert state.format_floor < 5
    result = apply(state, c.ReportMembers("n1", (mark,)))
    assert not result.ok and "needs format 5" in result.message
    plain = to_plain(c.ReportMembers("n1", (started,)))
    assert "step" not in plain["events"][0] and "mark_seq" not in plain["events"][0]


def test_a_mark_reported_after_its_attempt_ended_counts_until_the_member_is_stopped() -> None:
    cl, j = _running(retries=1)
    cl.now = 2_000
    _mark(cl, j, 0, 5, 1)
    cl.now = 3_000
    cl.exit_member(j, 0, 1)  # the attempt ends; rank 1 on n2 has not reported its mark
    record = cl.state.jobs[j]
    assert (record.state, record.resume_step) == (JobState.PENDING, None)
    assert _mark(cl, j, 1, 5, 1).accepted_events == 1
    assert record.resume_step == 5
    assert record.attempt is not None
    assert record.attempt.mark() == AttemptMark(at_ms=2_000, step=5)
    cl.exit_member(j, 1, 143)  # confirmed stopped: a later mark of it is stale
    assert _mark(cl, j, 1, 6, 2).stale_events == 1
    assert record.resume_step == 5


def test_a_mark_of_a_finished_job_is_stale() -> None:
    cl, j = _running(retries=0)
    cl.exit_member(j, 0, 1)
    assert cl.state_of(j) is JobState.FAILED
    assert _mark(cl, j, 1, 5, 1).stale_events == 1
    attempt = cl.state.jobs[j].attempt
    assert attempt is not None and attempt.marks == ()


def test_a_preempted_gang_that_marks_during_its_grace_resumes_from_that_mark() -> None:
    cl = preemption_cluster()
    low, _high = preempted_pair(cl)
    attempt = cl.state.jobs[low].attempt
    assert attempt is not None and attempt.preempted_by
    cl.now += 500  # within the grace: the members save and mark, then stop
    _mark(cl, low, 0, 900, 1)
    _mark(cl, low, 1, 900, 1)
    assert attempt.mark() == AttemptMark(at_ms=cl.now, step=900)
    for rank in (0, 1):
        event = c.MemberEvent(
            low, attempt.fencing_token, rank, c.MemberEventKind.EXITED, 143, cause=c.ExitCause.LOST
        )
        cl.do(c.ReportMembers(attempt.members[rank].node_id, (event,), now_ms=cl.now))
    record = cl.state.jobs[low]
    assert record.state is JobState.PENDING and record.resume_step == 900
