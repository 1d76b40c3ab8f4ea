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
* **State**, computed at scrape time: the replica's Raft status and what its state holds
  (:class:`~synapse_ha.observe.state_metrics.ReplicaCollector`: jobs, pending gangs,
  nodes, free, used and unhealthy GPUs), a worker's NVML readings (:class:`GpuCollector`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from synapse_ha.core import commands as cmd
from synapse_ha.observe.state_metrics import PlanLike, ReplicaCollector, ReplicaSource

# Seconds; proposals commit in milliseconds on a quiet cluster and in seconds under load.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Seconds from a gang's queueing to its bind: from a pass away to hours of waiting.
DECISION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)


class Proposing(Protocol):
    def propose(self, command: cmd.Command) -> Future[cmd.Result]: ...


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

    def watch_streams(self, streams: StreamStats) -> None:
        """Report ``streams``' counts at every scrape (:class:`StreamCollector`)."""
        self.registry.register(StreamCollector(streams))


class StreamStats(Protocol):
    """What a replica's heartbeat stream server counts (rpc/stream.py, rpc/relay.py)."""

    heartbeats: int
    pushes: int

    def stream_counts(self) -> tuple[int, int]: ...  # (to the leader, relayed)

    def relay_counts(self) -> tuple[int, int, int]: ...  # (batches, relayed, failed)


class StreamCollector(Collector):
    """The heartbeat streams this replica holds and what its relay did, read at scrape
    time: an operator sees where the workers' streams are and whether relaying works."""

    def __init__(self, streams: StreamStats) -> None:
        self.streams = streams

    def collect(self) -> Iterator[Metric]:
        direct, relayed = self.streams.stream_counts()
        open_streams = GaugeMetricFamily(
            "synapse_heartbeat_streams",
            "workers' heartbeat streams open on this replica, to it as leader or relayed",
            labels=["kind"],
        )
        open_streams.add_metric(["leader"], direct)
        open_streams.add_metric(["relayed"], relayed)
        yield open_streams
        yield CounterMetricFamily(
            "synapse_heartbeat_stream_acks",
            "heartbeats acknowledged on this replica's streams",
            value=self.streams.heartbeats,
        )
        batches, confirmed, failed = self.streams.relay_counts()
        yield CounterMetricFamily(
            "synapse_relay_batches",
            "RelayHeartbeats requests the leader answered (docs/relay.md)",
            value=batches,
        )
        yield CounterMetricFamily(
            "synapse_relayed_heartbeats",
            "heartbeats this follower relayed and the leader confirmed",
            value=confirmed,
        )
        yield CounterMetricFamily(
            "synapse_relay_failures",
            "heartbeats this follower could not relay (no leader, the leader unreachable, "
            "or this replica behind): their streams ended",
            value=failed,
        )


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
    def tell_membership(self, desired: Any) -> bool: ...


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

    def start(self, spec: Any, preempted: Any = None) -> Any:
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

    def tell_membership(self, desired: Any) -> bool:
        return self._inner.tell_membership(desired)

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
