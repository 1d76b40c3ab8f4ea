"""Defragmentation (core/scheduler/defrag.py): hosts drained for a gang whose free GPUs are
scattered, the cheapest first, bounded, with backfill only for gangs that end before the
drain completes; the reasons of the gang and of the node; the setting's rule and format;
the incremental planner's plans equal a full pass's with drains."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, Queue
from synapse_ha.core.codec.formats import format_needed, held_back_config
from synapse_ha.core.model import FEATURE_IMAGES, ClusterState, JobSpec, MemberPlacement
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler.defrag import DEFRAG_FORMAT, draining_for
from synapse_ha.core.scheduler.reservation import RESERVATIONS_FORMAT
from synapse_ha.core.spec.validation import check_cluster_config
from tests.core.harness import Cluster, job, node
from tests.core.test_incremental import NODES, PlainQueueMachine

MIN = 60_000
# The minutes each host's 4-GPU gang runs (n6 runs one 8-GPU gang for 300).
ENDS = {"n1": 60, "n2": 120, "n3": 30, "n4": 90, "n5": 150}


def _scattered(share: int = 50, priorities: dict[str, int] | None = None) -> Cluster:
    """Six 8-GPU hosts of one rack, each half full but n6 (full): 20 free GPUs, no
    free host. The head-of-line gang (one 8-GPU member with an image, which only n3 runs)
    reserves n3."""
    config = ClusterConfig(locality_wait_ms=0, defrag_share_pct=share)
    cluster = Cluster(ClusterState(config=config))
    cluster.add(*(node(f"n{i}", features=(FEATURE_IMAGES,) * (i == 3)) for i in range(1, 7)))
    for host, minutes in ENDS.items():
        prio = (priorities or {}).get(host, 0)
        _bind(cluster, job(f"on-{host}", gpu=4, time_limit_s=minutes * 60, priority=prio), host)
    _bind(cluster, job("full", gpu=8, time_limit_s=300 * 60), "n6")
    cluster.submit(job("head", gpu=8, time_limit_s=60 * 60, image="registry.example/train:1"))
    return cluster


def _bind(cluster: Cluster, spec: JobSpec, host: str) -> str:
    """``spec``'s one member bound on ``host`` (its first GPUs)."""
    job_id = cluster.submit(spec)
    member = MemberPlacement(0, host, tuple(range(spec.resources.gpu)))
    bind = c.BindPlan(placements=(c.GangPlacement(job_id, 0, (member,)),), now_ms=cluster.now)
    assert not cluster.do(bind).rejected
    assert cluster.nodes_of(job_id) == [host]
    return job_id


def test_a_scattered_gang_drains_the_cheapest_hosts_and_says_so() -> None:
    cluster = _scattered()
    big = cluster.submit(job("big", replicas=2, gpu=8))
    plan = cluster.run_pass()
    assert plan.reservation is not None and plan.reservation.nodes == {"n3"}
    (drain,) = plan.drains
    # Of n1, n2, n4, n5 (n3 is reserved), the two whose gangs end soonest.
    assert (drain.job_id, drain.nodes) == (big, frozenset({"n1", "n4"}))
    assert drain.done_ms == cluster.now + 90 * MIN
    why = cluster.state.jobs[big].reason
    assert why is not None and why.code is ReasonCode.DEFRAGMENTING
    assert why.text("hosts") == "n1, n4" and why.num("until_ms") == drain.done_ms
    assert "waiting for 2 host(s) to drain (n1, n4)" in render(why)
    node_why = draining_for(plan, "n4")
    assert node_why is not None and node_why.text("job") == big
    assert big in render(node_why)
    assert draining_for(plan, "n2") is None


def test_only_a_gang_within_its_queues_nominal_quota_gets_a_drain() -> None:
    cluster = _scattered()
    for name, gpu in (("lender", 40), ("small", 8)):
        assert cluster.do(c.SetQueue(Queue(name, gpu=gpu, cohort="all"), cluster.now)).ok
    borrower = cluster.submit(job("big", replicas=2, gpu=8, queue="small"))
    assert cluster.run_pass().drains == []  # 16 GPUs of a queue of 8: it would borrow
    assert cluster.state.jobs[borrower].reason.code is not ReasonCode.DEFRAGMENTING  # type: ignore[union-attr]
    starved = cluster.submit(job("big", replicas=2, gpu=8, queue="lender"))
    (drain,) = cluster.run_pass().drains
    assert drain.job_id == starved


