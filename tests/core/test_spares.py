"""Hot spares (core/spares.py): which idle nodes each domain keeps out of normal
placement, the pass that leaves them out (full, cached and incremental), apply refusing
a gang on one, the setting's rules and its format."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core import spares as spares_module
from synapse_ha.core.cluster_config import MAX_SPARES, ClusterConfig
from synapse_ha.core.codec import formats
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, MemberPlacement, NodeStatus, Resources
from synapse_ha.core.reasons import render
from synapse_ha.core.scheduler import CapacityCache, IncrementalPlanner, Plan, schedule
from synapse_ha.core.scheduler import capacity as capacity_module
from synapse_ha.core.snapshot import full_copy
from synapse_ha.core.spares import NONE, spare_key, spare_level, spare_nodes, spares_by_domain
from tests.core.harness import Cluster, job, node
from tests.core.test_replacement import replace_now, running_gang

RACKS = ("r1", "r2")


def _cluster(per_rack: int = 3, spares: int = 1, level: str = "", gpus: int = 8) -> Cluster:
    cluster = Cluster()
    for rack in RACKS:
        cluster.add(*(node(f"{rack}-n{i}", rack=rack, gpus=gpus) for i in range(per_rack)))
    if spares or level:
        assert cluster.do(c.Configure(ClusterConfig(spares=spares, spare_level=level))).ok
    return cluster


# ------------------------------------------------------------------- which nodes


def test_each_rack_keeps_its_first_idle_nodes_largest_first_then_by_id() -> None:
    cluster = Cluster()
    cluster.add(
        node("a", rack="r1", gpus=4),
        node("b", rack="r1", gpus=8),
        node("c", rack="r1", gpus=8),
        node("d", rack="r2", gpus=8),
    )
    assert spare_nodes(cluster.state) == NONE  # none configured
    assert cluster.do(c.Configure(ClusterConfig(spares=1))).ok
    assert spares_by_domain(cluster.state) == {("z1", "b1", "r1"): ["b"], ("z1", "b1", "r2"): ["d"]}
    assert cluster.do(c.Configure(ClusterConfig(spares=2))).ok
    assert spare_nodes(cluster.state) == {"b", "c", "d"}  # r2 has one node: it keeps that one


def test_the_level_defaults_to_rack_else_the_cluster_and_may_be_named() -> None:
    assert spare_level(ClusterConfig()) == "rack"
    assert spare_level(ClusterConfig(topology_levels=("zone",))) == "cluster"
    assert spare_level(ClusterConfig(spare_level="zone")) == "zone"
    cluster = _cluster(spares=1, level="zone")  # both racks are in zone z1
    assert spare_nodes(cluster.state) == {"r1-n0"}
    assert cluster.do(c.Configure(ClusterConfig(spares=1, spare_level="cluster"))).ok
    assert spares_by_domain(cluster.state) == {(): ["r1-n0"]}


def test_a_node_that_is_not_idle_is_no_spare_and_the_next_idle_one_takes_its_place() -> None:
    cluster = _cluster(per_rack=4)
    assert spare_nodes(cluster.state) == {"r1-n0", "r2-n0"}
    assert cluster.do(c.SetNodeStatus("r1-n0", NodeStatus.CORDONED, "", cluster.now)).ok
    fault = c.ReportGpuHealth("r1-n1", (GpuFault(3, "xid-79"),), 1, cluster.now)
    assert cluster.do(fault).ok
    cluster.state.nodes["r2-n0"].allocated = Resources(1000, 1024, 8)  # as a replacement would
    assert spare_nodes(cluster.state) == {"r1-n2", "r2-n1"}


def _two_ranks_one_stopping() -> tuple[Cluster, str]:
    """Rack r1's nodes a, b, c; a gang bound on a and b (no spares then), then one spare
    per rack; rank 1 (on b) fails, so the attempt ends while rank 0 (on a) is stopping."""
    cluster = Cluster()
    cluster.add(node("a", rack="r1"), node("b", rack="r1"), node("c", rack="r1"))
    job_id = cluster.submit(job(replicas=2, gpu=8, retries=1))
    cluster.run_pass()
    assert cluster.nodes_of(job_id) == ["a", "b"]
    cluster.start_all(job_id)
    assert cluster.do(c.Configure(ClusterConfig(spares=1))).ok
    assert spare_nodes(cluster.state) == {"c"}
    cluster.exit_member(job_id, 1, 1)
    assert cluster.state.nodes["a"].allocated == Resources()  # freed as the attempt ended
    return cluster, job_id


def test_a_node_with_a_member_still_stopping_is_no_spare() -> None:
    cluster, job_id = _two_ranks_one_stopping()
    assert spare_nodes(cluster.state) == {"b"}  # a's member has not stopped yet
    cluster.exit_member(job_id, 0, 143)
    assert spare_nodes(cluster.state) == {"a"}


def test_a_spare_that_takes_a_replacement_hands_the_role_to_the_next_idle_node() -> None:
    cluster = Cluster()
    cluster.add(*(node(f"n{i}", rack="r1") for i in range(6)))
    assert cluster.do(c.Configure(ClusterConfig(spares=1))).ok
    job_id = running_gang(cluster)
    assert cluster.nodes_of(job_id) == ["n1", "n2", "n3", "n4"]  # n0 is the spare
    assert spare_nodes(cluster.state) == {"n0"}
    cluster.do(c.MarkNodeDead("n2", "silent", 1, cluster.now))
    replace_now(cluster)
    assert cluster.nodes_of(job_id) == ["n1", "n0", "n3", "n4"]
    assert spare_nodes(cluster.state) == {"n5"}
    waiting = cluster.submit(job("one", gpu=8))
    assert cluster.run_pass().reasons[waiting].get("spares") == 1


@given(order=st.permutations(range(6)), count=st.integers(0, 3))
@settings(max_examples=30, deadline=None)
def test_the_spares_do_not_depend_on_the_order_nodes_registered_in(
    order: list[int], count: int
) -> None:
    infos = [node(f"n{i}", rack=RACKS[i % 2], gpus=(4, 8)[i % 3 == 0]) for i in range(6)]
    chosen = []
    for ordering in (range(6), order):
        state = ClusterState(config=ClusterConfig(spares=count))
        for i in ordering:
            assert apply(state, c.RegisterNode(infos[i], 1)).ok
        chosen.append(spares_by_domain(state))
    assert chosen[0] == chosen[1]


def test_with_no_spares_configured_no_node_is_read() -> None:
    class Unreadable(dict[str, object]):
        def values(self):  # type: ignore[override]
            raise AssertionError("spare_nodes read the nodes")

        def __iter__(self):  # type: ignore[override]
            raise AssertionError("spare_nodes read the nodes")

    state = ClusterState()
    state.nodes = Unreadable()  # type: ignore[assignment]
    assert spare_nodes(state) is NONE
    assert spares_by_domain(state) == {}


# ------------------------------------------------------------------ the pass


def test_the_pass_places_a_gang_beside_the_spares_and_says_why_one_waits() -> None:
    cluster = _cluster(per_rack=3)
    big = cluster.submit(job("big", replicas=5, gpu=8))
    small = cluster.submit(job("small", replicas=4, gpu=8))
    plan = cluster.run_pass()
    assert sorted(cluster.nodes_of(small)) == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    why = plan.reasons[big]
    assert why.get("spares") == 2
    assert "2 idle node(s) are kept as spares" in render(why)


def test_with_no_spares_a_reason_says_nothing_of_them() -> None:
    cluster = _cluster(per_rack=1, spares=0)
    big = cluster.submit(job("big", replicas=2, gpu=8))
    cluster.submit(job("blocker", replicas=1, gpu=8, priority=5))
    plan = cluster.run_pass()
    assert not plan.reasons[big].has("spares")


def _random_cluster(data: st.DataObject) -> Cluster:
    """Racks of nodes of a few sizes, gangs bound on them and gangs pending, then a
    random number of spares per rack (0 included)."""
    cluster = Cluster()
    for i in range(data.draw(st.integers(2, 7), label="nodes")):
        gpus = data.draw(st.sampled_from([4, 8]), label="gpus")
        cluster.add(node(f"n{i}", rack=data.draw(st.sampled_from(RACKS)), gpus=gpus))
    shapes = st.tuples(
        st.integers(1, 3),
        st.sampled_from([0, 2, 4, 8]),
        st.sampled_from(["", "rack", "host"]),
        st.sampled_from(["", "low", "high"]),
        st.sampled_from([0, 60]),
    )
    for stage in range(2):
        for replicas, gpu, required, cls, limit in data.draw(
            st.lists(shapes, max_size=4), label=f"gangs {stage}"
        ):
            spec = job(replicas=replicas, gpu=gpu, required=required, priority_class=cls,
                       time_limit_s=limit, wait_for_nodes=True)  # fmt: skip
            cluster.submit(spec)
        if stage == 0:
            cluster.run_pass()
    count = data.draw(st.integers(0, 2), label="spares")
    level = data.draw(st.sampled_from(["", "rack", "cluster"]), label="level")
    assert cluster.do(c.Configure(ClusterConfig(spares=count, spare_level=level))).ok
    return cluster


def _decisions(plan: Plan) -> tuple[object, ...]:
    return (plan.placements, plan.preemptions, plan.reservation)


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_spares_are_to_the_pass_as_nodes_it_does_not_have(data: st.DataObject) -> None:
    """The pass never places (reserves, preempts for) a normal gang on a spare: its
    decisions equal those of the same state without the spare nodes and without spares."""
    state = _random_cluster(data).state
    spares = spare_nodes(state)
    plan = schedule(state, 5_000)
    used = {m.node_id for p in plan.placements for m in p.members}
    assert not used & spares
    if plan.reservation is not None:
        assert not set(plan.reservation.nodes) & spares
    without = full_copy(state)
    for node_id in spares:
        del without.nodes[node_id]
    without.config = dataclasses.replace(without.config, spares=0)
    assert _decisions(schedule(without, 5_000)) == _decisions(plan)
    cached = CapacityCache()
    schedule(state, 5_000, cache=cached)
    assert schedule(state, 5_000, cache=cached) == plan


@given(data=st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_with_no_spares_the_pass_is_the_pass_without_them(data: st.DataObject) -> None:
    """With ``spares = 0`` the pass makes the plan it makes with the feature taken out
    (the capacity table never asks which nodes are spares), and never reads the nodes
    for it."""
    state = _random_cluster(data).state
    state.config = dataclasses.replace(state.config, spares=0)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(capacity_module, "spare_nodes", lambda s: NONE)
        absent = schedule(state, 5_000)

    def unread(s: ClusterState) -> dict[tuple[str, ...], list[str]]:
        raise AssertionError("the pass read which nodes are spares with none configured")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(spares_module, "spares_by_domain", unread)
        assert schedule(state, 5_000) == absent


def test_a_cached_table_follows_spares_that_change_while_no_node_record_does() -> None:
    """Rank 0's exit confirmed makes node a idle, and rack r1's spare, without a change
    to a's record: the cached table and the incremental planner must leave a out and
    give b back."""
    cluster, job_id = _two_ranks_one_stopping()
    cache, planner = CapacityCache(), IncrementalPlanner(CapacityCache())
    schedule(cluster.state, cluster.now, cache=cache)
    planner.plan(full_copy(cluster.state), cluster.now)
    record = cluster.state.nodes["a"]
    cluster.exit_member(job_id, 0, 143)
    assert cluster.state.nodes["a"] is record and spare_nodes(cluster.state) == {"a"}
    cluster.submit(job("next", gpu=8))
    fresh = schedule(cluster.state, cluster.now)
    assert [m.node_id for p in fresh.placements for m in p.members] == ["b"]
    assert schedule(cluster.state, cluster.now, cache=cache) == fresh
    assert planner.plan(full_copy(cluster.state), cluster.now) == fresh


# ------------------------------------------------------------------ apply


def test_apply_refuses_a_gang_on_a_spare_and_binds_the_others() -> None:
    cluster = _cluster(per_rack=2)
    on_spare = cluster.submit(job("on-spare", gpu=8))
    beside = cluster.submit(job("beside", gpu=8))
    gpus = tuple(range(8))
    result = cluster.do(
        c.BindPlan(
            placements=(
                c.GangPlacement(on_spare, 0, (MemberPlacement(0, "r1-n0", gpus),)),
                c.GangPlacement(beside, 0, (MemberPlacement(0, "r1-n1", gpus),)),
            ),
            now_ms=cluster.now,
        )
    )
    assert result.bound == (beside,)
    (refused,) = result.rejected
    assert refused.code is c.RejectCode.SPARE_NODE and "r1-n0" in refused.message
    assert cluster.state.jobs[on_spare].attempt is None
    assert cluster.state.nodes["r1-n0"].allocated == Resources()


# ------------------------------------------------------------- the setting


def test_the_setting_needs_format_14_and_the_leader_holds_it_back_until_then() -> None:
    wanted = ClusterConfig(spares=1, spare_level="rack")
    assert formats.format_needed(c.Configure(wanted)) == 14
    assert formats.format_needed(c.Configure(ClusterConfig())) == formats.BASE_FORMAT
    state = ClusterState()
    assert apply(state, c.RaiseFormat(13, (), 1)).ok
    refused = apply(state, c.Configure(wanted, now_ms=2))
    assert refused.code is c.ResultCode.CONFLICT and "needs format 14" in refused.message
    assert state.config.spares == 0
    assert formats.held_back_config(wanted, ClusterConfig(), floor=13) == ClusterConfig()
    assert formats.held_back_config(wanted, ClusterConfig(), floor=14) == wanted
    assert apply(state, c.RaiseFormat(14, (), 3)).ok
    assert apply(state, c.Configure(wanted, now_ms=4)).ok and state.config.spares == 1


@pytest.mark.parametrize(
    ("config", "field", "rule"),
    [
        (ClusterConfig(spares=-1), "spares", f"between 0 and {MAX_SPARES}"),
        (ClusterConfig(spares=MAX_SPARES + 1), "spares", "nodes per domain"),
        (ClusterConfig(spares=1, spare_level="row"), "spare_level", "one of the topology levels"),
        (ClusterConfig(spare_level="host"), "spare_level", "'cluster'"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_field_and_changes_nothing(
    config: ClusterConfig, field: str, rule: str
) -> None:
    cluster = _cluster(spares=0)
    result = cluster.do(c.Configure(config))
    assert result.code is c.ResultCode.INVALID
    assert field in result.message and rule in result.message
    assert cluster.state.config == ClusterConfig()


def test_spare_key_is_total_and_puts_larger_nodes_first() -> None:
    cluster = Cluster()
    cluster.add(node("x", gpus=8), node("y", gpus=8), node("w", gpus=4, cpu=128))
    ordered = sorted(cluster.state.nodes.values(), key=spare_key)
    assert [n.node_id for n in ordered] == ["x", "y", "w"]
