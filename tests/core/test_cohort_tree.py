"""The cohort tree (core/queues/cohort_tree.py): what a queue may borrow at every level, the
records' rules and their format, and reclaim nearest first (DESIGN §8)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core import invariants
from synapse_ha.core.cluster_config import (
    ClusterConfig,
    Cohort,
    PreemptionKind,
    PreemptionMode,
    Queue,
    QueueHistory,
)
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.codec.from_plain import from_plain_compiled
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState, Resources
from synapse_ha.core.queues.cohort_tree import MAX_COHORT_DEPTH, CohortTree, distance
from synapse_ha.core.queues.quota import QueueUsage
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.scheduler.order import ordered_pending
from tests.core.harness import Cluster, job, node
from tests.core.test_codec_decoders import assert_built_as_by_constructors
from tests.core.test_properties import tree_breaches
from tests.core.test_queues import run

ORG = (
    Cohort("org"),
    Cohort("team-a", "org", borrowing_limit_gpu=4),
    Cohort("team-b", "org", lending_limit_gpu=2),
)
QUEUES = (
    Queue("a1", gpu=8, cohort="team-a"),
    Queue("a2", gpu=8, cohort="team-a"),
    Queue("b1", gpu=8, cohort="team-b"),
    Queue("b2", gpu=8, cohort="team-b"),
)


def usage(
    used: dict[str, int],
    cohorts: tuple[Cohort, ...] = ORG,
    queues: tuple[Queue, ...] = QUEUES,
) -> QueueUsage:
    return QueueUsage(
        {q.name: q for q in queues},
        {name: Resources(gpu=gpu) for name, gpu in used.items()},
        {r.name: r for r in cohorts},
    )


# --------------------------------------------------------------------- arithmetic


def test_an_idle_tree_lends_up_to_every_limit_on_the_way() -> None:
    u = usage({})
    # a1: a2 lends 8 within team-a; beyond that team-a borrows from org, at most its
    # limit 4, of which team-b lends at most 2: 8 + 2.
    assert u.borrowable("a1") == 10
    assert u.headroom_gpu("a1") == 18
    # b1: b2 lends 8; team-a lends all its 16 idle GPUs (no lending limit): 8 + 16.
    assert u.borrowable("b1") == 24


def test_a_sibling_borrowing_is_counted_at_its_own_level_first() -> None:
    u = usage({"a2": 12})  # a2 borrows 4 of a1's idle nominal
    # a1 keeps its idle 8 (a reclaim would get it back) but may borrow nothing: team-a
    # would borrow 4 + x from org, and its limit is 4.
    assert u.borrowable("a1") == 0
    assert u.headroom_gpu("a1") == 8
    # a2 may take a1's other 4, then 2 of team-b's (its lending limit): 4 + 2.
    assert u.borrowable("a2") == 6
    # b1: b2 lends 8, team-a lends its spare 4: 12.
    assert u.borrowable("b1") == 12


def test_a_cohorts_own_nominal_is_shared_by_the_queues_below_it() -> None:
    cohorts = (Cohort("org", gpu=4), *ORG[1:])
    u = usage({}, cohorts)
    # org lends its own 4 and team-b's 2, but team-a may borrow only 4 beyond its pool.
    assert u.borrowable("a1") == 12
    u = usage({}, (Cohort("org", gpu=4), Cohort("team-a", "org"), ORG[2]))
    assert u.borrowable("a1") == 8 + 4 + 2


def test_the_queues_own_borrowing_limit_still_holds_in_a_tree() -> None:
    queues = (Queue("a1", gpu=8, cohort="team-a", borrowing_limit_gpu=3), *QUEUES[1:])
    assert usage({}, queues=queues).borrowable("a1") == 3
    assert usage({"a1": 10}, queues=queues).borrowable("a1") == 1


def test_a_cohort_over_its_limit_lends_its_queues_nothing_more() -> None:
    # team-a already borrows 6 from org (more than its limit 4, set after the fact).
    u = usage({"a1": 11, "a2": 11})
    assert u.borrowable("a1") == 0 and u.borrowable("a2") == 0
    assert u.headroom_gpu("a1") == 0


def test_deeper_trees_bound_borrowing_at_every_ancestor() -> None:
    cohorts = (
        Cohort("org"),
        Cohort("div", "org", borrowing_limit_gpu=5),
        Cohort("team", "div", borrowing_limit_gpu=100),
        Cohort("other", "org"),
    )
    queues = (
        Queue("t1", gpu=2, cohort="team"),
        Queue("o1", gpu=20, cohort="other"),
    )
    # t1 may borrow o1's 20 idle GPUs only through div, whose limit is 5.
    assert usage({}, cohorts, queues).borrowable("t1") == 5
    tree = CohortTree({q.name: q for q in queues}, {r.name: r for r in cohorts}, lambda q: 0)
    assert tree.nominal("org") == 22 and tree.nominal("div") == 2
    assert distance("team", "other", {r.name: r for r in cohorts}) == 2
    assert distance("team", "team", {r.name: r for r in cohorts}) == 0
    assert distance("team", "elsewhere", {r.name: r for r in cohorts}) is None


def _flat_borrowable(queues: dict[str, Queue], used: dict[str, int], name: str) -> int:
    """The flat rule as it was before the cohort tree: what the other queues of the cohort
    lend less what every queue of it borrows, within the queue's own limit."""
    q = queues[name]
    if q.gpu is None or not q.cohort:
        return 0
    members = [
        n for n in sorted(queues) if queues[n].cohort == q.cohort and queues[n].gpu is not None
    ]

    def lendable(n: str) -> int:
        nominal = queues[n].gpu or 0
        idle = max(0, nominal - used.get(n, 0))
        limit = queues[n].lending_limit_gpu
        return idle if limit is None else min(idle, limit)

    def borrowed(n: str) -> int:
        return max(0, used.get(n, 0) - (queues[n].gpu or 0))

    pool = sum(lendable(n) for n in members if n != name) - sum(borrowed(n) for n in members)
    room = max(0, pool)
    if q.borrowing_limit_gpu is not None:
        room = min(room, max(0, q.borrowing_limit_gpu - borrowed(name)))
    return room


