"""Preempt at apply, submission into queues and classes, and how a preempted gang ends
(DESIGN §8): table tests through the harness."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, PreemptionKind, PreemptionMode, Queue
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.invariants import check as check_invariants
from synapse_ha.core.model import AttemptState, ClusterState, JobState
from synapse_ha.core.queues.quota import QueueUsage, waiting_preemptors
from synapse_ha.core.reasons import ReasonCode, reason, render
from synapse_ha.core.views import desired_by_node, due_start_timeouts
from tests.core.harness import Cluster, job, node

PRIO = PreemptionKind.PRIORITY
RECLAIM = PreemptionKind.RECLAIM


def cluster(mode: PreemptionMode = PreemptionMode.TOPOLOGY) -> Cluster:
    cl = Cluster(state=ClusterState(config=ClusterConfig(preemption=mode)))
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    for q in (
        Queue("team-a", gpu=8, cohort="lab"),
        Queue("team-b", gpu=8, cohort="lab"),
        Queue("solo", gpu=16),
        Queue("classy", priority_classes=("normal",)),
    ):
        assert cl.do(c.SetQueue(q, cl.now)).ok
    return cl


def victim(cl: Cluster, job_id: str) -> c.Victim:
    return c.Victim(job_id, cl.state.jobs[job_id].fencing_token)


def running(cl: Cluster, spec_queue: str, gpu: int, *, cls: str = "", replicas: int = 1) -> str:
    j = cl.submit(job(queue=spec_queue, gpu=gpu, replicas=replicas, priority_class=cls))
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED, cl.state.jobs[j].reason
    cl.start_all(j)
    return j


def preempt(cl: Cluster, preemptor: str, victims: list[str], kind: PreemptionKind) -> c.Result:
    p = cl.state.jobs[preemptor]
    return cl.do(
        c.Preempt(preemptor, p.attempts_made, tuple(victim(cl, v) for v in victims), kind, cl.now)
    )


# ------------------------------------------------------------------- submission


@pytest.mark.parametrize(
    ("queue", "cls", "field", "words"),
    [
        ("nope", "", "queue", "no queue 'nope'"),
        ("default", "gold", "priority", "no priority class 'gold'"),
        ("classy", "high", "priority", "allows the classes normal, not 'high'"),
        ("classy", "", "priority", "not a plain number"),
    ],
)
def test_submission_needs_a_known_queue_and_an_allowed_class(
    queue: str, cls: str, field: str, words: str
) -> None:
    cl = cluster()
    before = encode_state(cl.state)
    result = cl.do(c.SubmitJob(job(queue=queue, priority_class=cls), "r-1", cl.now))
    assert result.code is c.ResultCode.INVALID
    assert field in result.message and words in result.message
    # Nothing changed but the command counter and the clock.
    cl.state.applied_commands -= 1
    assert encode_state(cl.state) == before


def test_a_class_replaces_the_priority_with_its_value() -> None:
    cl = cluster()
    high = cl.submit(dataclasses.replace(job(priority=-5), priority_class="high"))
    low = cl.submit(job(priority_class="low"))
    bare = cl.submit(job(priority=7))
    assert cl.state.jobs[high].spec.priority == 100
    assert cl.state.jobs[low].spec.priority == -100
    assert cl.state.jobs[bare].spec.priority == 7
    assert cl.submit(job(queue="classy", priority_class="normal"))


# ------------------------------------------------------------ a preemption's course


def test_priority_preemption_marks_the_victim_which_keeps_its_gpus_until_confirmed() -> None:
    cl = cluster()
    low = running(cl, "solo", 8, cls="low", replicas=2)
    high = cl.submit(job(queue="solo", gpu=8, replicas=2, priority_class="high"))
    result = preempt(cl, high, [low], PRIO)
    assert result.ok, result.message
    attempt = cl.state.jobs[low].attempt
    assert attempt is not None
    assert (attempt.preempted_by, attempt.preemption) == (high, PRIO)
    assert attempt.preempt_deadline_ms == cl.now + 30_000  # the class's grace
    assert cl.state.jobs[low].reason.code is ReasonCode.PREEMPTING
    assert f"being preempted by {high}" in render(cl.state.jobs[low].reason)
    assert cl.state.jobs[high].reason.code is ReasonCode.WAITING_FOR_VICTIMS
    wanted = desired_by_node(cl.state)
    assert {m.preempt_deadline_ms for ms in wanted.values() for m in ms} == {cl.now + 30_000}

    # One member exits with a failure code: a stop confirmation, nothing ends yet.
    cl.now += 5_000
    assert cl.exit_member(low, 0, 143).ok
    assert cl.state_of(low) is JobState.RUNNING
    assert cl.state.nodes[attempt.members[0].node_id].allocated.gpu == 8  # still held
    # A second preemption of the same gang is refused while it stops.
    other = cl.submit(job(queue="solo", gpu=8, priority_class="high"))
    assert preempt(cl, other, [low], PRIO).code is c.ResultCode.CONFLICT
    cl.now += 1_000
    assert cl.exit_member(low, 1, 137).ok
    record = cl.state.jobs[low]
    assert record.state is JobState.PENDING
    assert attempt.state is AttemptState.REQUEUED
    assert attempt.outcome is not None and attempt.outcome.code is ReasonCode.PREEMPTED
    assert record.reason.code is ReasonCode.REQUEUED_PREEMPTED
    assert (record.retries_used, record.requeues) == (0, 0)
    assert f"preempted by {high}" in render(record.reason)
    assert sum(n.allocated.gpu for n in cl.state.nodes.values()) == 0
    # The preemptor now fits, ahead of the victim which kept its seq.
    cl.run_pass()
    assert cl.state_of(high) is JobState.SCHEDULED
    assert cl.state_of(low) is JobState.PENDING


def test_a_dead_node_confirms_the_preempted_gang_stopped_without_a_requeue_count() -> None:
    cl = cluster()
    low = running(cl, "solo", 8, cls="low", replicas=2)
    high = cl.submit(job(queue="solo", gpu=8, priority_class="high"))
    assert preempt(cl, high, [low], PRIO).ok
    assert cl.do(c.MarkNodeDead("n1", "silent", now_ms=cl.now)).ok
    record = cl.state.jobs[low]
    assert record.state is JobState.PENDING
    assert record.reason.code is ReasonCode.REQUEUED_PREEMPTED
    assert record.requeues == 0


def _exit(cl: Cluster, job_id: str, rank: int, code: int, cause: c.ExitCause) -> c.Result:
    attempt = cl.state.jobs[job_id].attempt
    assert attempt is not None
    event = c.MemberEvent(
        job_id, attempt.fencing_token, rank, c.MemberEventKind.EXITED, code, cause=cause
    )
    return cl.do(c.ReportMembers(attempt.members[rank].node_id, (event,), now_ms=cl.now))


def preempted_pair(cl: Cluster) -> tuple[str, str]:
    """A running two-member gang (one member per node) preempted by a high-priority one:
    (victim, preemptor)."""
    low = running(cl, "solo", 8, cls="low", replicas=2)
    high = cl.submit(job(queue="solo", gpu=8, replicas=2, priority_class="high"))
    assert preempt(cl, high, [low], PRIO).ok
    return low, high


def test_a_preempted_gang_whose_members_all_exited_0_by_themselves_succeeds() -> None:
    """The gang finished just as the leader preempted it: its exits 0 (no signal from the
    worker: a stopped member reports 143) are committed after the Preempt. It succeeds,
    and never runs again."""
    cl = cluster()
    low, high = preempted_pair(cl)
    attempt = cl.state.jobs[low].attempt
    assert attempt is not None
    cl.now += 100
    assert _exit(cl, low, 0, 0, c.ExitCause.PROGRAM).ok
    assert cl.state_of(low) is JobState.RUNNING  # waits for the whole gang
    assert _exit(cl, low, 1, 0, c.ExitCause.PROGRAM).ok
    record = cl.state.jobs[low]
    assert record.state is JobState.SUCCEEDED
    assert attempt.state is AttemptState.SUCCEEDED
    assert record.reason.code is ReasonCode.SUCCEEDED_BEFORE_PREEMPTION
    assert f"before {high}'s preemption" in render(record.reason)
    assert (record.attempts_made, record.retries_used, record.requeues) == (1, 0, 0)
    assert sum(n.allocated.gpu for n in cl.state.nodes.values()) == 0
    assert not check_invariants(cl.state)
    cl.run_pass()
    assert cl.state_of(high) is JobState.SCHEDULED
    assert cl.state_of(low) is JobState.SUCCEEDED


@pytest.mark.parametrize("late_code", [0, 143])
def test_late_exits_0_of_a_preempted_gang_whose_node_died_make_it_succeed(late_code: int) -> None:
    """The gang finished on a node cut off from the leader; the leader preempted it, then
    declared the node dead (requeued as preempted). When the exits arrive and all are 0,
    the job succeeds and its next attempt never runs; a stopped member (143) keeps the
    requeue."""
    cl = cluster()
    low, _high = preempted_pair(cl)
    attempt = cl.state.jobs[low].attempt
    assert attempt is not None
    token = attempt.fencing_token
    assert cl.do(c.MarkNodeDead(attempt.members[0].node_id, "silent", now_ms=cl.now)).ok
    assert cl.state_of(low) is JobState.PENDING
    late = [
        c.MemberEvent(low, token, rank, c.MemberEventKind.EXITED, code, cause=c.ExitCause.PROGRAM)
        for rank, code in ((0, 0), (1, late_code))
    ]
    for event in late:
        on = attempt.members[event.rank].node_id
        assert cl.do(c.ReportMembers(on, (event,), now_ms=cl.now)).ok
    record = cl.state.jobs[low]
    if late_code == 0:
        assert record.state is JobState.SUCCEEDED
        assert record.reason.code is ReasonCode.SUCCEEDED_AFTER_NODE_DEATH
    else:
        assert record.state is JobState.PENDING
        assert record.lost_attempt is None
    assert not check_invariants(cl.state)


def test_no_late_success_once_a_preempted_member_was_stopped() -> None:
    cl = cluster()
    low, _high = preempted_pair(cl)
    assert cl.exit_member(low, 1, 143).ok  # stopped by its worker
    attempt = cl.state.jobs[low].attempt
    assert attempt is not None
    assert cl.do(c.MarkNodeDead(attempt.members[0].node_id, "silent", now_ms=cl.now)).ok
    assert cl.state.jobs[low].lost_attempt is None


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (143, c.ExitCause.PROGRAM),  # stopped by its worker: SIGTERM
        (0, c.ExitCause.FENCED),  # a disruption never counts as a success
        (0, c.ExitCause.LOST),
    ],
)
def test_a_preempted_gang_with_one_stopped_member_is_requeued(
    code: int, cause: c.ExitCause
) -> None:
    cl = cluster()
    low, _high = preempted_pair(cl)
    assert _exit(cl, low, 0, 0, c.ExitCause.PROGRAM).ok
    assert _exit(cl, low, 1, code, cause).ok
    record = cl.state.jobs[low]
    assert record.state is JobState.PENDING
    assert record.reason.code is ReasonCode.REQUEUED_PREEMPTED
    assert not check_invariants(cl.state)


def test_a_preempted_attempt_has_no_start_timeout_and_a_failure_ends_it_as_preempted() -> None:
    cl = cluster()
    low = cl.submit(job(queue="solo", gpu=8, priority_class="low"))
    cl.run_pass()  # bound, never started
    high = cl.submit(
        job(queue="solo", gpu=16, replicas=2, priority_class="high", wait_for_nodes=True)
    )
    assert preempt(cl, high, [low], PRIO).ok
    cl.now += cl.state.config.start_timeout_ms + 1
    assert due_start_timeouts(cl.state, cl.now) == []
    token = cl.state.jobs[low].fencing_token
    timeout = c.FailAttempt(low, token, reason(ReasonCode.START_TIMEOUT), 0, cl.now)
    assert cl.do(timeout).code is c.ResultCode.CONFLICT
    lost = c.FailAttempt(low, token, reason(ReasonCode.MEMBER_LOST, rank=0), 0, cl.now)
    assert cl.do(lost).ok
    record = cl.state.jobs[low]
    assert record.reason.code is ReasonCode.REQUEUED_PREEMPTED
    assert (record.retries_used, record.requeues) == (0, 0)


def test_reclaim_takes_a_borrowing_gang_back_for_a_queue_within_nominal() -> None:
    cl = cluster()
    b1 = running(cl, "team-b", 8)
    b2 = running(cl, "team-b", 8)  # borrows team-a's idle 8
    a = cl.submit(job(queue="team-a", gpu=8))
    cl.run_pass()
    assert cl.state_of(a) is JobState.PENDING
    # Taking both would take team-b below its nominal.
    result = preempt(cl, a, [b1, b2], RECLAIM)
    assert result.code is c.ResultCode.CONFLICT and "below its nominal" in result.message
    assert preempt(cl, a, [b2], RECLAIM).ok
    assert cl.state.jobs[b2].attempt is not None
    assert cl.state.jobs[b2].attempt.preemption is RECLAIM  # type: ignore[union-attr]
    # A second team-a gang would take team-a beyond its nominal, counting the first
    # one's claim on what its victim frees.
    a2 = cl.submit(job(queue="team-a", gpu=8))
    result = preempt(cl, a2, [b1], RECLAIM)
    assert result.code is c.ResultCode.CONFLICT and "within its nominal" in result.message


def test_what_a_queue_keeps_counts_the_gangs_waiting_for_their_victims() -> None:
    cl = cluster()
    running(cl, "team-b", 8)
    b2 = running(cl, "team-b", 8)
    a = cl.submit(job(queue="team-a", gpu=8))
    assert preempt(cl, a, [b2], RECLAIM).ok
    # b2 is stopping: team-b keeps 8, and team-a will take the 8 a waits for. The planner
    # and the state machine judge the next reclaim against these same figures.
    keeps = QueueUsage.kept_after_reclaims(cl.state)
    assert (keeps.used("team-a").gpu, keeps.used("team-b").gpu) == (8, 8)
    assert waiting_preemptors(cl.state) == {a}
    assert QueueUsage.kept_after_reclaims(cl.state, besides=a).used("team-a").gpu == 0
    assert cl.exit_member(b2, 0, 137).ok
    assert waiting_preemptors(cl.state) == set()


# ------------------------------------------------------------------ refusals


def _setup_priority(cl: Cluster) -> dict[str, str]:
    low = running(cl, "solo", 8, cls="low")
    same = running(cl, "solo", 8, cls="high")
    other_queue = running(cl, "team-b", 0)
    return {
        "low": low,
        "same": same,
        "other_queue": other_queue,
        "high": cl.submit(job(queue="solo", gpu=8, priority_class="high")),
        "normal": cl.submit(job(queue="solo", gpu=8, priority_class="normal")),
    }


Case = tuple[str, str, list[str], PreemptionKind, c.ResultCode, str]
CASES: list[Case] = [
    ("unknown preemptor", "ghost", ["low"], PRIO, c.ResultCode.NOT_FOUND, "no job"),
    ("preemptor not pending", "same", ["low"], PRIO, c.ResultCode.CONFLICT, "not PENDING"),
    ("no victims", "high", [], PRIO, c.ResultCode.INVALID, "at least one"),
    ("twice", "high", ["low", "low"], PRIO, c.ResultCode.INVALID, "appears twice"),
    ("class does not preempt", "normal", ["low"], PRIO, c.ResultCode.CONFLICT, "not preempt"),
    ("equal priority", "high", ["same"], PRIO, c.ResultCode.CONFLICT, "not below"),
    ("other queue", "high", ["other_queue"], PRIO, c.ResultCode.CONFLICT, "within one queue"),
    ("reclaim without cohort", "high", ["low"], RECLAIM, c.ResultCode.CONFLICT, "no quota"),
]


@pytest.mark.parametrize(("name", "who", "victims", "kind", "code", "words"), CASES)
def test_preempt_is_refused_whole_and_changes_nothing(
    name: str, who: str, victims: list[str], kind: PreemptionKind, code: c.ResultCode, words: str
) -> None:
    cl = cluster()
    ids = _setup_priority(cl)
    preemptor = ids.get(who, who)
    record = cl.state.jobs.get(preemptor)
    named = tuple(victim(cl, ids[v]) for v in victims)
    command = c.Preempt(preemptor, record.attempts_made if record else 0, named, kind, cl.now)
    before = encode_state(cl.state)
    result = cl.do(command)
    assert result.code is code, result.message
    assert words in result.message
    cl.state.applied_commands -= 1
    assert encode_state(cl.state) == before


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda cl, cmd: dataclasses.replace(cmd, preemptor_attempts_made=3), "stale"),
        (
            lambda cl, cmd: dataclasses.replace(
                cmd, victims=(c.Victim(cmd.victims[0].job_id, 999),)
            ),
            "not live",
        ),
    ],
)
def test_a_stale_preempt_is_refused(
    change: Callable[[Cluster, c.Preempt], c.Preempt], words: str
) -> None:
    cl = cluster()
    ids = _setup_priority(cl)
    good = c.Preempt(ids["high"], 0, (victim(cl, ids["low"]),), PRIO, cl.now)
    result = cl.do(change(cl, good))
    assert result.code is c.ResultCode.CONFLICT and words in result.message
    assert cl.do(good).ok


def test_preemption_off_refuses_every_preempt() -> None:
    cl = cluster(PreemptionMode.OFF)
    low = running(cl, "solo", 8, cls="low")
    high = cl.submit(job(queue="solo", gpu=16, priority_class="high", wait_for_nodes=True))
    result = preempt(cl, high, [low], PRIO)
    assert result.code is c.ResultCode.CONFLICT and "off" in result.message


def test_a_bind_beyond_the_queue_quota_is_rejected_at_apply() -> None:
    cl = cluster()
    cl.add(node("n3", gpus=8))
    j = cl.submit(job(queue="team-a", gpu=8, replicas=2))  # 16 = 8 nominal + 8 borrowable
    ok_plan = cl.plan()
    assert [p.job_id for p in ok_plan.placements] == [j]
    # team-b takes its own nominal first: team-a can no longer borrow it.
    b = cl.submit(job(queue="team-b", gpu=8))
    for_b = cl.plan()
    assert cl.do(c.BindPlan(tuple(p for p in for_b.placements if p.job_id == b), (), cl.now)).bound
    result = cl.do(c.BindPlan(tuple(ok_plan.placements), (), cl.now))
    assert [r.code for r in result.rejected] == [c.RejectCode.OVER_QUOTA]
    assert "team-a" in result.rejected[0].message
