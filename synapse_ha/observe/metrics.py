"""Prometheus metrics of a replica and of a worker (``prometheus_client``).

Names follow the Prometheus conventions: a ``synapse_`` prefix, base units (seconds,
bytes, ratios), ``_total`` for counters. Each process owns one
:class:`~prometheus_client.CollectorRegistry` (never the library's global one), so tests
and several processes in one interpreter never mix their series.

Two kinds of series:

* **Events**, counted where they happen (counters and histograms): proposals and their
  latency, scheduling passes, binds, leader changes on a replica; heartbeats, member
  starts and exits on a worker. The hooks are wrappers the composition roots put around
  the real parts (:class:`MeteredProposer`, :class:`MeteredControlPlane`,
  :class:`MeteredExecutor`), so the leader loop and the agent know nothing of metrics.
* **State**, computed at scrape time (:class:`ReplicaCollector`, :class:`GpuCollector`):
  Raft status, jobs by state and queue, pending gangs by reason code, nodes by status,
  free and used GPUs by rack. The replica's collector reads one immutable snapshot
  (``StateReader.snapshot()``: the apply lock is held only to copy what changed since
  the previous snapshot) and derives every gauge from it without any lock; the figures
  are cached per applied command, so scrapes between two applies cost one comparison.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from synapse_ha.core import commands as cmd
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import ClusterState, JobState, NodeStatus, topology_path

# Seconds; proposals commit in milliseconds on a quiet cluster and in seconds under load.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Seconds from a gang's queueing to its bind: from a pass away to hours of waiting.
DECISION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)

DEFAULT_QUEUE = "default"
NO_RACK = "-"


# ----------------------------------------------------------------- what is read


class RaftFigures(Protocol):
    """The Raft figures a scrape reports (the Raft replica's status has them)."""

    @property
    def role(self) -> str: ...
    @property
    def term(self) -> int: ...
    @property
    def commit_index(self) -> int: ...
    @property
    def last_applied(self) -> int: ...
    @property
    def has_quorum(self) -> bool: ...


class ReplicaSource(Protocol):
    """What the replica's collector reads (the Raft replica implements it)."""

    def status(self) -> RaftFigures: ...
    def snapshot(self) -> ClusterState: ...


class PlanLike(Protocol):
    """The part of a scheduling pass's plan the metrics read."""

    @property
    def reservation(self) -> object | None: ...


class Proposing(Protocol):
    def propose(self, command: cmd.Command) -> Future[cmd.Result]: ...


def queue_of(spec: object) -> str:
    """The queue a job was submitted to; ``default`` for specs that name none."""
    return str(getattr(spec, "queue", "") or DEFAULT_QUEUE)


def rack_of(state: ClusterState, node_id: str) -> str:
    """The node's innermost topology domain above the host (``-`` when unlabelled)."""
    node = state.nodes[node_id]
    levels = state.config.topology_levels
    if not levels:
        return NO_RACK
    return topology_path(node.info, levels)[-2]


# ---------------------------------------------------------------------- replica


@dataclass(frozen=True, slots=True)
class StateFigures:
    """The gauges derived from one snapshot; a pure function of the state."""

    applied_commands: int
    jobs: dict[tuple[str, str], int]  # (state, queue) -> count
    pending: dict[str, int]  # reason code -> pending gangs
    nodes: dict[str, int]  # status -> count
    gpus: dict[tuple[str, str], int]  # (rack, free|used) -> GPUs

    @classmethod
    def of(
        cls, state: ClusterState, racks: dict[str, tuple[object, object, str]] | None = None
    ) -> StateFigures:
        """``racks``, when given, remembers each node's rack between calls (keyed by its
        description and the topology levels, both immutable values), so a scrape does not
        walk every node's labels again."""
        jobs: Tally[tuple[str, str]] = Tally()
        pending: Tally[str] = Tally()
        for job in state.jobs.values():
            jobs[(str(job.state), queue_of(job.spec))] += 1
            if job.state is JobState.PENDING:
                pending[str(job.reason.code)] += 1
        nodes: Tally[str] = Tally()
        gpus: Tally[tuple[str, str]] = Tally()
        levels = state.config.topology_levels
        if racks is not None and len(racks) > 2 * len(state.nodes) + 64:
            racks.clear()  # nodes that left
        for node_id, node in state.nodes.items():
            nodes[str(node.status)] += 1
            known = racks.get(node_id) if racks is not None else None
            if known is not None and known[0] is node.info and known[1] is levels:
                rack = known[2]
            else:
                rack = rack_of(state, node_id)
                if racks is not None:
                    racks[node_id] = (node.info, levels, rack)
            used = len(node.allocated_gpus)
            # A dead node offers nothing, but its GPUs stay counted as used while bound.
            free = 0 if node.status is NodeStatus.DEAD else node.info.capacity.gpu - used
            gpus[(rack, "used")] += used
            gpus[(rack, "free")] += max(0, free)
        return cls(state.applied_commands, dict(jobs), dict(pending), dict(nodes), dict(gpus))


class ReplicaCollector(Collector):
    """Raft status and state gauges, computed when Prometheus scrapes."""

    def __init__(
        self,
        replica_id: str,
        source: ReplicaSource,
        last_plan: Callable[[], PlanLike | None] = lambda: None,
    ) -> None:
        self._replica_id = replica_id
        self._source = source
        self._last_plan = last_plan
        self._lock = threading.Lock()
        self._figures: StateFigures | None = None
        self._racks: dict[str, tuple[object, object, str]] = {}

    def figures(self) -> StateFigures:
        """The state figures of the newest snapshot, recomputed only after an apply."""
        state = self._source.snapshot()
        with self._lock:
            cached = self._figures
            if cached is not None and cached.applied_commands == state.applied_commands:
                return cached
        figures = StateFigures.of(state, self._racks)
        with self._lock:
            self._figures = figures
        return figures

    def describe(self) -> Iterable[Metric]:
        return []  # collected at scrape time only: no describe-time snapshot

    def collect(self) -> Iterator[Metric]:
        status = self._source.status()
        role = GaugeMetricFamily(
            "synapse_raft_role",
            "1 for this replica's current Raft role",
            labels=["replica", "role"],
        )
        for each in (ReplicaRole.LEADER, ReplicaRole.FOLLOWER, ReplicaRole.CANDIDATE):
            role.add_metric([self._replica_id, each], 1.0 if status.role == each else 0.0)
        yield role
        for name, doc, value in (
            ("synapse_raft_term", "current Raft term", status.term),
            (
                "synapse_raft_commit_index",
                "index of the newest committed entry",
                status.commit_index,
            ),
            (
                "synapse_raft_applied_index",
                "index of the newest applied entry",
                status.last_applied,
            ),
            (
                "synapse_raft_apply_lag_entries",
                "committed entries not applied yet",
                max(0, status.commit_index - status.last_applied),
            ),
            (
                "synapse_raft_has_quorum",
                "1 when this replica sees a majority",
                int(status.has_quorum),
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=["replica"])
            family.add_metric([self._replica_id], float(value))
            yield family

        figures = self.figures()
        jobs = GaugeMetricFamily(
            "synapse_jobs",
            "jobs in the replicated state by state and queue",
            labels=["state", "queue"],
        )
        for (state, queue), n in sorted(figures.jobs.items()):
            jobs.add_metric([state, queue], float(n))
        yield jobs
        pending = GaugeMetricFamily(
            "synapse_scheduler_pending_gangs",
            "pending gangs by the code of the reason they wait",
            labels=["reason"],
        )
        for code, n in sorted(figures.pending.items()):
            pending.add_metric([code], float(n))
        yield pending
        nodes = GaugeMetricFamily("synapse_nodes", "nodes by status", labels=["status"])
        for status_name in (str(s) for s in NodeStatus):
            nodes.add_metric([status_name], float(figures.nodes.get(status_name, 0)))
        yield nodes
        gpus = GaugeMetricFamily(
            "synapse_gpus", "GPUs by rack, free or used", labels=["rack", "state"]
        )
        for (rack, kind), n in sorted(figures.gpus.items()):
            gpus.add_metric([rack, kind], float(n))
        yield gpus
        plan = self._last_plan()
        reservations = GaugeMetricFamily(
            "synapse_scheduler_reservations",
            "head-of-line reservations held by the leader's newest pass (0 on followers)",
        )
        reservations.add_metric([], 1.0 if plan is not None and plan.reservation else 0.0)
        yield reservations


class ReplicaMetrics:
    """Every metric of one replica, in a registry of its own.

    Thread-safe: prometheus_client's counters and histograms take their own locks;
    :meth:`note_leader` and :meth:`observe_step` are called by the leader loop's driver
    thread only."""

    def __init__(
        self,
        replica_id: str,
        source: ReplicaSource,
        last_plan: Callable[[], PlanLike | None] = lambda: None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.replica_id = replica_id
        self._source = source
        self._clock_ms = clock_ms
        self.collector = ReplicaCollector(replica_id, source, last_plan)
        self.registry.register(self.collector)
        r = self.registry
        self.leader_changes = Counter(
            "synapse_raft_leader_changes",
            "times the leader this replica knows changed (including to none)",
            registry=r,
        )
        self.proposals = Counter(
            "synapse_raft_proposals",
            "commands proposed by this replica, by outcome",
            ["outcome"],
            registry=r,
        )
        self.proposal_latency = Histogram(
            "synapse_raft_proposal_latency_seconds",
            "from proposing a command to its result on this replica",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.pass_duration = Histogram(
            "synapse_scheduler_pass_duration_seconds",
            "wall time of leader-loop steps that ran a scheduling pass (plan and command)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.decision_latency = Histogram(
            "synapse_scheduler_decision_latency_seconds",
            "from a gang's queueing (submission, or the end of its previous attempt) to its "
            "committed bind",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.binds = Counter(
            "synapse_scheduler_binds", "gangs bound by committed plans", registry=r
        )
        self.bind_rejections = Counter(
            "synapse_scheduler_bind_rejections",
            "gangs of committed plans that apply rejected, by code",
            ["code"],
            registry=r,
        )
        # Gangs whose preemption began: the victims of every committed Preempt command.
        self.preemptions = Counter("synapse_scheduler_preemptions", "gangs preempted", registry=r)
        for outcome in ("ok", "error", "failed"):
            self.proposals.labels(outcome=outcome)
        for code in cmd.RejectCode:  # every series exists from the start, at 0
            self.bind_rejections.labels(code=str(code))
        self._leader: str | None = None
        self._plan: object | None = None

    # -- hooks of the composition root

    def note_leader(self, leader_address: str) -> None:
        """The leader as this replica knows it now; counts a change of it."""
        if self._leader is not None and leader_address != self._leader:
            self.leader_changes.inc()
        self._leader = leader_address

    def observe_step(self, plan: object | None, seconds: float) -> None:
        """A leader-loop step took ``seconds`` and left ``plan`` as the newest pass's plan;
        a plan other than the previous one means the step ran a pass."""
        if plan is not None and plan is not self._plan:
            self.pass_duration.observe(seconds)
        self._plan = plan

    def proposer(self, inner: Proposing) -> MeteredProposer:
        return MeteredProposer(inner, self)


class MeteredProposer:
    """A :class:`~synapse_ha.leader.ports.Proposer` that times every proposal and counts the
    binds of committed plans; otherwise passes everything through unchanged."""

    def __init__(self, inner: Proposing, metrics: ReplicaMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def propose(self, command: cmd.Command) -> Future[cmd.Result]:
        metrics = self._metrics
        started = time.perf_counter()
        queued_since: dict[str, int] = {}
        if isinstance(command, cmd.BindPlan) and command.placements:
            state = metrics._source.snapshot()
            for placement in command.placements:
                job = state.jobs.get(placement.job_id)
                if job is not None:
                    ended = job.attempt.ended_at_ms if job.attempt is not None else None
                    queued_since[job.job_id] = max(job.submitted_at_ms, ended or 0)
        future = self._inner.propose(command)

        def settled(f: Future[cmd.Result]) -> None:
            try:
                result = f.result()
            except BaseException:
                metrics.proposals.labels(outcome="failed").inc()
                return
            metrics.proposal_latency.observe(time.perf_counter() - started)
            metrics.proposals.labels(outcome="ok" if result.ok else "error").inc()
            if isinstance(command, cmd.Preempt) and result.ok:
                metrics.preemptions.inc(len(command.victims))
            if not isinstance(command, cmd.BindPlan):
                return
            now_ms = metrics._clock_ms()
            metrics.binds.inc(len(result.bound))
            for job_id in result.bound:
                since = queued_since.get(job_id)
                if since is not None:
                    metrics.decision_latency.observe(max(0, now_ms - since) / 1000)
            for rejection in result.rejected:
                metrics.bind_rejections.labels(code=str(rejection.code)).inc()

        future.add_done_callback(settled)
        return future


# ----------------------------------------------------------------------- worker


class HeartbeatPlane(Protocol):
    def register(self, request: Any) -> Any: ...
    def heartbeat(self, request: Any, timeout_s: float) -> Any: ...


class WorkerMetrics:
    """Every metric of one worker agent, in a registry of its own."""

    def __init__(self, node_id: str, nvml: Any = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.node_id = node_id
        r = self.registry
        self.heartbeat_rtt = Histogram(
            "synapse_worker_heartbeat_round_trip_seconds",
            "from sending a heartbeat to its reply (answered heartbeats only)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.heartbeat_failures = Counter(
            "synapse_worker_heartbeat_failures",
            "heartbeats no leader answered, or answered with an error",
            registry=r,
        )
        self.member_starts = Counter(
            "synapse_worker_member_starts", "members started on this node", registry=r
        )
        self.member_exits = Counter(
            "synapse_worker_member_exits",
            "members that ended on this node, by outcome (succeeded, failed, disrupted, fenced)",
            ["outcome"],
            registry=r,
        )
        self.fenced_members = Counter(
            "synapse_worker_fenced_members",
            "members this node killed because it lost its lease or the leader forgot it",
            registry=r,
        )
        self.members_running = Gauge(
            "synapse_worker_members_running", "members running on this node now", registry=r
        )
        for outcome in ("succeeded", "failed", "disrupted", "fenced"):
            self.member_exits.labels(outcome=outcome)
        self.registry.register(GpuCollector(nvml))


class MeteredControlPlane:
    """Times the agent's heartbeats; passes everything through unchanged."""

    def __init__(self, inner: HeartbeatPlane, metrics: WorkerMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def register(self, request: Any) -> Any:
        return self._inner.register(request)

    def heartbeat(self, request: Any, timeout_s: float) -> Any:
        started = time.perf_counter()
        try:
            reply = self._inner.heartbeat(request, timeout_s)
        except Exception:
            self._metrics.heartbeat_failures.inc()
            raise
        self._metrics.heartbeat_rtt.observe(time.perf_counter() - started)
        return reply


class MemberExitLike(Protocol):
    @property
    def exit_code(self) -> int: ...
    @property
    def disrupted(self) -> bool: ...


class ExecutorLike(Protocol):
    known: Any
    highest_token: Any

    def start(self, spec: Any, preempted: Any = None) -> object: ...
    def stop(self, key: Any) -> None: ...
    def preempt(self, key: Any, notice: Any) -> None: ...
    def poll(self) -> Sequence[tuple[Any, Any]]: ...
    def running(self) -> list[Any]: ...
    def gpus_held(self) -> dict[Any, tuple[int, ...]]: ...
    def kill_all(self, detail: str) -> Sequence[tuple[Any, Any]]: ...
    def mark_reported(self, key: Any) -> None: ...


def exit_outcome(exit_: MemberExitLike) -> str:
    if exit_.disrupted:
        return "disrupted"
    return "succeeded" if exit_.exit_code == 0 else "failed"


class MeteredExecutor:
    """Counts member starts and exits (by outcome) of the agent's executor; passes
    everything through unchanged. Members killed by :meth:`kill_all` (fencing, or a
    leader that forgot this node) count as ``fenced``."""

    def __init__(self, inner: ExecutorLike, metrics: WorkerMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    @property
    def known(self) -> Any:
        return self._inner.known

    @known.setter
    def known(self, value: Any) -> None:
        self._inner.known = value

    @property
    def highest_token(self) -> Any:
        return self._inner.highest_token

    @highest_token.setter
    def highest_token(self, value: Any) -> None:
        self._inner.highest_token = value

    def start(self, spec: Any, preempted: Any = None) -> object:
        member = self._inner.start(spec, preempted)
        self._metrics.member_starts.inc()
        self._update_running()
        return member

    def stop(self, key: Any) -> None:
        self._inner.stop(key)

    def preempt(self, key: Any, notice: Any) -> None:
        self._inner.preempt(key, notice)

    def poll(self) -> list[tuple[Any, Any]]:
        exits = list(self._inner.poll())
        for _key, exit_ in exits:
            self._metrics.member_exits.labels(outcome=exit_outcome(exit_)).inc()
        if exits:
            self._update_running()
        return exits

    def running(self) -> list[Any]:
        return self._inner.running()

    def gpus_held(self) -> dict[Any, tuple[int, ...]]:
        return self._inner.gpus_held()

    def kill_all(self, detail: str) -> list[tuple[Any, Any]]:
        exits = list(self._inner.kill_all(detail))
        self._metrics.fenced_members.inc(len(exits))
        for _ in exits:
            self._metrics.member_exits.labels(outcome="fenced").inc()
        self._update_running()
        return exits

    def mark_reported(self, key: Any) -> None:
        self._inner.mark_reported(key)

    def _update_running(self) -> None:
        self._metrics.members_running.set(len(self._inner.running()))


class GpuCollector(Collector):
    """Per-GPU utilisation, memory and temperature read from NVML at scrape time.

    Without NVML (``nvml`` None: mock GPUs, or no driver) it yields nothing: a mock GPU
    has no readings, and none are invented. A GPU whose reading fails is left out of that
    series."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._ready = False

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        nvml = self._nvml
        if nvml is None:
            return
        with self._lock:
            try:
                if not self._ready:
                    nvml.nvmlInit()
                    self._ready = True
                count = int(nvml.nvmlDeviceGetCount())
            except Exception:
                return
            util = GaugeMetricFamily(
                "synapse_gpu_utilization_ratio", "GPU busy share (NVML)", labels=["gpu"]
            )
            used = GaugeMetricFamily(
                "synapse_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=["gpu"]
            )
            total = GaugeMetricFamily(
                "synapse_gpu_memory_total_bytes", "GPU memory (NVML)", labels=["gpu"]
            )
            temp = GaugeMetricFamily(
                "synapse_gpu_temperature_celsius", "GPU temperature (NVML)", labels=["gpu"]
            )
            for i in range(count):
                label = [str(i)]
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                    celsius = nvml.nvmlDeviceGetTemperature(handle, 0)  # NVML_TEMPERATURE_GPU
                except Exception:
                    continue
                util.add_metric(label, float(rates.gpu) / 100.0)
                used.add_metric(label, float(memory.used))
                total.add_metric(label, float(memory.total))
                temp.add_metric(label, float(celsius))
        yield from (util, used, total, temp)
