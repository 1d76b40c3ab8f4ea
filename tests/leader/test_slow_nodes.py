"""The leader's pace collector (leader/slow_nodes.py): a gang's window every window_ms from
its members' newest reports, a node marked degraded at its third strike (once every
replica reads format 15), its mark cleared once an operator makes it ready again."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.health.fitness import NodeCheck
from synapse_ha.core.health.slowness import DEGRADED, PaceReport
from synapse_ha.core.model import JobState, NodeStatus
from synapse_ha.core.replacement import ReplacePolicy
from synapse_ha.leader.loop import LeaderLoop
from synapse_ha.leader.slow_nodes import Heard, SlowNodes, SlowNodeSettings, gang_window
from tests.core.harness import job, node
from tests.leader.fakes import FakeLog
from tests.leader.test_leader import elected

WINDOW_MS = 1_000


def running_gang(floor: int = FORMAT) -> tuple[FakeLog, str]:
    log = FakeLog()
    log.propose(cmd.RaiseFormat(floor))
    for n in ("a", "b", "c", "d"):
        log.propose(cmd.RegisterNode(info=node(n), now_ms=0))
    spec = dataclasses.replace(job("g", replicas=3, gpu=8), replace=ReplacePolicy(300_000))
    job_id = log.propose(cmd.SubmitJob(spec=spec, request_id="r", now_ms=0)).result().job_id
    return log, job_id


def start(log: FakeLog, job_id: str, now: int) -> None:
    attempt = log.state.jobs[job_id].attempt
    assert attempt is not None
    for m in attempt.members:
        event = cmd.MemberEvent(job_id, attempt.fencing_token, m.rank, cmd.MemberEventKind.STARTED)
        log.propose(cmd.ReportMembers(m.node_id, (event,), now_ms=now))


def report_paces(log: FakeLog, slow: SlowNodes, job_id: str, now: int, slow_rank: int = 1) -> None:
    """Every member reports 800 ms per step, ``slow_rank`` 30% more."""
    attempt = log.state.jobs[job_id].attempt
    assert attempt is not None
    for m in attempt.members:
        step_us = 1_040_000 if m.rank == slow_rank else 800_000
        pace = PaceReport(job_id, attempt.fencing_token, m.rank, step_us, 50)
        slow.note(m.node_id, (pace,), now)


def leader(floor: int = FORMAT) -> tuple[FakeLog, str, LeaderLoop, SlowNodes]:
    log, job_id = running_gang(floor)
    slow = SlowNodes(SlowNodeSettings(window_ms=WINDOW_MS))
    loop, _ = elected(log, slow_nodes=slow)
    loop.step(1_100)  # binds the gang
    start(log, job_id, 1_150)
    assert log.state.jobs[job_id].state is JobState.RUNNING
    return log, job_id, loop, slow


def run_windows(
    log: FakeLog, loop: LeaderLoop, slow: SlowNodes, job_id: str, windows: int, now: int
) -> tuple[int, list[str]]:
    """Report paces and step through ``windows`` windows (the first step opens the
    gang's clock); the time reached and what the loop said."""
    said = []
    for _ in range(windows * 2):
        report_paces(log, slow, job_id, now)
        said.append(loop.step(now))
        now += WINDOW_MS // 2
    return now, said


def test_a_node_slowest_in_three_windows_is_marked_degraded_and_its_member_moved() -> None:
    log, job_id, loop, slow = leader()
    attempt = log.state.jobs[job_id].attempt
    assert attempt is not None
    slow_node = attempt.members[1].node_id
    now, _ = run_windows(log, loop, slow, job_id, 3, 2_000)
    assert log.of_type(cmd.MarkNodeDegraded) == []  # two strikes after three windows' time
    now, more = run_windows(log, loop, slow, job_id, 1, now)
    (mark,) = log.of_type(cmd.MarkNodeDegraded)
    assert isinstance(mark, cmd.MarkNodeDegraded) and mark.node_id == slow_node
    assert f"{job_id} window 0 (rank 1, 30%)" in mark.evidence
    assert mark.evidence.startswith(f"node {slow_node}: 30% slower than the median")
    assert any(f"marking node {slow_node} degraded" in s for s in more)
    node_state = log.state.nodes[slow_node]
    assert node_state.status is NodeStatus.CORDONED
    assert [k.name for k in node_state.conditions] == [DEGRADED]
    assert [v.rank for v in attempt.vacancies] == [1]  # a replace: gang leaves it
    # Marked once: later windows neither weigh it nor propose it again.
    run_windows(log, loop, slow, job_id, 3, now)
    assert len(log.of_type(cmd.MarkNodeDegraded)) == 1


def test_no_mark_before_every_replica_reads_format_15() -> None:
    log, job_id, loop, slow = leader(floor=14)
    now, said = run_windows(log, loop, slow, job_id, 5, 2_000)
    assert log.of_type(cmd.MarkNodeDegraded) == []
    assert any("not every replica reads format 15" in s for s in said)
    log.propose(cmd.RaiseFormat(15))
    loop.step(now)
    assert len(log.of_type(cmd.MarkNodeDegraded)) == 1


def test_an_operators_uncordon_clears_the_mark_and_the_node_is_weighed_afresh() -> None:
    log, job_id, loop, slow = leader()
    attempt = log.state.jobs[job_id].attempt
    assert attempt is not None
    slow_node = attempt.members[1].node_id
    now, _ = run_windows(log, loop, slow, job_id, 4, 2_000)
    assert log.state.nodes[slow_node].status is NodeStatus.CORDONED
    log.propose(cmd.SetNodeStatus(slow_node, NodeStatus.READY, "", now, "user:ops"))
    now += 1_000  # the nodes are looked over once a second
    said = loop.step(now)
    assert f"clearing node {slow_node}'s degraded mark" in said
    (clear,) = log.of_type(cmd.ReportNodeChecks)
    assert clear == cmd.ReportNodeChecks(slow_node, (NodeCheck(DEGRADED, False),), now)
    assert log.state.nodes[slow_node].conditions == ()
    assert log.state.nodes[slow_node].status is NodeStatus.READY
    assert slow.marked == (slow_node,)
    loop.step(now + WINDOW_MS)
    assert slow.marked == ()


def test_a_new_term_forgets_the_evidence() -> None:
    log, job_id, loop, slow = leader()
    now, _ = run_windows(log, loop, slow, job_id, 3, 2_000)
    loop.on_role_change(False, 4, now)
    loop.on_role_change(True, 5, now)
    loop.step(now)
    loop.step(now)  # the barrier commits
    now, _ = run_windows(log, loop, slow, job_id, 2, now)
    assert log.of_type(cmd.MarkNodeDegraded) == []  # its strikes start again


def test_reports_breaking_a_rule_are_ignored_and_counted() -> None:
    slow = SlowNodes()
    slow.note("a", (PaceReport("job-1", 4, -1, 10, 1), PaceReport("job-1", 4, 0, 0, 1)), 5)
    slow.note("a", (PaceReport("job-1", 4, 0, 10, 1, "x" * 40),), 5)
    assert slow.ignored == 3


def test_a_window_takes_only_fresh_reports_of_the_attempt_from_the_members_node() -> None:
    log, job_id, _, _ = leader()
    attempt = log.state.jobs[job_id].attempt
    assert attempt is not None
    token = attempt.fencing_token
    a, b, c = (m.node_id for m in attempt.members)
    heard = [
        Heard(a, PaceReport(job_id, token, 0, 800, 9), 2_000),
        Heard(b, PaceReport(job_id, token, 1, 900, 9, "stage-1"), 2_500),
        Heard(a, PaceReport(job_id, token, 2, 700, 9), 2_500),  # not rank 2's node
        Heard(c, PaceReport(job_id, token + 1, 2, 700, 9), 2_500),  # another attempt
        Heard(c, PaceReport(job_id, token, 2, 700, 9), 1_500),  # before the window
    ]
    window = gang_window(log.state, job_id, attempt, heard, 3, 2_000)
    assert window.job_id == job_id and window.window == 3
    assert [(p.node_id, p.rank, p.step_us, p.peers) for p in window.members] == [
        (a, 0, 800, ""),
        (b, 1, 900, "stage-1"),
    ]
