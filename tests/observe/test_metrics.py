"""Replica and worker metrics over a harness state and fakes: no network, no clock."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import PreemptionKind
from synapse_ha.core.model import ClusterState
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.observe.metrics import (
    GpuCollector,
    MeteredControlPlane,
    MeteredExecutor,
    ReplicaMetrics,
    WorkerMetrics,
)
from synapse_ha.observe.state_metrics import StateFigures
from tests.core.harness import Cluster, job, node


@dataclass
class FakeStatus:
    role: str = "leader"
    term: int = 3
    commit_index: int = 40
    last_applied: int = 37
    leader: str = "127.0.0.1:7001"
    has_quorum: bool = True
    tick_stalls: int = 2
    longest_tick_interval_s: float = 0.65


@dataclass
class FakeReplica:
    state: ClusterState
    raft: FakeStatus = field(default_factory=FakeStatus)
    snapshots: int = 0

    def status(self) -> FakeStatus:
        return self.raft

    def snapshot(self) -> ClusterState:
        self.snapshots += 1
        return self.state


def samples(registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's text exposition, parsed back with the library's
    own parser (as Prometheus would read it)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def busy_cluster() -> Cluster:
    """Two racks; a running 2-member gang of 4 GPUs each (best fit: both on b1, the one
    host of rack r2), and a gang too big to fit."""
    cluster = Cluster()
    cluster.add(node("a1", rack="r1"), node("a2", rack="r1"), node("b1", rack="r2"))
    running = cluster.submit(job("fits", replicas=2, gpu=4, required="rack"))
    cluster.submit(job("huge", replicas=4, gpu=8, wait_for_nodes=True))
    cluster.run_pass()
    cluster.start_all(running)
    return cluster


def test_state_figures_count_jobs_nodes_gpus_and_reasons() -> None:
    cluster = busy_cluster()
    figures = StateFigures.of(cluster.state)
    assert figures.jobs == {("RUNNING", "default"): 1, ("PENDING", "default"): 1}
    assert figures.nodes == {"ready": 3}
    assert figures.gpus == {
        ("r1", "used"): 0,
        ("r1", "free"): 16,
        ("r2", "used"): 8,
        ("r2", "free"): 0,
    }
    (pending,) = [j for j in cluster.state.jobs.values() if j.spec.name == "huge"]
    assert figures.pending == {str(pending.reason.code): 1}
    assert pending.reason.code is not ReasonCode.PENDING_FIRST_PASS


def test_remembered_racks_give_the_same_figures_and_follow_a_relabelled_node() -> None:
    cluster = busy_cluster()
    racks: dict[str, tuple[object, object, str]] = {}
    assert StateFigures.of(cluster.state, racks) == StateFigures.of(cluster.state)
    assert StateFigures.of(cluster.state, racks) == StateFigures.of(cluster.state)
    assert cluster.do(c.RegisterNode(node("a2", rack="r3"))).ok
    moved = StateFigures.of(cluster.state, racks)
    assert moved == StateFigures.of(cluster.state)
    assert moved.gpus[("r3", "free")] == 8 and moved.gpus[("r1", "free")] == 8


def test_replica_registry_exposes_raft_and_state_gauges() -> None:
    cluster = busy_cluster()
    metrics = ReplicaMetrics("r1", FakeReplica(cluster.state))
    got = samples(metrics.registry)
    assert got[("synapse_raft_role", (("replica", "r1"), ("role", "leader")))] == 1
    assert got[("synapse_raft_role", (("replica", "r1"), ("role", "follower")))] == 0
    assert got[("synapse_raft_term", (("replica", "r1"),))] == 3
    assert got[("synapse_raft_apply_lag_entries", (("replica", "r1"),))] == 3
    assert got[("synapse_raft_tick_stalls_total", (("replica", "r1"),))] == 2
    assert got[("synapse_raft_longest_tick_interval_seconds", (("replica", "r1"),))] == 0.65
    assert got[("synapse_jobs", (("queue", "default"), ("state", "RUNNING")))] == 1
    assert got[("synapse_nodes", (("status", "ready"),))] == 3
    assert got[("synapse_nodes", (("status", "dead"),))] == 0
    assert got[("synapse_gpus", (("rack", "r2"), ("state", "used")))] == 8
    assert got[("synapse_gpus", (("rack", "r1"), ("state", "free")))] == 16
    assert got[("synapse_scheduler_preemptions_total", ())] == 0
    assert got[("synapse_scheduler_reservations", ())] == 0


def test_the_reservations_gauge_counts_every_reservation_of_the_newest_plan() -> None:
    cluster = busy_cluster()
    plans = [None, SimpleNamespace(reservations=["huge"]), SimpleNamespace(reservations=[1, 2, 3])]
    for plan, want in zip(plans, (0, 1, 3), strict=True):
        metrics = ReplicaMetrics("r1", FakeReplica(cluster.state), last_plan=lambda p=plan: p)
        assert samples(metrics.registry)[("synapse_scheduler_reservations", ())] == want


def test_figures_are_recomputed_only_after_an_apply() -> None:
    cluster = busy_cluster()
    metrics = ReplicaMetrics("r1", FakeReplica(cluster.state))
    first = metrics.collector.figures()
    assert metrics.collector.figures() is first
    cluster.submit(job("later"))
    second = metrics.collector.figures()
    assert second is not first
    assert second.jobs[("PENDING", "default")] == 2


def test_leader_changes_are_counted_from_the_second_observation() -> None:
    metrics = ReplicaMetrics("r1", FakeReplica(ClusterState()))
    for leader in ["a", "a", "", "b", "b"]:
        metrics.note_leader(leader)
    assert samples(metrics.registry)[("synapse_raft_leader_changes_total", ())] == 2


def test_a_step_counts_as_a_pass_only_when_it_made_a_new_plan() -> None:
    metrics = ReplicaMetrics("r1", FakeReplica(ClusterState()))
    plan_a, plan_b = object(), object()
    metrics.observe_step(None, 0.5)
    metrics.observe_step(plan_a, 0.02)
    metrics.observe_step(plan_a, 0.7)
    metrics.observe_step(plan_b, 0.03)
    got = samples(metrics.registry)
    assert got[("synapse_scheduler_pass_duration_seconds_count", ())] == 2
    assert abs(got[("synapse_scheduler_pass_duration_seconds_sum", ())] - 0.05) < 1e-9


class FakeProposer:
    def __init__(self) -> None:
        self.futures: list[Future[c.Result]] = []

    def propose(self, command: c.Command) -> Future[c.Result]:
        future: Future[c.Result] = Future()
        self.futures.append(future)
        return future


def test_committed_binds_are_counted_with_their_decision_latency() -> None:
    cluster = Cluster()
    cluster.add(node("a1"))
    job_id = cluster.submit(job("one", gpu=1))  # submitted at t=1000 ms
    command = cluster.plan().command(cluster.now)
    assert isinstance(command, c.BindPlan)
    inner = FakeProposer()
    metrics = ReplicaMetrics("r1", FakeReplica(cluster.state), clock_ms=lambda: 4_000)
    future = metrics.proposer(inner).propose(command)
    assert samples(metrics.registry)[("synapse_scheduler_binds_total", ())] == 0
    inner.futures[0].set_result(c.ok(bound=(job_id,)))
    assert future.result().bound == (job_id,)
    got = samples(metrics.registry)
    assert got[("synapse_scheduler_binds_total", ())] == 1
    assert got[("synapse_scheduler_decision_latency_seconds_sum", ())] == 3.0
    assert got[("synapse_raft_proposals_total", (("outcome", "ok"),))] == 1
    assert got[("synapse_raft_proposal_latency_seconds_count", ())] == 1


def test_failed_proposals_and_rejected_gangs_are_counted() -> None:
    inner = FakeProposer()
    metrics = ReplicaMetrics("r1", FakeReplica(ClusterState()))
    proposer = metrics.proposer(inner)
    proposer.propose(c.Barrier(leader_id="r1", now_ms=1))
    proposer.propose(c.BindPlan(now_ms=1))
    inner.futures[0].set_exception(RuntimeError("leadership moved"))
    rejection = c.Rejection("j1", c.RejectCode(next(iter(c.RejectCode))), "stale")
    inner.futures[1].set_result(c.ok(rejected=(rejection,)))
    got = samples(metrics.registry)
    assert got[("synapse_raft_proposals_total", (("outcome", "failed"),))] == 1
    assert got[("synapse_raft_proposal_latency_seconds_count", ())] == 1
    code = str(next(iter(c.RejectCode)))
    assert got[("synapse_scheduler_bind_rejections_total", (("code", code),))] == 1


class FakeExecutor:
    def __init__(self) -> None:
        self.known: set[str] = set()
        self.highest_token: dict[str, int] = {}
        self.live: list[str] = []
        self.exits: list[tuple[str, Any]] = []

    def start(self, spec: Any, preempted: Any = None) -> object:
        self.live.append(spec)
        return spec

    def stop(self, key: Any) -> None:
        pass

    def poll(self) -> list[tuple[str, Any]]:
        exits, self.exits = self.exits, []
        for key, _ in exits:
            self.live.remove(key)
        return exits

    def running(self) -> list[str]:
        return list(self.live)

    def gpus_held(self) -> dict[str, tuple[int, ...]]:
        return {}

    def kill_all(self, detail: str) -> list[tuple[str, Any]]:
        killed = [(k, SimpleNamespace(exit_code=-9, disrupted=True)) for k in self.live]
        self.live = []
        return killed

    def mark_reported(self, key: Any) -> None:
        pass


def test_member_starts_and_exits_by_outcome() -> None:
    metrics = WorkerMetrics("n1")
    inner = FakeExecutor()
    executor = MeteredExecutor(inner, metrics)
    for key in ("a", "b", "c", "d", "e"):
        executor.start(key)
    inner.exits = [
        ("a", SimpleNamespace(exit_code=0, disrupted=False)),
        ("b", SimpleNamespace(exit_code=3, disrupted=False)),
        ("c", SimpleNamespace(exit_code=-15, disrupted=True)),
    ]
    assert len(executor.poll()) == 3
    got = samples(metrics.registry)
    assert got[("synapse_worker_member_starts_total", ())] == 5
    assert got[("synapse_worker_members_running", ())] == 2
    for outcome, n in (("succeeded", 1), ("failed", 1), ("disrupted", 1), ("fenced", 0)):
        assert got[("synapse_worker_member_exits_total", (("outcome", outcome),))] == n
    assert len(executor.kill_all("lease lapsed")) == 2
    got = samples(metrics.registry)
    assert got[("synapse_worker_fenced_members_total", ())] == 2
    assert got[("synapse_worker_member_exits_total", (("outcome", "fenced"),))] == 2
    assert got[("synapse_worker_members_running", ())] == 0
    executor.known = {"x"}
    assert inner.known == {"x"}


def test_heartbeats_are_timed_and_failures_counted() -> None:
    class Plane:
        fail = False

        def register(self, request: Any) -> Any:
            return "registered"

        def heartbeat(self, request: Any, timeout_s: float) -> Any:
            if self.fail:
                raise ConnectionError("no leader")
            return "reply"

    metrics = WorkerMetrics("n1")
    inner = Plane()
    plane = MeteredControlPlane(inner, metrics)
    assert plane.heartbeat("hb", 1.0) == "reply"
    inner.fail = True
    try:
        plane.heartbeat("hb", 1.0)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the failure must reach the agent")
    got = samples(metrics.registry)
    assert got[("synapse_worker_heartbeat_round_trip_seconds_count", ())] == 1
    assert got[("synapse_worker_heartbeat_failures_total", ())] == 1


class FakeNvml:
    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if h == 1:
            raise RuntimeError("GPU is lost")
        return SimpleNamespace(gpu=75)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=2 << 30, total=80 << 30)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 61


def test_gpu_readings_come_from_nvml_and_mock_gpus_report_none() -> None:
    with_nvml = WorkerMetrics("n1", nvml=FakeNvml())
    got = samples(with_nvml.registry)
    assert got[("synapse_gpu_utilization_ratio", (("gpu", "0"),))] == 0.75
    assert got[("synapse_gpu_temperature_celsius", (("gpu", "0"),))] == 61
    assert got[("synapse_gpu_memory_used_bytes", (("gpu", "0"),))] == 2 << 30
    assert ("synapse_gpu_utilization_ratio", (("gpu", "1"),)) not in got  # failed reading
    mock = samples(WorkerMetrics("n2").registry)
    assert not [name for name, _ in mock if name.startswith("synapse_gpu_")]
    assert list(GpuCollector(None).collect()) == []


def test_committed_preemptions_count_their_victims_and_refused_ones_nothing() -> None:
    inner = FakeProposer()
    metrics = ReplicaMetrics("r1", FakeReplica(ClusterState()))
    proposer = metrics.proposer(inner)
    victims = (c.Victim("j1", 3), c.Victim("j2", 4))
    proposer.propose(c.Preempt("j9", 0, victims, PreemptionKind.RECLAIM, now_ms=1))
    proposer.propose(c.Preempt("j8", 0, victims[:1], PreemptionKind.PRIORITY, now_ms=1))
    inner.futures[0].set_result(c.ok())
    inner.futures[1].set_result(c.error(c.ResultCode.CONFLICT, "stale"))
    assert samples(metrics.registry)[("synapse_scheduler_preemptions_total", ())] == 2


@dataclass
class FakeStreams:
    heartbeats: int = 120
    pushes: int = 3
    counts: tuple[int, int] = (2, 5)
    relay: tuple[int, int, int] = (40, 110, 4)

    def stream_counts(self) -> tuple[int, int]:
        return self.counts

    def relay_counts(self) -> tuple[int, int, int]:
        return self.relay


def test_heartbeat_streams_and_the_relay_are_read_at_every_scrape() -> None:
    metrics = ReplicaMetrics("r2", FakeReplica(ClusterState()))
    streams = FakeStreams()
    metrics.watch_streams(streams)
    got = samples(metrics.registry)
    assert got[("synapse_heartbeat_streams", (("kind", "leader"),))] == 2
    assert got[("synapse_heartbeat_streams", (("kind", "relayed"),))] == 5
    assert got[("synapse_heartbeat_stream_acks_total", ())] == 120
    assert got[("synapse_relay_batches_total", ())] == 40
    assert got[("synapse_relayed_heartbeats_total", ())] == 110
    assert got[("synapse_relay_failures_total", ())] == 4
    streams.counts, streams.relay = (0, 7), (41, 117, 4)
    got = samples(metrics.registry)
    assert got[("synapse_heartbeat_streams", (("kind", "relayed"),))] == 7
    assert got[("synapse_relayed_heartbeats_total", ())] == 117