def test_a_reservation_without_a_start_is_placed_on_the_cheapest_hosts() -> None:
    """The head's reservation, when a gang it needs gone has no estimate, is the drain
    of the hosts that cost least (here: whose gangs, none with an estimate, ran least)
    rather than the best fit on an empty cluster (n1 and n2)."""
    config = ClusterConfig(locality_wait_ms=0, defrag_share_pct=50)
    cluster = Cluster(ClusterState(config=config))
    cluster.add(*(node(f"n{i}") for i in range(1, 7)))
    for i in (1, 2, 3, 4, 5, 6):
        _bind(cluster, job(f"on-n{i}", gpu=4), f"n{i}")
        cluster.now += MIN * (7 - i)  # n1's gang ran longest
    head = cluster.submit(job("head", replicas=2, gpu=8))
    plan = cluster.run_pass()
    assert plan.reservation is not None and plan.reservation.nodes == {"n5", "n6"}
    assert plan.reservation.start_ms is None
    assert [(d.job_id, d.nodes) for d in plan.drains] == [(head, frozenset({"n5", "n6"}))]
    later = cluster.submit(job("later", gpu=4))  # not on the held hosts, though they have room
    placed = {p.job_id: {m.node_id for m in p.members} for p in cluster.run_pass().placements}
    assert later in placed and placed[later].isdisjoint({"n5", "n6"})


def test_without_defragmentation_the_gang_only_waits() -> None:
    cluster = _scattered(share=0)
    big = cluster.submit(job("big", replicas=2, gpu=8))
    plan = cluster.run_pass()
    assert plan.drains == []
    why = cluster.state.jobs[big].reason
    assert why is not None and why.code is not ReasonCode.DEFRAGMENTING


def test_a_gang_short_of_gpus_is_not_scattered() -> None:
    cluster = _scattered()
    big = cluster.submit(job("big", replicas=3, gpu=8))  # 24 GPUs; 16 free beside n3
    plan = cluster.run_pass()
    assert plan.drains == []
    assert cluster.state.jobs[big].reason.code is not ReasonCode.DEFRAGMENTING  # type: ignore[union-attr]


def test_at_most_the_configured_share_of_nodes_is_held() -> None:
    cluster = _scattered(share=20)  # one node of six: the gang needs two
    cluster.submit(job("big", replicas=2, gpu=8))
    assert cluster.run_pass().drains == []


def test_a_host_running_a_higher_priority_gang_is_never_drained() -> None:
    cluster = _scattered(priorities={"n1": 10})
    big = cluster.submit(job("big", replicas=2, gpu=8))
    (drain,) = cluster.run_pass().drains
    assert (drain.job_id, drain.nodes) == (big, frozenset({"n2", "n4"}))


def test_only_gangs_that_end_before_the_drain_completes_start_on_drained_hosts() -> None:
    cluster = _scattered()
    cluster.submit(job("big", replicas=2, gpu=8))
    cluster.run_pass()
    # n2 and n5 take two gangs without a time limit; the third may not use n1 or n4.
    first = [cluster.submit(job(f"open-{i}", gpu=4)) for i in range(3)]
    long = cluster.submit(job("long", gpu=4, time_limit_s=91 * 60))
    short = cluster.submit(job("short", gpu=4, time_limit_s=89 * 60))
    plan = cluster.run_pass()
    placed = {p.job_id: {m.node_id for m in p.members} for p in plan.placements}
    assert placed[first[0]] | placed[first[1]] == {"n2", "n5"}
    assert first[2] not in placed and long not in placed
    assert placed[short] <= {"n1", "n4"}


def test_the_gang_binds_on_its_drained_hosts_and_the_drain_ends() -> None:
    cluster = _scattered()
    big = cluster.submit(job("big", replicas=2, gpu=8))
    cluster.run_pass()
    _exit(cluster, "n1")
    assert cluster.run_pass().drains  # half of what it needs
    _exit(cluster, "n4")
    plan = cluster.run_pass()
    assert sorted(cluster.nodes_of(big)) == ["n1", "n4"]
    assert plan.drains == []


def _named(cluster: Cluster, name: str) -> str:
    return next(j.job_id for j in cluster.state.jobs.values() if j.spec.name == name)


def _exit(cluster: Cluster, host: str) -> None:
    """The 4-GPU gang on ``host`` ends."""
    cluster.exit_member(_named(cluster, f"on-{host}"), 0, 0)


