"""The leader loop with a fake log and a fake clock: no threads, no sleeps."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig, Timeouts
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.model import JobState, NodeStatus
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.leader.liveness import Liveness
from synapse_ha.leader.loop import LeaderLoop, LoopSettings
from synapse_ha.leader.scheduling import DesiredSettings
from tests.core.harness import job, node
from tests.leader.fakes import FakeLog

DEAD_MS = Timeouts().dead_timeout_ms


def make_loop(log: FakeLog, **kwargs: object) -> tuple[LeaderLoop, Liveness]:
    liveness = Liveness()
    loop = LeaderLoop(
        log,
        log,
        liveness,
        "r1",
        settings=LoopSettings(schedule_period_ms=500, purge_period_ms=60_000),
        rng=random.Random(7),
        **kwargs,  # type: ignore[arg-type]
    )
    return loop, liveness


def elected(log: FakeLog, now: int = 1_000, **kwargs: object) -> tuple[LeaderLoop, Liveness]:
    loop, liveness = make_loop(log, **kwargs)
    loop.on_role_change(True, 3, now)
    assert "committing a barrier" in loop.step(now)
    assert "barrier committed" in loop.step(now)
    assert loop.ready
    return loop, liveness


def test_a_follower_does_nothing() -> None:
    log = FakeLog()
    loop, _ = make_loop(log)
    assert loop.step(0) == "not the leader: nothing to do"
    assert log.proposed == []


def test_a_new_leader_commits_a_barrier_before_anything_else() -> None:
    log = FakeLog()
    log.hold = True
    log.propose(cmd.RegisterNode(info=node("n1"), now_ms=0))
    log.commit_pending()
    loop, _ = make_loop(log)
    loop.on_role_change(True, 5, 100)
    assert loop.step(100) == "became leader in term 5: committing a barrier before acting"
    assert loop.step(200) == "leader in term 5: waiting for the barrier to commit"
    assert isinstance(log.pending[0][0], cmd.Barrier)
    assert not loop.ready
    # Nothing but the barrier is proposed while it is pending, however long that takes.
    assert "waiting for the barrier" in loop.step(100 + LoopSettings().proposal_timeout_ms - 1)
    assert [type(c) for c in log.proposed] == [cmd.RegisterNode, cmd.Barrier]
    log.commit_pending()
    assert loop.step(300) == "leader in term 5: barrier committed, now scheduling"
    assert loop.ready


def test_a_failed_barrier_is_retried() -> None:
    log = FakeLog()
    log.hold = True
    loop, _ = make_loop(log)
    loop.on_role_change(True, 2, 0)
    loop.step(0)
    log.fail_pending()
    assert "barrier failed" in loop.step(10)
    assert "committing a barrier" in loop.step(20)
    assert len(log.of_type(cmd.Barrier)) == 2


def test_scheduling_binds_a_gang_and_waits_for_the_bind_to_commit() -> None:
    log = FakeLog()
    for n in ("a", "b"):
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("g", replicas=2, gpu=8), request_id="r", now_ms=0))
    loop, _ = elected(log)
    log.hold = True
    said = loop.step(1_100)
    assert "proposing to bind 1 gangs (2 members)" in said
    assert "a bind is in flight" in loop.step(1_110)
    assert len(log.of_type(cmd.BindPlan)) == 1
    log.commit_pending()
    loop.step(1_120)
    (job_state,) = [j.state for j in log.state.jobs.values()]
    assert job_state is JobState.SCHEDULED


def test_a_node_is_reaped_only_after_dead_timeout_counted_from_the_election() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("quiet"), now_ms=0))
    # Elected long after the node was last heard of by anyone: it gets a full timeout.
    start = 50_000
    loop, _ = elected(log, now=start)
    assert "declaring" not in loop.step(start + DEAD_MS)
    said = loop.step(start + DEAD_MS + 100)
    assert "declaring node quiet dead" in said
    (dead,) = log.of_type(cmd.MarkNodeDead)
    assert isinstance(dead, cmd.MarkNodeDead)
    assert dead.now_ms == start + DEAD_MS + 100
    assert log.state.nodes["quiet"].status is NodeStatus.DEAD
    # Declared once, not on every step.
    loop.step(start + DEAD_MS + 200)
    assert len(log.of_type(cmd.MarkNodeDead)) == 1


def test_a_heartbeat_keeps_a_node_alive() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("chatty"), now_ms=0))
    loop, liveness = elected(log, now=0)
    liveness.heard("chatty", DEAD_MS - 1)
    assert "declaring" not in loop.step(DEAD_MS + 5)
    assert "declaring node chatty dead" in loop.step(2 * DEAD_MS)


def test_a_leader_that_did_not_run_counts_its_nodes_as_heard_when_it_runs_again() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("w1"), now_ms=0))
    loop, liveness = elected(log, now=0)
    liveness.heard("w1", 1_000)
    # The replica was stopped (SIGSTOP, a paused VM) from 1.5 s to 1.5 s + DEAD_MS: the
    # node's heartbeats went unread, its silence was the leader's.
    back = 1_500 + DEAD_MS
    assert "did not run for" in loop.note_not_running(DEAD_MS, back)
    assert "declaring" not in loop.step(back)
    assert "declaring" not in loop.step(back + DEAD_MS)
    # Still silent a whole timeout after the leader ran again: now it is dead.
    assert "declaring node w1 dead" in loop.step(back + DEAD_MS + 200)


def test_a_short_stall_or_a_follower_changes_nothing() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("w1"), now_ms=0))
    loop, _ = elected(log, now=0)
    assert loop.note_not_running(999, DEAD_MS) == ""  # below STALL_MS
    assert "declaring node w1 dead" in loop.step(DEAD_MS + 1)
    follower, _ = make_loop(FakeLog())
    assert follower.note_not_running(60_000, 1) == ""


def _ten_nodes(log: FakeLog) -> list[str]:
    names = [f"n{i}" for i in range(10)]
    for n in names:
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    return names


def test_a_silence_of_most_nodes_at_once_holds_every_death_until_most_are_heard() -> None:
    log = FakeLog()
    names = _ten_nodes(log)
    loop, liveness = elected(log, now=0)
    # Six of ten nodes go unheard (a leader too busy to read them); four keep talking.
    t = 2 * DEAD_MS
    for n in names[6:]:
        liveness.heard(n, t - 1_000)
    said = loop.step(t)
    assert "holding node deaths: 6 of 10 nodes unheard" in said
    assert log.of_type(cmd.MarkNodeDead) == []
    assert "holding" not in loop.step(t + 200)  # said once, not at every step
    assert log.of_type(cmd.MarkNodeDead) == []
    # Two of the six are heard again: 4 of 10 late is no longer a mass silence, and the
    # four still silent past dead_timeout are declared dead.
    for n in (*names[:2], *names[6:]):
        liveness.heard(n, t + 300)
    said = loop.step(t + 400)
    assert "node deaths no longer held" in said
    dead = sorted(c.node_id for c in log.of_type(cmd.MarkNodeDead))  # type: ignore[attr-defined]
    assert dead == names[2:6]


def test_half_the_nodes_silent_or_a_small_cluster_all_silent_is_no_mass_silence() -> None:
    log = FakeLog()
    names = _ten_nodes(log)
    loop, liveness = elected(log, now=0)
    t = 2 * DEAD_MS
    for n in names[5:]:
        liveness.heard(n, t - 1_000)
    assert "holding" not in loop.step(t)
    assert len(log.of_type(cmd.MarkNodeDead)) == 5
    small = FakeLog()
    for n in ("a", "b", "c"):
        small.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    loop, _ = elected(small, now=0)
    assert "holding" not in loop.step(2 * DEAD_MS)
    assert len(small.of_type(cmd.MarkNodeDead)) == 3


def test_scheduling_passes_are_spaced_by_their_own_cost() -> None:
    log = FakeLog()
    ticks = iter([0.0, 0.2, 1.0, 1.2, 2.0, 2.2, 3.0, 3.2])  # every pass costs 200 ms
    loop, _ = elected(log, now=0, timer=lambda: next(ticks))
    log.propose(cmd.SubmitJob(spec=job("a", gpu=8), request_id="a", now_ms=0))
    loop.note_state_changed()
    assert loop.step(1_000) == "updating why 1 jobs wait (1 pending)"
    log.propose(cmd.SubmitJob(spec=job("b", gpu=8), request_id="b", now_ms=0))
    loop.note_state_changed()
    # The state changed, but the last pass cost 200 ms: wait 3 x 200 ms before the next.
    assert loop.step(1_400) == "leader: nothing to do"
    assert loop.step(1_600) == "updating why 1 jobs wait (2 pending)"


def test_the_periodic_pass_also_waits_out_a_gap_longer_than_the_period() -> None:
    log = FakeLog()
    ticks = iter([0.0, 0.3, 1.0, 1.3])  # every pass costs 300 ms: a 900 ms gap
    loop, _ = elected(log, now=0, timer=lambda: next(ticks))
    log.propose(cmd.SubmitJob(spec=job("a", gpu=8), request_id="a", now_ms=0))
    loop.note_state_changed()
    assert loop.step(100) == "updating why 1 jobs wait (1 pending)"
    # Nothing changed: the 500 ms period is due at 600, but the gap holds it until 1,000.
    assert loop.step(600) == "leader: nothing to do"
    assert loop.step(999) == "leader: nothing to do"
    assert loop.step(1_000) == "scheduling pass: nothing to bind (1 pending)"


def test_passes_keep_the_plan_while_nothing_changes_and_a_new_term_plans_afresh() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("a"), now_ms=0))
    for name in ("first", "second", "third"):  # one fits; the others wait
        log.propose(cmd.SubmitJob(spec=job(name, gpu=8), request_id=name, now_ms=0))
    loop, _ = elected(log)
    assert "proposing to bind 1 gangs" in loop.step(1_100)
    now = 1_100
    for _ in range(4):  # periodic passes: the bind and the reasons are applied, then idle
        now += 600
        loop.step(now)
    planning = loop.planning
    assert planning.get("kept", 0) >= 2
    log.propose(cmd.SubmitJob(spec=job("fourth", gpu=8), request_id="fourth", now_ms=now))
    now += 600
    loop.step(now)
    assert loop.planning.get("extended", 0) == planning.get("extended", 0) + 1
    assert loop.planning["full"] == planning["full"]
    assert loop.last_plan is not None and len(loop.last_plan.reasons) == 3
    loop.on_role_change(False, 4, now)
    loop.on_role_change(True, 6, now)
    loop.step(now)
    loop.step(now)  # the barrier committed
    loop.step(now + 600)
    assert loop.planning["full"] == planning["full"] + 1  # a new term plans afresh


def test_losing_leadership_forgets_proposals_in_flight() -> None:
    log = FakeLog()
    for n in ("a", "b"):
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("g", replicas=2, gpu=8), request_id="r", now_ms=0))
    loop, _ = elected(log)
    log.hold = True
    assert "proposing to bind" in loop.step(1_100)  # bind in flight
    loop.on_role_change(False, 4, 1_100)
    assert not loop.ready
    assert loop.step(1_200) == "not the leader: nothing to do"
    loop.on_role_change(True, 6, 1_300)
    # The new term starts with a barrier, not with the old bind.
    assert "committing a barrier" in loop.step(1_300)
    assert isinstance(log.pending[-1][0], cmd.Barrier)


def test_time_limits_are_enforced_by_the_leader() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("a"), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("t", time_limit_s=60), request_id="r", now_ms=0))
    loop, liveness = elected(log, now=0)
    loop.step(1_000)  # binds
    (j,) = log.state.jobs.values()
    assert j.state is JobState.SCHEDULED
    liveness.heard("a", 61_000)
    said = loop.step(61_000)
    assert f"stopping {j.job_id} at its time limit" in said
    assert j.state is JobState.FAILED


def test_pending_jobs_are_cancelled_by_the_leader_at_their_deadline() -> None:
    log = FakeLog()
    log.propose(cmd.RaiseFormat(FORMAT))
    too_big = dataclasses.replace(job("t", gpu=64), deadline_delay_ms=30_000)
    log.propose(cmd.SubmitJob(spec=too_big, request_id="r", now_ms=0))
    loop, _ = elected(log, now=0)
    assert "deadline" not in loop.step(29_000)
    (j,) = log.state.jobs.values()
    said = loop.step(30_000)
    assert f"cancelling {j.job_id} at its deadline" in said
    assert j.state is JobState.CANCELLED and j.reason.code is ReasonCode.DEADLINE
    assert len(log.of_type(cmd.ExpireDeadline)) == 1
    loop.step(31_000)  # nothing more to do
    assert len(log.of_type(cmd.ExpireDeadline)) == 1


def test_finished_jobs_are_purged_periodically() -> None:
    log = FakeLog()
    loop, _ = elected(log, now=0)
    assert "purging" not in loop.step(59_999)
    assert "purging finished jobs" in loop.step(60_000)
    assert len(log.of_type(cmd.PurgeFinished)) == 1


def test_configured_timeouts_are_replicated_once() -> None:
    log = FakeLog()
    wanted = Timeouts(dead_timeout_ms=20_000)
    loop, _ = elected(log, now=0, desired=DesiredSettings(timeouts=wanted))
    assert "replicating the configured settings" in loop.step(1)
    assert log.state.config.timeouts == wanted
    loop.step(2)
    assert len(log.of_type(cmd.Configure)) == 1


def test_the_configured_locality_wait_is_replicated_and_a_refused_one_dropped() -> None:
    log = FakeLog()
    loop, _ = elected(log, now=0, desired=DesiredSettings(locality_wait_ms=0))
    assert "replicating the configured settings" in loop.step(1)
    assert log.state.config.locality_wait_ms == 0
    loop.step(2)
    assert len(log.of_type(cmd.Configure)) == 1

    log = FakeLog()
    loop, _ = elected(log, now=0, desired=DesiredSettings(locality_wait_ms=-1))
    log.hold = True
    loop.step(1)
    log.commit_pending()
    assert "refused" in loop.step(2)
    assert log.state.config.locality_wait_ms == ClusterConfig().locality_wait_ms
    loop.step(3)
    assert len(log.of_type(cmd.Configure)) == 1


def test_an_idle_leader_says_so() -> None:
    log = FakeLog()
    loop, _ = elected(log, now=0)
    loop.step(0)
    assert loop.step(1) == "leader: nothing to do"


def test_a_bind_without_outcome_is_abandoned_and_planned_again() -> None:
    log = FakeLog()
    for n in ("a", "b"):
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("g", replicas=2, gpu=8), request_id="r", now_ms=0))
    loop, _ = elected(log)
    log.hold = True
    assert "proposing to bind" in loop.step(1_100)
    timeout = LoopSettings().proposal_timeout_ms
    assert "a bind is in flight" in loop.step(1_100 + timeout - 1)
    said = loop.step(1_100 + timeout)
    assert "did not commit (no outcome within" in said
    assert "proposing to bind" in loop.step(1_100 + timeout + 600)
    assert len(log.of_type(cmd.BindPlan)) == 2


class RecordingNudger:
    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []

    def nudge(self, targets: Sequence[tuple[str, str]]) -> None:
        self.calls.append(list(targets))


def test_the_nodes_of_a_committed_bind_are_nudged_once() -> None:
    log = FakeLog()
    for n in ("a", "b", "c"):
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("g", replicas=2, gpu=8), request_id="r", now_ms=0))
    nudger = RecordingNudger()
    wakes: list[int] = []
    loop, _ = elected(log, nudger=nudger, wake=lambda: wakes.append(1))
    log.hold = True
    assert "proposing to bind" in loop.step(1_100)
    loop.step(1_110)
    assert nudger.calls == []  # not before the bind commits
    wakes.clear()
    log.commit_pending()
    assert wakes == [1]  # the settled proposal wakes the driver
    loop.step(1_120)
    (bound,) = log.state.jobs.values()
    assert bound.attempt is not None
    nodes = sorted({m.node_id for m in bound.attempt.members})
    assert nudger.calls == [[(n, log.state.nodes[n].info.address) for n in nodes]]
    loop.step(1_130)
    assert len(nudger.calls) == 1


def test_a_bind_that_fails_nudges_nobody() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("a"), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("g", gpu=8), request_id="r", now_ms=0))
    nudger = RecordingNudger()
    loop, _ = elected(log, nudger=nudger)
    log.hold = True
    loop.step(1_100)
    log.fail_pending()
    assert "did not commit" in loop.step(1_110)
    assert nudger.calls == []


def test_a_pass_held_back_by_the_gap_says_when_it_is_due() -> None:
    log = FakeLog()
    ticks = iter([0.0, 0.2, 1.0, 1.2])  # every pass costs 200 ms
    loop, _ = elected(log, now=0, timer=lambda: next(ticks))
    assert loop.next_step_in_ms(0) is None
    log.propose(cmd.SubmitJob(spec=job("a", gpu=8), request_id="a", now_ms=0))
    loop.note_state_changed()
    loop.step(1_000)
    loop.note_state_changed()
    loop.step(1_100)  # held back: the last pass cost 200 ms, so the gap is 600 ms
    assert loop.next_step_in_ms(1_100) == 500
    assert loop.next_step_in_ms(1_700) == 0
    loop.step(1_600)
    assert loop.next_step_in_ms(1_600) is None


def test_members_that_never_start_fail_their_attempt_at_the_start_timeout() -> None:
    log = FakeLog()
    for n in ("a", "b"):
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("g", replicas=2, gpu=8), request_id="r", now_ms=0))
    loop, liveness = elected(log, now=0)
    loop.step(1_000)  # binds at t=1s
    (j,) = log.state.jobs.values()
    attempt = j.attempt
    assert attempt is not None and j.state is JobState.SCHEDULED
    started = cmd.MemberEvent(j.job_id, attempt.fencing_token, 0, cmd.MemberEventKind.STARTED)
    log.propose(cmd.ReportMembers(attempt.members[0].node_id, (started,), now_ms=2_000))
    timeout = log.state.config.start_timeout_ms
    due = attempt.bound_at_ms + timeout
    for n in ("a", "b"):
        liveness.heard(n, due + 1_000)
    log.hold = True
    assert "failing" not in loop.step(due - 1)
    said = loop.step(due + 100)  # the next housekeeping round
    late = attempt.members[1].node_id
    assert f"failing {j.job_id}: rank(s) 1 on {late} not running 60s after bind" in said
    # One proposal in flight per job: nothing more while it is pending.
    assert "failing" not in loop.step(due + 300)
    (fail,) = log.of_type(cmd.FailAttempt)
    assert isinstance(fail, cmd.FailAttempt)
    assert fail.reason.code is ReasonCode.START_TIMEOUT and fail.fencing_token == j.fencing_token
    log.commit_pending()
    assert j.state is JobState.FAILED
    assert j.reason.code is ReasonCode.FAILED_START_TIMEOUT
    assert "failing" not in loop.step(due + 500)
    assert len(log.of_type(cmd.FailAttempt)) == 1


def test_members_all_running_are_never_failed_for_start_timeout() -> None:
    log = FakeLog()
    log.propose(cmd.RegisterNode(info=node("a"), now_ms=0))
    log.propose(cmd.SubmitJob(spec=job("g", gpu=8), request_id="r", now_ms=0))
    loop, liveness = elected(log, now=0)
    loop.step(1_000)
    (j,) = log.state.jobs.values()
    assert j.attempt is not None
    started = cmd.MemberEvent(j.job_id, j.fencing_token, 0, cmd.MemberEventKind.STARTED)
    log.propose(cmd.ReportMembers("a", (started,), now_ms=1_500))
    later = j.attempt.bound_at_ms + 10 * log.state.config.start_timeout_ms
    liveness.heard("a", later)
    loop.step(later)
    assert log.of_type(cmd.FailAttempt) == []
    assert j.state is JobState.RUNNING


def test_silences_count_from_the_last_heartbeat_or_the_baseline_whichever_is_later() -> None:
    liveness = Liveness()
    liveness.reset(1_000)  # an election at 1,000 ms
    liveness.heard("a", 1_500)
    liveness.heard("b", 800)  # before the election: counts as heard at the election
    liveness.heard("a", 1_200)  # an older heartbeat never moves the clock back
    assert liveness.silences(["a", "b", "never"], 3_000) == {"a": 1_500, "b": 2_000, "never": 2_000}
    liveness.raise_baseline(2_500)  # a stall of the leader
    assert liveness.silences(iter(["a", "b"]), 3_000) == {"a": 500, "b": 500}


def test_overdue_counts_the_late_and_names_the_dead_as_silences_says() -> None:
    liveness = Liveness()
    liveness.reset(1_000)
    for node_id, at in (("a", 9_000), ("b", 6_000), ("c", 3_000), ("d", 800)):
        liveness.heard(node_id, at)
    ids = ["d", "c", "b", "a", "never"]
    silences = liveness.silences(ids, 10_000)  # a 1,000; b 4,000; c 7,000; d, never 9,000
    late = sum(1 for s in silences.values() if s > 3_000)
    dead = [(n, s) for n, s in silences.items() if s > 6_000]
    assert liveness.overdue(iter(ids), 10_000, 3_000, 6_000) == (late, dead)
    assert liveness.overdue(ids, 10_000, 3_000, 6_000) == (
        4,
        [("d", 9_000), ("c", 7_000), ("never", 9_000)],
    )
    assert liveness.overdue(ids, 10_000, 4_000, 4_000) == (
        3,
        [("d", 9_000), ("c", 7_000), ("never", 9_000)],
    )
    liveness.raise_baseline(9_500)  # a stall: nobody is late right after it
    assert liveness.overdue(ids, 10_000, 3_000, 6_000) == (0, [])
