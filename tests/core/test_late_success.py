"""Exits reported after a node death: when every member of the attempt ended by its
node's death had exited 0, the job succeeds and no newer attempt runs (DESIGN §4)."""

from __future__ import annotations

import json

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec import versioned as codec
from synapse_ha.core.invariants import check
from synapse_ha.core.machine import apply
from synapse_ha.core.model import (
    ZERO,
    AttemptState,
    ClusterState,
    JobState,
    LostAttempt,
    MemberState,
)
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.views import desired_by_node
from tests.core.harness import Cluster, job, node


def exit_event(
    j: str, token: int, rank: int, code: int = 0, cause: c.ExitCause = c.ExitCause.PROGRAM
) -> c.MemberEvent:
    return c.MemberEvent(j, token, rank, c.MemberEventKind.EXITED, code, "", cause)


def report(cl: Cluster, node_id: str, *events: c.MemberEvent) -> c.Result:
    return cl.do(c.ReportMembers(node_id, events, jitter_seed=3, now_ms=cl.now))


def gang_on_two_nodes() -> tuple[Cluster, str, int]:
    """A running gang of two (rank 0 on n1, rank 1 on n2); n3 is spare. Returns the
    cluster, the job and its first token."""
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8), node("n3", gpus=8))
    j = cl.submit(job(replicas=2, gpu=8))
    cl.run_pass()
    cl.start_all(j)
    assert cl.nodes_of(j) == ["n1", "n2"]
    return cl, j, cl.state.jobs[j].fencing_token


def rank0_done_then_n2_dies(cl: Cluster, j: str, token: int) -> None:
    """Rank 0 exits 0 and it is committed; n2 is declared dead before rank 1's exit 0
    (which happened on its worker) is committed."""
    report(cl, "n1", exit_event(j, token, 0))
    cl.now += 1_000
    assert cl.do(c.MarkNodeDead("n2", "silent", jitter_seed=1, now_ms=cl.now)).ok
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert record.reason.code is ReasonCode.REQUEUED_NODE_DEAD
    assert record.lost_attempt == LostAttempt(1, token, "n2", ("n1", "n2"), (0,))


def come_back(cl: Cluster, node_id: str) -> None:
    cl.now += 1_000
    cl.add(node(node_id, gpus=8))


def assert_succeeded_late(cl: Cluster, j: str, token: int) -> None:
    record = cl.state.jobs[j]
    assert record.state is JobState.SUCCEEDED
    assert record.reason.code is ReasonCode.SUCCEEDED_AFTER_NODE_DEATH
    assert record.reason.num("fencing_token") == token
    assert record.reason.text("node") == "n2"
    assert "exited 0" in render(record.reason)
    assert record.lost_attempt is None
    assert record.finished_at_ms == cl.now
    assert j not in {d.job_id for ds in desired_by_node(cl.state).values() for d in ds}
    assert all(n.allocated == ZERO and not n.allocated_gpus for n in cl.state.nodes.values())
    cl.run_pass()
    assert cl.state_of(j) is JobState.SUCCEEDED  # never bound again


def test_late_exit_before_the_gang_is_bound_again_ends_the_job_succeeded() -> None:
    cl, j, token = gang_on_two_nodes()
    report(cl, "n1", exit_event(j, token, 0))
    cl.now += 1_000
    cl.do(c.MarkNodeDead("n2", "silent", jitter_seed=1, now_ms=cl.now))
    # The report reaches the leader while n2 is still dead (before it registers again).
    result = report(cl, "n2", exit_event(j, token, 1))
    assert result.accepted_events == 1
    assert cl.state.jobs[j].attempts_made == 1
    assert_succeeded_late(cl, j, token)


def test_late_exits_stop_a_newer_attempt_that_has_not_started() -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    cl.run_pass()
    newer = cl.state.jobs[j].attempt
    assert newer is not None and newer.fencing_token > token
    assert cl.state_of(j) is JobState.SCHEDULED
    come_back(cl, "n2")
    report(cl, "n2", exit_event(j, token, 1))
    assert newer.state is AttemptState.STOPPED
    assert newer.started_at_ms is None
    assert newer.outcome is not None
    assert newer.outcome.code is ReasonCode.EARLIER_ATTEMPT_SUCCEEDED
    assert newer.outcome.num("fencing_token") == token
    assert_succeeded_late(cl, j, token)


def test_late_exits_stop_a_newer_attempt_that_has_started() -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    cl.run_pass()
    cl.start_all(j)
    newer = cl.state.jobs[j].attempt
    assert newer is not None and cl.state_of(j) is JobState.RUNNING
    come_back(cl, "n2")
    report(cl, "n2", exit_event(j, token, 1))
    assert newer.state is AttemptState.STOPPED
    assert_succeeded_late(cl, j, token)
    # The newer attempt's members report their stop later: confirmed, nothing else moves.
    for m in newer.members:
        report(cl, m.node_id, exit_event(j, newer.fencing_token, m.rank, 143))
    assert all(s.state is MemberState.EXITED for s in newer.member_status)
    assert cl.state_of(j) is JobState.SUCCEEDED