_limit = st.one_of(st.none(), st.integers(0, 12))


@st.composite
def _flat_queues(draw: st.DrawFn) -> tuple[dict[str, Queue], dict[str, int]]:
    queues: dict[str, Queue] = {}
    used: dict[str, int] = {}
    for i in range(draw(st.integers(1, 5))):
        name = f"q{i}"
        gpu = draw(st.one_of(st.none(), st.integers(0, 16)))
        cohort = draw(st.sampled_from(["", "lab", "lab", "other"])) if gpu is not None else ""
        lending = draw(_limit)
        if gpu is not None and lending is not None:
            lending = min(lending, gpu)
        queues[name] = Queue(
            name,
            gpu=gpu,
            cohort=cohort,
            borrowing_limit_gpu=draw(_limit),
            lending_limit_gpu=lending,
        )
        used[name] = draw(st.integers(0, 30))
    return queues, used


@settings(max_examples=300, deadline=None)
@given(_flat_queues())
def test_without_cohort_records_the_answers_are_the_flat_ones(
    case: tuple[dict[str, Queue], dict[str, int]],
) -> None:
    queues, used = case
    u = QueueUsage(queues, {n: Resources(gpu=g) for n, g in used.items()})
    for name in queues:
        assert u.borrowable(name) == _flat_borrowable(queues, used, name), name


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([q.name for q in QUEUES]), st.integers(-8, 8)),
        max_size=30,
    )
)
def test_what_a_queue_may_borrow_follows_every_change_of_its_usage(
    changes: list[tuple[str, int]],
) -> None:
    """The answers a usage keeps between changes are the tree's answers for the usage
    at that moment, however the questions and changes interleave."""
    u = usage({})
    held = {q.name: 0 for q in QUEUES}
    for name, delta in changes:
        for q in QUEUES:  # asked (and kept) before the change
            u.borrowable(q.name)
        if delta >= 0:
            u.add(name, Resources(gpu=delta))
        else:
            u.remove(name, Resources(gpu=-delta))
        held[name] += delta
        fresh = usage(held)
        for q in QUEUES:
            assert u.borrowable(q.name) == fresh.tree.borrowable(q.name), (q.name, held)
            assert u.headroom_gpu(q.name) == fresh.headroom_gpu(q.name), (q.name, held)


# ------------------------------------------------------------------------ records


def _state(floor: int = FORMAT) -> ClusterState:
    return ClusterState(format_floor=floor)


