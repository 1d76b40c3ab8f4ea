"""Elastic gangs (core/elastic.py): ``replicas: {min, max}`` starts with ``min`` members
when ``max`` do not fit, grows by new top ranks when room appears and nobody waits for it,
and gives its members above ``min`` back to a gang that waits for room."""

from __future__ import annotations

import dataclasses
import re

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.model import JobSpec, JobState, MemberPlacement, MemberState
from synapse_ha.core.node_selector import NodeSelector
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.replacement import ReplacePolicy
from synapse_ha.core.scheduler.elastic import WAITS_FOR_ROOM, plan_growth, plan_shrink
from synapse_ha.core.scheduler.replacement import plan_replacements
from synapse_ha.core.spares import spare_nodes
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.views import desired_members
from tests.core.harness import Cluster, job, node


def elastic(spec: JobSpec, fewest: int, signal: str = "SIGUSR1") -> JobSpec:
    return dataclasses.replace(spec, elastic=ElasticPolicy(fewest, signal))


def racks(nodes_per_rack: int = 4) -> Cluster:
    cluster = Cluster()
    cluster.add(
        *(node(f"a{i}", rack="r1") for i in range(nodes_per_rack)),
        *(node(f"b{i}", rack="r2") for i in range(nodes_per_rack)),
    )
    return cluster


def start(cluster: Cluster, spec: JobSpec) -> str:
    job_id = cluster.submit(spec)
    cluster.run_pass()
    assert cluster.state_of(job_id) is JobState.SCHEDULED, cluster.state.jobs[job_id].reason
    cluster.start_all(job_id)
    return job_id


def report(cluster: Cluster, job_id: str, rank: int, kind: c.MemberEventKind) -> c.Result:
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    member = attempt.members[rank]
    event = c.MemberEvent(job_id, attempt.fencing_token, rank, kind, generation=member.generation)
    return cluster.do(c.ReportMembers(member.node_id, (event,), 7, cluster.now))


def content(cluster: Cluster) -> tuple[str, str]:
    """What a refused command must not change: the jobs and the nodes."""
    return repr(cluster.state.jobs), repr(cluster.state.nodes)


def size(cluster: Cluster, job_id: str) -> int:
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    return len(attempt.members)


def test_the_spec_takes_min_and_max_and_names_what_is_wrong() -> None:
    doc = {"name": "t", "command": "true", "replicas": {"min": 2, "max": 6}}
    spec = parse_job_spec({**doc, "membership_signal": "usr2"}).spec
    assert spec.replicas == 6 and spec.elastic == ElasticPolicy(2, "SIGUSR2")
    assert spec.replace is None
    assert parse_job_spec({**doc, "replicas": 3}).spec.elastic is None
    for replicas, says in [
        ({"min": 4, "max": 4}, "replicas.min: must be at least 1 and below replicas.max (4)"),
        ({"min": 0, "max": 4}, "replicas.min: must be at least 1"),
        ({"max": 4}, "replicas.min: is required"),
        ({"min": 1, "max": 4, "most": 5}, "replicas.most: unknown field"),
        ({"min": "two", "max": 4}, "replicas.min: expected an integer"),
    ]:
        with pytest.raises(SpecError, match=re.escape(says)):
            parse_job_spec({**doc, "replicas": replicas})
    # membership_signal belongs to replacing or elastic gangs only.
    with pytest.raises(SpecError, match="membership_signal: needs on_node_failure: replace"):
        parse_job_spec({**doc, "replicas": 3, "membership_signal": "usr1"})


def test_an_elastic_gang_starts_with_as_many_as_fit_when_its_max_does_not() -> None:
    cluster = racks()
    blocker = start(cluster, job("big", replicas=5, gpu=8))
    job_id = start(cluster, elastic(job(replicas=4, gpu=8, required="rack"), 2))
    assert size(cluster, job_id) == 3  # 3 nodes free in one rack: between min and max
    assert len(cluster.racks_of(job_id)) == 1
    # A fixed gang of the same shape waits.
    fixed = cluster.submit(job(replicas=4, gpu=8, required="rack"))
    cluster.run_pass()
    assert cluster.state_of(fixed) is JobState.PENDING
    assert cluster.state_of(blocker) is JobState.RUNNING