def test_partial_late_exits_change_nothing_until_every_rank_is_in() -> None:
    cl, j, token = gang_on_two_nodes()
    # Both members still run when n2 dies; n2's member had exited 0 by itself.
    cl.do(c.MarkNodeDead("n2", "silent", jitter_seed=1, now_ms=cl.now))
    assert cl.state.jobs[j].lost_attempt == LostAttempt(1, token, "n2", ("n1", "n2"), ())
    come_back(cl, "n2")
    report(cl, "n2", exit_event(j, token, 1))
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert record.lost_attempt is not None and record.lost_attempt.exited_zero == (1,)
    # A duplicate changes nothing either.
    before = codec.encode_state(cl.state)
    report(cl, "n2", exit_event(j, token, 1))
    assert cl.state.jobs[j].lost_attempt == record.lost_attempt
    assert _without_counters(codec.encode_state(cl.state)) == _without_counters(before)
    # Rank 0 on the live node finishes by itself before its worker stops it: all in.
    report(cl, "n1", exit_event(j, token, 0))
    assert_succeeded_late(cl, j, token)


def _without_counters(data: bytes) -> dict[str, object]:
    plain = json.loads(data)["state"]
    plain.pop("applied_commands")
    plain.pop("last_time_ms")
    return dict(plain)


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (1, c.ExitCause.PROGRAM),
        (137, c.ExitCause.FENCED),
        (0, c.ExitCause.FENCED),
        (0, c.ExitCause.LOST),
    ],
)
def test_a_failing_exit_of_the_lost_attempt_keeps_the_rerun(code: int, cause: c.ExitCause) -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    cl.run_pass()
    newer = cl.state.jobs[j].attempt
    assert newer is not None
    come_back(cl, "n2")
    assert report(cl, "n2", exit_event(j, token, 1, code, cause)).accepted_events == 1
    record = cl.state.jobs[j]
    assert record.lost_attempt is None
    assert record.state is JobState.SCHEDULED and record.attempt is newer
    assert newer.state is AttemptState.BOUND
    # Nothing can make the old attempt succeed any more.
    report(cl, "n2", exit_event(j, token, 1))
    assert record.state is JobState.SCHEDULED


def test_exits_under_an_older_token_or_from_another_node_are_ignored() -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    # Rank 1's exit claimed by the wrong node counts for nothing.
    report(cl, "n1", exit_event(j, token, 1))
    assert cl.state.jobs[j].lost_attempt is not None
    assert cl.state_of(j) is JobState.PENDING
    # The second attempt dies with its node too: the record is now of that attempt.
    cl.run_pass()
    cl.start_all(j)
    second = cl.state.jobs[j].fencing_token
    dead = cl.nodes_of(j)[1]
    cl.now += 1_000
    cl.do(c.MarkNodeDead(dead, "silent", jitter_seed=2, now_ms=cl.now))
    lost = cl.state.jobs[j].lost_attempt
    assert lost is not None and lost.fencing_token == second and lost.exited_zero == ()
    # Late exits of the first attempt are stale now.
    come_back(cl, "n2")
    result = report(cl, "n2", exit_event(j, token, 1))
    assert result.stale_events == 1
    assert cl.state_of(j) is JobState.PENDING
    assert cl.state.jobs[j].lost_attempt == lost


def test_a_job_that_fails_at_its_node_death_keeps_no_record() -> None:
    cl = Cluster()
    cl.do(c.Configure(ClusterConfig(max_requeues=0)))
    cl.add(node("n1", gpus=8))
    j = cl.submit(job(replicas=1, gpu=8))
    cl.run_pass()
    cl.start_all(j)
    cl.do(c.MarkNodeDead("n1", "silent", jitter_seed=1, now_ms=cl.now))
    assert cl.state_of(j) is JobState.FAILED
    assert cl.state.jobs[j].lost_attempt is None


def test_finishing_otherwise_clears_the_record() -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    assert cl.do(c.CancelJob(j, "no longer needed", now_ms=cl.now)).ok
    assert cl.state.jobs[j].lost_attempt is None
    report(cl, "n2", exit_event(j, token, 1))
    assert cl.state_of(j) is JobState.CANCELLED


def test_replay_and_codec_give_the_same_bytes() -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    cl.run_pass()
    mid = codec.encode_state(cl.state)
    assert b'"lost_attempt"' in mid
    assert codec.encode_state(codec.decode_state(mid)) == mid
    come_back(cl, "n2")
    report(cl, "n2", exit_event(j, token, 1))
    replayed = ClusterState()
    for command in cl.log:
        decoded = codec.decode_command(codec.encode_command(command))
        apply(replayed, decoded)
        assert not check(replayed)
    assert codec.encode_state(replayed) == codec.encode_state(cl.state)
    # Once the job is final the field is gone, and a state that never used it encodes
    # without it (a previous release reads it).
    assert b'"lost_attempt"' not in codec.encode_state(cl.state)


def test_invariants_catch_a_bad_record() -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    record = cl.state.jobs[j]
    lost = record.lost_attempt
    assert lost is not None
    record.lost_attempt = LostAttempt(1, token, "n2", ("n1", "n2"), (0, 1))
    assert any("lost attempt ranks" in p for p in check(cl.state))
    record.lost_attempt = LostAttempt(9, token + 5, "n2", ("n1", "n2"), ())
    assert any("newer than attempt" in p for p in check(cl.state))
    record.lost_attempt = lost
    assert not check(cl.state)