def test_cohort_records_are_set_replaced_and_deleted() -> None:
    state = _state()
    assert apply(state, c.SetCohort(Cohort("org"), 1)).message == "cohort org created"
    assert apply(state, c.SetCohort(Cohort("team", "org", gpu=4), 2)).ok
    assert apply(state, c.SetCohort(Cohort("team", "org", gpu=8), 3)).message == (
        "cohort team updated"
    )
    assert state.cohorts["team"].gpu == 8
    refused = apply(state, c.DeleteCohort("org", 4))
    assert refused.code is c.ResultCode.CONFLICT and "parent of team" in refused.message
    assert apply(state, c.DeleteCohort("team", 5)).ok
    assert apply(state, c.DeleteCohort("org", 6)).ok
    assert apply(state, c.DeleteCohort("org", 7)).code is c.ResultCode.NOT_FOUND
    assert state.cohorts == {}


def _refused(state: ClusterState, cohort: Cohort, words: str) -> None:
    before = dict(state.cohorts)
    result = apply(state, c.SetCohort(cohort, 9))
    assert result.code is c.ResultCode.INVALID, result.message
    assert words in result.message, result.message
    assert state.cohorts == before


def test_bad_cohorts_are_refused_naming_the_field_and_change_nothing() -> None:
    state = _state()
    for record in (Cohort("org"), Cohort("team", "org"), Cohort("project", "team")):
        assert apply(state, c.SetCohort(record, 1)).ok
    _refused(state, Cohort("org", "project"), "parent: would make a cycle (org -> project")
    _refused(state, Cohort("team", "team"), "parent: a cohort cannot be its own parent")
    _refused(state, Cohort("x", "nowhere"), "parent: no cohort 'nowhere'")
    _refused(state, Cohort("Bad_Name"), "name: lowercase letters")
    _refused(state, Cohort("x", gpu=-1), "gpu: must be between 0")
    _refused(state, Cohort("x", borrowing_limit_gpu=-2), "borrowing_limit_gpu: must be")
    _refused(state, Cohort("x", lending_limit_gpu=-3), "lending_limit_gpu: must be")


def test_the_tree_depth_is_bounded() -> None:
    state = _state()
    parent = ""
    for i in range(MAX_COHORT_DEPTH):
        assert apply(state, c.SetCohort(Cohort(f"l{i}", parent), 1)).ok
        parent = f"l{i}"
    _refused(state, Cohort("deeper", parent), f"at most {MAX_COHORT_DEPTH}")
    # Moving a subtree under another counts the subtree's height too.
    assert apply(state, c.SetCohort(Cohort("top"), 1)).ok
    _refused(state, Cohort("l0", "top"), f"at most {MAX_COHORT_DEPTH}")


def test_cohort_records_need_format_7() -> None:
    state = _state(floor=6)
    before = copy.deepcopy(state)
    result = apply(state, c.SetCohort(Cohort("org"), 1))
    assert result.code is c.ResultCode.CONFLICT
    assert "needs format 7" in result.message
    assert apply(state, c.DeleteCohort("org", 1)).code is c.ResultCode.CONFLICT
    assert state.cohorts == before.cohorts == {}


def test_the_state_with_cohorts_survives_the_codec() -> None:
    state = _state()
    assert apply(state, c.SetCohort(Cohort("org", gpu=2, lending_limit_gpu=1), 1)).ok
    assert apply(state, c.SetCohort(Cohort("team", "org", borrowing_limit_gpu=3), 1)).ok
    assert decode_state(encode_state(state)).cohorts == state.cohorts
    assert b"cohorts" not in encode_state(_state())
    # The compact layout and the compiled decoders read them alike.
    compact = replace(state, config=replace(state.config, compact_state=True))
    data = encode_state(compact)
    assert decode_state(data) == compact
    built = from_plain_compiled(ClusterState, json.loads(data)["state"])
    assert built.cohorts == state.cohorts
    assert_built_as_by_constructors(built)


# ------------------------------------------------------------------------ the pass