def test_a_cancelled_gang_holds_nothing() -> None:
    cluster = _scattered()
    big = cluster.submit(job("big", replicas=2, gpu=8))
    assert cluster.run_pass().drains
    cluster.do(c.CancelJob(big, now_ms=cluster.now))
    assert cluster.run_pass().drains == []


def test_below_its_format_no_drain_is_made() -> None:
    cluster = _scattered()
    cluster.state.format_floor = DEFRAG_FORMAT - 1  # a replica of the previous release
    cluster.submit(job("big", replicas=2, gpu=8))
    assert cluster.run_pass().drains == []


def test_the_share_is_validated_and_gated_at_its_format() -> None:
    assert ClusterConfig().defrag_share_pct == 0  # off unless configured
    for bad in (-1, 101):
        problems = check_cluster_config(ClusterConfig(defrag_share_pct=bad))
        assert [p.field for p in problems] == ["defrag_share_pct"], problems
    assert not check_cluster_config(ClusterConfig(defrag_share_pct=0))
    assert DEFRAG_FORMAT == 17
    assert format_needed(c.Configure(ClusterConfig(defrag_share_pct=20))) == 17
    assert format_needed(ReasonCode.DEFRAGMENTING) == 17
    wanted = ClusterConfig(defrag_share_pct=20)
    assert held_back_config(wanted, ClusterConfig(), 16).defrag_share_pct == 0
    assert held_back_config(wanted, ClusterConfig(), 17).defrag_share_pct == 20


HOSTS = [*NODES, "n4", "n5"]


class DefragQueueMachine(PlainQueueMachine):
    """The incremental planner against full passes on a cluster that drains: half its
    six nodes may be held (the rules that pick a node pick one of the first four)."""

    @initialize(
        racks=st.sampled_from([["r1"] * 6, ["r1", "r1", "r1", "r2", "r2", "r2"]]),
        wait=st.sampled_from([0, 20_000]),
        spares=st.just(0),
        reservations=st.sampled_from([1, 3]),
        halves=st.lists(
            st.tuples(st.sampled_from(HOSTS), st.sampled_from([0, 10, 20])), max_size=8
        ),
    )
    def cluster(
        self,
        racks: list[str],
        wait: int,
        spares: int = 0,
        reservations: int = 1,
        halves: list[tuple[str, int]] = (),
    ) -> None:
        self.do(c.RaiseFormat(RESERVATIONS_FORMAT, (), self.now))
        config = ClusterConfig(
            locality_wait_ms=wait, defrag_share_pct=50, reservations_per_pass=reservations
        )
        self.do(c.Configure(config, self.now))
        for i, rack in enumerate(racks):
            self.do(c.RegisterNode(node(HOSTS[i], gpus=8, cpu=16, rack=rack), self.now))
        for host, minutes in halves:  # scattered free GPUs from the start
            self.half_host(host, minutes, 0)

    @rule(
        host=st.sampled_from(HOSTS),
        minutes=st.sampled_from([0, 10, 20]),
        priority=st.sampled_from([0, 0, 1]),
    )
    def half_host(self, host: str, minutes: int, priority: int) -> None:
        """A 4-GPU gang bound on ``host``'s first free GPUs, where best fit would not
        put it: what leaves free GPUs scattered."""
        live = self.state.nodes.get(host)
        if live is None or not live.schedulable() or live.free.gpu < 4:
            return
        spec = job(gpu=4, cpu=1, priority=priority, time_limit_s=minutes * 60)
        job_id = self.do(c.SubmitJob(spec, f"req-{len(self.state.jobs)}", self.now)).job_id
        gpus = tuple(sorted(set(range(8)) - live.allocated_gpus))[:4]
        bind = c.BindPlan((c.GangPlacement(job_id, 0, (MemberPlacement(0, host, gpus),)),))
        self.do(dataclasses.replace(bind, now_ms=self.now))

    @invariant()
    def plans_agree(self) -> None:
        self.compare()
        if self.last is not None and self.last.drains:
            event("a plan with drains")


DefragQueueMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDefragQueueMachine = DefragQueueMachine.TestCase


def test_the_machine_makes_drains() -> None:
    """The property test's cluster does drain (else it would prove nothing of them)."""
    machine = DefragQueueMachine()
    machine.cluster(["r1"] * 6, 0)
    for host in HOSTS:
        machine.half_host(host, 10, 0)
    machine.submit(1, 8, 0, ("", ""), 0, 0, 2)  # the first reserves a host; the next drains
    machine.scheduling_pass()
    assert machine.last is not None and machine.last.drains
    assert dataclasses.replace(machine.last, drains=[]) != machine.last