def test_a_bind_of_an_elastic_gang_outside_min_and_max_is_refused() -> None:
    cluster = racks()
    job_id = cluster.submit(elastic(job(replicas=4, gpu=8), 2))
    one = (MemberPlacement(0, "a0", tuple(range(8))),)
    result = cluster.do(c.BindPlan((c.GangPlacement(job_id, 0, one),), now_ms=cluster.now))
    assert [r.code for r in result.rejected] == [c.RejectCode.WRONG_SIZE]
    assert "job needs 2 to 4" in result.rejected[0].message
    assert cluster.state_of(job_id) is JobState.PENDING


def test_it_grows_when_room_appears_and_its_members_are_told() -> None:
    cluster = racks()
    blocker = start(cluster, job("big", replicas=6, gpu=8))
    job_id = start(cluster, elastic(job(replicas=4, gpu=8, required="rack"), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None and size(cluster, job_id) == 2
    before = 2
    assert plan_growth(cluster.state, cluster.now) is None  # no room in its rack
    # The blocker ends: room appears, and the gang grows within its required rack.
    for rank in range(6):
        cluster.exit_member(blocker, rank, 0)
    growth = plan_growth(cluster.state, cluster.now)
    assert growth is not None
    (g,) = growth.growths
    assert [m.rank for m in g.members] == list(range(before, 4))
    assert all(m.generation == 1 for m in g.members)  # membership + 1
    result = cluster.do(growth)
    assert result.ok and result.bound == (job_id,) and not result.rejected
    assert size(cluster, job_id) == 4 and len(cluster.racks_of(job_id)) == 1
    assert attempt.membership == 1
    new = attempt.members[3]
    assert attempt.member_status[3].state is MemberState.BOUND
    (wanted,) = desired_members(cluster.state, new.node_id)
    assert (wanted.rank, wanted.world_size, wanted.membership) == (3, 4, 1)
    survivor = desired_members(cluster.state, attempt.members[0].node_id)[0]
    assert survivor.world_size == 4 and survivor.membership == 1
    assert survivor.membership_signal == "SIGUSR1"
    report(cluster, job_id, 3, c.MemberEventKind.STARTED)
    job_ = cluster.state.jobs[job_id]
    assert render(job_.reason) == "attempt 1 running with 4 of 4 members"
    # Full: no growth left.
    assert plan_growth(cluster.state, cluster.now) is None


def test_it_does_not_grow_while_a_gang_waits_for_room_nor_onto_a_spare() -> None:
    cluster = racks()
    cluster.do(c.Configure(dataclasses.replace(cluster.state.config, spares=1)))
    spares = spare_nodes(cluster.state)
    assert len(spares) == 2  # one per rack
    blocker = start(cluster, job("big", replicas=4, gpu=8))
    job_id = start(cluster, elastic(job(replicas=8, gpu=8), 1))
    assert size(cluster, job_id) == 2  # 6 nodes are not spares, 4 are taken
    # A gang waiting for room keeps the elastic one from growing into it.
    waiting = cluster.submit(job("wants", replicas=3, gpu=8))
    for rank in range(4):
        cluster.exit_member(blocker, rank, 0)
    assert plan_growth(cluster.state, cluster.now) is None  # not looked at yet
    cluster.run_pass()
    assert cluster.state_of(waiting) is JobState.SCHEDULED
    growth = plan_growth(cluster.state, cluster.now)
    assert growth is not None and cluster.do(growth).ok
    assert size(cluster, job_id) == 3 and not spares & set(cluster.nodes_of(job_id))
    assert plan_growth(cluster.state, cluster.now) is None  # only spares are left
    big = cluster.submit(job("big2", replicas=4, gpu=8))
    cluster.run_pass()
    assert cluster.state.jobs[big].reason.code in WAITS_FOR_ROOM
    assert cluster.do(c.CancelJob(waiting, now_ms=cluster.now)).ok
    assert plan_growth(cluster.state, cluster.now) is None  # big2 waits for the room


def test_a_growth_that_went_stale_is_refused_and_changes_nothing() -> None:
    cluster = racks()
    blocker = start(cluster, job("big", replicas=6, gpu=8))
    job_id = start(cluster, elastic(job(replicas=4, gpu=8), 2))
    assert size(cluster, job_id) == 2
    for rank in range(6):
        cluster.exit_member(blocker, rank, 0)
    growth = plan_growth(cluster.state, cluster.now)
    assert growth is not None
    # Someone else takes the room first.
    other = cluster.submit(job("other", replicas=6, gpu=8))
    cluster.run_pass()
    assert cluster.state_of(other) is JobState.SCHEDULED
    before = content(cluster)
    result = cluster.do(growth)
    assert [r.code for r in result.rejected] in ([c.RejectCode.GPU_IN_USE], [c.RejectCode.NO_ROOM])
    assert content(cluster) == before


def test_it_shrinks_to_give_a_waiting_gang_its_room_and_drops_the_ranks_once_stopped() -> None:
    cluster = racks()
    job_id = start(cluster, elastic(job(replicas=8, gpu=8), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None and size(cluster, job_id) == 8
    waiting = cluster.submit(job("wants", replicas=4, gpu=8))
    cluster.run_pass()
    assert cluster.state_of(waiting) is JobState.PENDING
    assert plan_growth(cluster.state, cluster.now) is None
    shrinks = plan_shrink(cluster.state, cluster.now)
    # Only as many members as the waiting gang needs.
    assert [(s.job_id, s.size, s.for_job) for s in shrinks] == [(job_id, 4, waiting)]
    result = cluster.do(shrinks[0])
    assert result.ok, result.message
    job_ = cluster.state.jobs[job_id]
    assert job_.reason.code is ReasonCode.SHRINKING
    assert render(job_.reason) == (
        f"attempt 1 running; shrinking from 8 to 4 members to make room for {waiting}"
    )
    # The leaving members are no longer wanted; the others are, unchanged.
    leaving_nodes = [m.node_id for m in attempt.members[4:]]
    assert all(desired_members(cluster.state, n) == [] for n in leaving_nodes)
    assert desired_members(cluster.state, attempt.members[0].node_id)[0].world_size == 8
    # Not freed until each is confirmed stopped: the waiting gang still waits.
    cluster.run_pass()
    assert cluster.state_of(waiting) is JobState.PENDING
    for rank in range(4, 8):
        report(cluster, job_id, rank, c.MemberEventKind.EXITED)
    assert size(cluster, job_id) == 4 and not attempt.vacancies
    assert attempt.membership == 1 and job_.state is JobState.RUNNING
    assert render(job_.reason) == "attempt 1 running with 4 of 8 members"
    kept = desired_members(cluster.state, attempt.members[0].node_id)[0]
    assert kept.world_size == 4 and kept.membership == 1
    cluster.run_pass()
    assert cluster.state_of(waiting) is JobState.SCHEDULED


def test_a_dead_node_under_a_leaving_member_costs_the_gang_nothing() -> None:
    cluster = racks()
    job_id = start(cluster, elastic(job(replicas=8, gpu=8), 6))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    result = cluster.do(c.ShrinkMembers(job_id, attempt.fencing_token, 6, "", cluster.now))
    assert result.ok
    report(cluster, job_id, 6, c.MemberEventKind.EXITED)
    cluster.now += 20_000
    dead = cluster.do(c.MarkNodeDead(attempt.members[7].node_id, "silent", 1, cluster.now))
    assert dead.stopped == ()
    assert cluster.state_of(job_id) is JobState.RUNNING and size(cluster, job_id) == 6
    assert cluster.state.jobs[job_id].requeues == 0


def test_shrinks_that_break_a_rule_are_refused_and_change_nothing() -> None:
    cluster = racks()
    fixed = start(cluster, job(replicas=2, gpu=8))
    job_id = start(cluster, elastic(job(replicas=4, gpu=8), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    token = attempt.fencing_token
    before = content(cluster)
    fixed_token = cluster.state.jobs[fixed].fencing_token
    for command, says in [
        (c.ShrinkMembers(fixed, fixed_token, 1), "is not elastic"),
        (c.ShrinkMembers(job_id, token, 1), "its min is 2"),
        (c.ShrinkMembers(job_id, token, 4), "cannot shrink from 4 to 4"),
        (c.ShrinkMembers(job_id, token + 99, 2), "no longer live"),
        (c.ShrinkMembers("nope", token, 2), "no job"),
    ]:
        result = cluster.do(command)
        assert not result.ok and says in result.message, result.message
    assert content(cluster) == before


def test_the_state_with_an_elastic_gang_round_trips() -> None:
    cluster = racks()
    job_id = start(cluster, elastic(job(replicas=8, gpu=8), 3, signal=""))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    cluster.do(c.ShrinkMembers(job_id, attempt.fencing_token, 5, "", cluster.now))
    copy = decode_state(encode_state(cluster.state))
    assert copy.jobs[job_id].spec.elastic == ElasticPolicy(3, "")
    assert encode_state(copy) == encode_state(cluster.state)


def test_a_higher_priority_gang_shrinks_an_elastic_one_rather_than_preempt_it_whole() -> None:
    cluster = racks()
    job_id = start(cluster, elastic(job(replicas=8, gpu=8), 3))
    urgent = cluster.submit(job("urgent", replicas=4, gpu=8, priority_class="high"))
    plan = cluster.run_pass()
    assert not plan.preemptions  # shrinking makes the room: no one is preempted whole
    assert cluster.state.jobs[job_id].attempt.preempted_by == ""  # type: ignore[union-attr]
    (shrink,) = plan_shrink(cluster.state, cluster.now)
    assert (shrink.job_id, shrink.size, shrink.for_job) == (job_id, 4, urgent)
    assert cluster.do(shrink).ok
    for rank in range(4, 8):
        report(cluster, job_id, rank, c.MemberEventKind.EXITED)
    cluster.run_pass()
    assert cluster.state_of(urgent) is JobState.SCHEDULED
    assert cluster.state_of(job_id) is JobState.RUNNING and size(cluster, job_id) == 4
    # A gang the shrink cannot make room for still preempts as before.
    big = cluster.submit(job("big", replicas=4, gpu=8, priority_class="high"))
    assert [v.job_id for p in cluster.run_pass().preemptions for v in p.victims] == [job_id]
    assert cluster.state_of(big) is JobState.PENDING


def test_a_rank_given_back_and_grown_again_is_a_member_of_its_own() -> None:
    cluster = racks(nodes_per_rack=2)
    job_id = start(cluster, elastic(job(replicas=4, gpu=8), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None and size(cluster, job_id) == 4
    first = attempt.members[3]
    assert cluster.do(c.ShrinkMembers(job_id, attempt.fencing_token, 2, "", cluster.now)).ok
    for rank in (2, 3):
        report(cluster, job_id, rank, c.MemberEventKind.EXITED)
    assert size(cluster, job_id) == 2
    growth = plan_growth(cluster.state, cluster.now)
    assert growth is not None and cluster.do(growth).ok
    again = attempt.members[3]
    assert again.node_id == first.node_id and again.generation > first.generation
    assert all(m.generation <= attempt.membership for m in attempt.members)
    # A late report of the member given back does not count for the new one.
    late = c.MemberEvent(
        job_id, attempt.fencing_token, 3, c.MemberEventKind.STARTED, generation=first.generation
    )
    cluster.do(c.ReportMembers(first.node_id, (late,), 7, cluster.now))
    assert attempt.member_status[3].state is MemberState.BOUND


def test_a_rank_given_back_before_its_worker_saw_it_is_asked_to_report_itself_stopped() -> None:
    cluster = racks(nodes_per_rack=2)
    blocker = start(cluster, job("big", replicas=2, gpu=8))
    job_id = start(cluster, elastic(job(replicas=4, gpu=8), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None and size(cluster, job_id) == 2
    for rank in range(2):
        cluster.exit_member(blocker, rank, 0)
    growth = plan_growth(cluster.state, cluster.now)
    assert growth is not None and cluster.do(growth).ok
    fresh = attempt.members[3]
    assert attempt.member_status[3].state is MemberState.BOUND  # never reported started
    assert cluster.do(c.ShrinkMembers(job_id, attempt.fencing_token, 2, "", cluster.now)).ok
    (wanted,) = desired_members(cluster.state, fresh.node_id)
    assert (wanted.rank, wanted.ended, wanted.generation) == (3, True, fresh.generation)
    for rank in (2, 3):
        report(cluster, job_id, rank, c.MemberEventKind.EXITED)
    assert size(cluster, job_id) == 2 and desired_members(cluster.state, fresh.node_id) == []


def elastic_replacing(spec: JobSpec, fewest: int) -> JobSpec:
    return dataclasses.replace(elastic(spec, fewest), replace=ReplacePolicy())


@pytest.mark.parametrize("lost_rank", [3, 1])
def test_an_elastic_gang_with_a_lost_rank_no_node_can_hold_carries_on_smaller(
    lost_rank: int,
) -> None:
    cluster = racks(nodes_per_rack=2)
    job_id = start(cluster, elastic_replacing(job(replicas=4, gpu=8), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None and size(cluster, job_id) == 4
    lost = attempt.members[lost_rank]
    cluster.now += 20_000
    assert cluster.do(c.MarkNodeDead(lost.node_id, "silent", 1, cluster.now)).replacing
    assert plan_replacements(cluster.state, cluster.now) is None  # no free node
    (shrink,) = plan_shrink(cluster.state, cluster.now)
    assert (shrink.job_id, shrink.size, shrink.for_job) == (job_id, 3, "")
    assert cluster.do(shrink).ok
    if lost_rank == 3:  # the lost rank was the top one: dropped at once
        assert size(cluster, job_id) == 3 and not attempt.vacancies
        assert render(cluster.state.jobs[job_id].reason) == "attempt 1 running with 3 of 4 members"
        return
    # A running top rank is given back; once it stopped, its node takes the lost rank.
    top = attempt.members[3]
    report(cluster, job_id, 3, c.MemberEventKind.EXITED)
    assert size(cluster, job_id) == 3 and [v.rank for v in attempt.vacancies] == [1]
    replacement = plan_replacements(cluster.state, cluster.now)
    assert replacement is not None and cluster.do(replacement).ok
    assert attempt.members[1].node_id == top.node_id and not attempt.vacancies
    assert cluster.state.jobs[job_id].requeues == 0


def test_a_shrink_frees_the_node_a_waiting_gangs_selector_asks_for() -> None:
    cluster = racks(nodes_per_rack=2)
    job_id = start(cluster, elastic(job(replicas=4, gpu=8), 1))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    pinned_to = attempt.members[2].node_id
    spec = dataclasses.replace(job("pinned", gpu=8), nodes=NodeSelector(names=(pinned_to,)))
    pinned = cluster.submit(spec)
    cluster.run_pass()
    (shrink,) = plan_shrink(cluster.state, cluster.now)
    # Rank 3's node is no use to it: ranks 3 and 2 are given back, no fewer.
    assert (shrink.job_id, shrink.size, shrink.for_job) == (job_id, 2, pinned)
    assert cluster.do(shrink).ok
    for rank in (2, 3):
        report(cluster, job_id, rank, c.MemberEventKind.EXITED)
    cluster.run_pass()
    assert cluster.nodes_of(pinned) == [pinned_to]