def tree_cluster(cohorts: tuple[Cohort, ...], *queues: Queue, nodes: int = 4) -> Cluster:
    config = ClusterConfig(preemption=PreemptionMode.TOPOLOGY, locality_wait_ms=0)
    cl = Cluster(state=ClusterState(config=config, format_floor=FORMAT))
    for h in range(nodes):
        cl.add(node(f"h{h}", gpus=8, rack=f"r{h % 2}"))
    for record in cohorts:
        assert cl.do(c.SetCohort(record, cl.now)).ok
    for q in queues:
        assert cl.do(c.SetQueue(q, cl.now)).ok
    return cl


def test_admission_stops_at_a_cohorts_borrowing_limit() -> None:
    cl = tree_cluster(
        (Cohort("org"), Cohort("team-a", "org", borrowing_limit_gpu=4), Cohort("team-b", "org")),
        Queue("a1", gpu=8, cohort="team-a"),
        Queue("b1", gpu=24, cohort="team-b"),
    )
    run(cl, "a1", 8)
    run(cl, "a1", 4)  # borrows 4 of team-b's: team-a's limit
    j = cl.submit(job(queue="a1", gpu=1))
    cl.run_pass()
    assert cl.state.jobs[j].state is JobState.PENDING
    assert cl.state.jobs[j].reason.code is ReasonCode.WAITING_QUOTA


def _reclaim_setup() -> tuple[Cluster, str, list[str]]:
    """org -> team-a (a1 nominal 16, a2 nominal 0), team-b (b1 nominal 16). a2 borrows 8
    of a1's nominal (a sibling); b1 borrows 8 more through org (a cousin), later, so
    its gang would lose less."""
    cl = tree_cluster(
        (Cohort("org"), Cohort("team-a", "org"), Cohort("team-b", "org")),
        Queue("a1", gpu=16, cohort="team-a"),
        Queue("a2", gpu=0, cohort="team-a"),
        Queue("b1", gpu=16, cohort="team-b"),
    )
    sibling = run(cl, "a2", 8)
    cl.now += 600_000
    cousins = [run(cl, "b1", 8) for _ in range(3)]
    cl.now += 1_000
    return cl, sibling, cousins


def test_reclaim_takes_from_a_siblings_borrowing_before_a_cousins() -> None:
    cl, sibling, cousins = _reclaim_setup()
    mine = cl.submit(job(queue="a1", gpu=8))
    plan = cl.run_pass()
    assert [p.kind for p in plan.preemptions] == [PreemptionKind.RECLAIM]
    assert [v.job_id for v in plan.preemptions[0].victims] == [sibling]
    assert cl.state.jobs[mine].reason.code is ReasonCode.WAITING_FOR_VICTIMS
    assert all(cl.state.jobs[j].attempt.preempted_by == "" for j in cousins)  # type: ignore[union-attr]


def test_a_cousins_borrowing_is_reclaimed_when_no_sibling_borrows() -> None:
    cl, sibling, cousins = _reclaim_setup()
    # a1 takes back the 8 a2 holds and then wants 8 more: only the cousin borrows now.
    first = cl.submit(job(queue="a1", gpu=8))
    cl.run_pass()
    attempt = cl.state.jobs[sibling].attempt
    assert attempt is not None
    for m in attempt.members:
        cl.exit_member(sibling, m.rank, 143)
    cl.run_pass()
    assert cl.state_of(first) is JobState.SCHEDULED
    second = cl.submit(job(queue="a1", gpu=8))
    plan = cl.run_pass()
    assert len(plan.preemptions) == 1
    (victim,) = plan.preemptions[0].victims
    assert victim.job_id in cousins
    assert cl.state.jobs[second].reason.code is ReasonCode.WAITING_FOR_VICTIMS


def test_a_cousin_whose_team_does_not_borrow_is_no_victim() -> None:
    cl = tree_cluster(
        (Cohort("org"), Cohort("team-a", "org"), Cohort("team-b", "org")),
        Queue("a1", gpu=16, cohort="team-a"),
        Queue("b1", gpu=8, cohort="team-b"),
        Queue("b2", gpu=8, cohort="team-b"),
        nodes=3,
    )
    # b1 borrows b2's 8 within team-b, which stays within its own nominal: a1 may not
    # take it (b2 may), and a1's own nominal is free anyway.
    run(cl, "b1", 8)
    run(cl, "b1", 8)
    run(cl, "a1", 8)
    j = cl.submit(job(queue="a1", gpu=8))
    plan = cl.run_pass()
    assert plan.preemptions == []
    assert cl.state.jobs[j].state is JobState.PENDING


def test_apply_refuses_a_reclaim_from_another_tree() -> None:
    cl = tree_cluster(
        (Cohort("org"), Cohort("team-a", "org"), Cohort("elsewhere")),
        Queue("a1", gpu=8, cohort="team-a"),
        Queue("x1", gpu=0, cohort="elsewhere"),
        Queue("x2", gpu=32, cohort="elsewhere"),
        nodes=4,
    )
    victims = [run(cl, "x1", 8) for _ in range(4)]
    mine = cl.submit(job(queue="a1", gpu=8))
    assert cl.run_pass().preemptions == []
    token = cl.state.jobs[victims[0]].attempt.fencing_token  # type: ignore[union-attr]
    preempt = c.Preempt(mine, 0, (c.Victim(victims[0], token),), PreemptionKind.RECLAIM, cl.now)
    result = cl.do(preempt)
    assert result.code is c.ResultCode.CONFLICT
    assert "not in another queue of the cohort tree of org" in result.message


# ------------------------------------------------------------------ fair share


def two_teams() -> Cluster:
    """One node; team a (a1, a2: 8 GPUs each) and team b (b1: 16) under org."""
    return tree_cluster(
        (Cohort("org"), Cohort("team-a", "org"), Cohort("team-b", "org")),
        Queue("a1", gpu=8, cohort="team-a"),
        Queue("a2", gpu=8, cohort="team-a"),
        Queue("b1", gpu=16, cohort="team-b"),
        nodes=1,
    )


def test_fair_share_compares_teams_before_their_queues() -> None:
    cl = two_teams()
    half_life = cl.state.config.fair_share_half_life_ms
    # Over one half-life: a1 held 16 GPUs (share 2), a2 none (0), b1 8 (0.5). Team a
    # used 16 of its 16 (1), team b 8 of its 16 (0.5).
    cl.state.queue_history = {
        "a1": QueueHistory(gpu_ms=16 * half_life, at_ms=cl.now),
        "b1": QueueHistory(gpu_ms=8 * half_life, at_ms=cl.now),
    }
    a2 = cl.submit(job(queue="a2", gpu=8))
    b1 = cl.submit(job(queue="b1", gpu=8))
    cl.run_pass()
    # One node: team b goes first, though a2's own share is the lowest of all.
    assert cl.state_of(b1) is JobState.SCHEDULED
    assert cl.state_of(a2) is JobState.PENDING


def test_without_cohort_records_fair_share_is_by_queue() -> None:
    cl = tree_cluster(
        (),
        Queue("a1", gpu=8, cohort="lab"),
        Queue("a2", gpu=8, cohort="lab"),
        Queue("b1", gpu=16, cohort="lab"),
        nodes=1,
    )
    half_life = cl.state.config.fair_share_half_life_ms
    cl.state.queue_history = {
        "a1": QueueHistory(gpu_ms=16 * half_life, at_ms=cl.now),
        "b1": QueueHistory(gpu_ms=8 * half_life, at_ms=cl.now),
    }
    a2 = cl.submit(job(queue="a2", gpu=8))
    b1 = cl.submit(job(queue="b1", gpu=8))
    cl.run_pass()
    assert cl.state_of(a2) is JobState.SCHEDULED
    assert cl.state_of(b1) is JobState.PENDING


def test_a_queue_of_the_common_cohort_itself_is_its_own_branch() -> None:
    """A queue sitting in org (an uncle of a1) that borrows is reclaimed from, too."""
    cl = tree_cluster(
        (Cohort("org"), Cohort("team-a", "org")),
        Queue("a1", gpu=16, cohort="team-a"),
        Queue("o1", gpu=0, cohort="org"),
        nodes=2,
    )
    uncle = [run(cl, "o1", 8) for _ in range(2)]
    mine = cl.submit(job(queue="a1", gpu=8))
    plan = cl.run_pass()
    assert len(plan.preemptions) == 1
    assert plan.preemptions[0].victims[0].job_id in uncle
    assert cl.state.jobs[mine].reason.code is ReasonCode.WAITING_FOR_VICTIMS


def test_the_invariants_check_that_the_cohorts_form_a_tree() -> None:
    state = _state()
    for record in (Cohort("org"), Cohort("team", "org")):
        assert apply(state, c.SetCohort(record, 1)).ok
    assert invariants.check(state) == []
    state.cohorts["org"] = Cohort("org", "team")  # only a bug could do this
    problems = invariants.check(state)
    assert any("has no root" in p for p in problems), problems
    state.cohorts["org"] = Cohort("org", "gone")
    assert any("its parent gone does not exist" in p for p in invariants.check(state))


@st.composite
def _trees(draw: st.DrawFn) -> tuple[ClusterState, dict[str, int]]:
    """A random tree of up to 6 cohorts (each one's parent drawn among the earlier ones)
    with up to 6 queues in them, and what each queue uses."""
    state = _state()
    names = [f"c{i}" for i in range(draw(st.integers(1, 6)))]
    for i, name in enumerate(names):
        parent = draw(st.sampled_from(["", *names[:i]]))
        record = Cohort(name, parent, draw(_limit), draw(_limit), draw(_limit))
        assert apply(state, c.SetCohort(record, 1)).ok
    used: dict[str, int] = {}
    for i in range(draw(st.integers(1, 6))):
        gpu = draw(st.integers(0, 12))
        lending = draw(_limit)
        queue = Queue(
            f"q{i}",
            gpu=gpu,
            cohort=draw(st.sampled_from([*names, "flat"])),
            borrowing_limit_gpu=draw(_limit),
            lending_limit_gpu=None if lending is None else min(lending, gpu),
        )
        assert apply(state, c.SetQueue(queue, 1)).ok
        used[queue.name] = draw(st.integers(0, 20))
    return state, used


@settings(max_examples=300, deadline=None)
@given(_trees())
def test_what_a_queue_may_borrow_keeps_every_subtree_within_its_limits(
    case: tuple[ClusterState, dict[str, int]],
) -> None:
    state, used = case
    u = QueueUsage(state.queues, {n: Resources(gpu=g) for n, g in used.items()}, state.cohorts)
    for name in sorted(used):
        queue = state.queues[name]
        room = u.borrowable(name)
        if room == 0:
            continue
        # Taking its idle nominal and all it may borrow: no subtree above it goes beyond
        # its nominal plus its borrowing limit, and its root stays within what it has.
        after = dict(used)
        after[name] = max(used[name], queue.gpu or 0) + room
        assert tree_breaches(state, queue, after) == [], (name, room)


def test_a_queue_of_a_parent_cohort_reclaims_only_what_a_child_team_borrows() -> None:
    """o1 sits in org; team-a below it has a1 (nominal 8) and a2 (0). a2 borrows a1's
    idle 8 within team-a: team-a borrows nothing from org, so o1 may not take it."""
    cohorts = (Cohort("org"), Cohort("team-a", "org"))
    queues = (
        Queue("o1", gpu=8, cohort="org"),
        Queue("a1", gpu=8, cohort="team-a"),
        Queue("a2", gpu=0, cohort="team-a"),
    )
    cl = tree_cluster(cohorts, *queues, nodes=1)
    run(cl, "a2", 8)
    mine = cl.submit(job(queue="o1", gpu=8))
    assert cl.run_pass().preemptions == []
    assert cl.state.jobs[mine].state is JobState.PENDING
    # Once team-a borrows from org (a2 takes o1's idle GPUs too), o1 reclaims that.
    cl = tree_cluster(cohorts, *queues, nodes=2)
    nephews = [run(cl, "a2", 8) for _ in range(2)]
    mine = cl.submit(job(queue="o1", gpu=8))
    (preemption,) = cl.run_pass().preemptions
    assert preemption.victims[0].job_id in nephews


def test_a_teams_share_in_the_order_follows_a_gang_placed_during_the_pass() -> None:
    """The pass orders pending gangs lazily: a gang placed in team a (in a queue with
    nothing pending) raises team a's share, and the next gang comes from team b even
    though team a's next one was submitted first."""
    cl = two_teams()
    first = cl.submit(job(queue="a1", gpu=1))
    second = cl.submit(job(queue="a1", gpu=1))
    other = cl.submit(job(queue="b1", gpu=1))
    u = QueueUsage.of(cl.state)
    order = ordered_pending(cl.state, cl.now, u, set())
    assert next(order).job_id == first  # every share 0: by submission
    u.add("a2", Resources(gpu=8))  # team a now holds half its nominal; a1 still none
    assert next(order).job_id == other
    assert next(order).job_id == second
