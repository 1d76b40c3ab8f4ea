"""The cluster-state gauges of a replica, computed at scrape time.

:class:`ReplicaCollector` reports the Raft figures of the replica and what its newest
snapshot holds: jobs by state and queue, pending gangs by reason code, nodes by status,
free and used GPUs by rack, unhealthy GPUs by node and the checks failing on each node.
It reads one immutable snapshot (``ReplicaSource.snapshot()``: the apply lock is held
only to copy the record dictionaries) and derives every gauge from it
without any lock; the figures (:class:`StateFigures`, a pure function of the state) are
cached per applied command, so scrapes between two applies cost one comparison.

A GPU recorded unhealthy (:mod:`synapse_ha.core.health.fitness`) is never free: the scheduler
does not place on it until an operator repairs it. One that a gang still holds while
its members are being stopped counts as used, as any held GPU does.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from synapse_ha.core.health.fitness import unhealthy_gpus
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import ClusterState, JobState, NodeStatus, topology_path

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
    @property
    def tick_stalls(self) -> int: ...
    @property
    def longest_tick_interval_s(self) -> float: ...


class ReplicaSource(Protocol):
    """What the replica's collector reads (the Raft replica implements it)."""

    def status(self) -> RaftFigures: ...
    def snapshot(self) -> ClusterState: ...


class PlanLike(Protocol):
    """The part of a scheduling pass's plan the metrics read."""

    @property
    def reservations(self) -> Sequence[object]: ...


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
    unhealthy: dict[str, int]  # node -> unhealthy GPUs (every node, 0 when healthy)
    failing: tuple[tuple[str, str], ...] = ()  # (node, check) of every failing check

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
        unhealthy: dict[str, int] = {}
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
            sick = unhealthy_gpus(node.gpu_faults)
            unhealthy[node_id] = len(sick)
            # A dead node offers nothing, but its GPUs stay counted as used while bound;
            # an unhealthy GPU is never offered (held, it counts as used).
            unusable = len(node.allocated_gpus | sick) if sick else used
            free = 0 if node.status is NodeStatus.DEAD else node.info.capacity.gpu - unusable
            gpus[(rack, "used")] += used
            gpus[(rack, "free")] += max(0, free)
        failing = sorted(
            (node_id, k.name) for node_id, node in state.nodes.items() for k in node.conditions
        )
        return cls(
            state.applied_commands,
            dict(jobs),
            dict(pending),
            dict(nodes),
            dict(gpus),
            dict(sorted(unhealthy.items())),
            tuple(failing),
        )


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
        yield from self._raft_families()
        yield from state_families(self.figures())
        plan = self._last_plan()
        reservations = GaugeMetricFamily(
            "synapse_scheduler_reservations",
            "reservations held by the leader's newest pass, one per gang (0 on followers)",
        )
        reservations.add_metric([], float(len(plan.reservations)) if plan is not None else 0.0)
        yield reservations

    def _raft_families(self) -> Iterator[Metric]:
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
            (
                "synapse_raft_longest_tick_interval_seconds",
                "the longest time between the starts of two ticks of the Raft thread",
                status.longest_tick_interval_s,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=["replica"])
            family.add_metric([self._replica_id], float(value))
            yield family
        stalls = CounterMetricFamily(
            "synapse_raft_tick_stalls",
            "ticks of the Raft thread that started over half the shortest election timeout "
            "after the one before (a leader silent that long risks its term)",
            labels=["replica"],
        )
        stalls.add_metric([self._replica_id], float(status.tick_stalls))
        yield stalls


def _gauge(
    name: str, doc: str, labels: Sequence[str], samples: Iterable[tuple[Sequence[str], float]]
) -> GaugeMetricFamily:
    """A gauge family named ``name`` with one sample per ``(label values, value)``."""
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, n in samples:
        family.add_metric(list(values), float(n))
    return family


def state_families(figures: StateFigures) -> Iterator[Metric]:
    """The gauges of what the replicated state holds, from its figures."""
    yield _gauge(
        "synapse_jobs",
        "jobs in the replicated state by state and queue",
        ("state", "queue"),
        sorted(figures.jobs.items()),
    )
    yield _gauge(
        "synapse_scheduler_pending_gangs",
        "pending gangs by the code of the reason they wait",
        ("reason",),
        (((code,), n) for code, n in sorted(figures.pending.items())),
    )
    statuses = [str(s) for s in NodeStatus]
    yield _gauge(
        "synapse_nodes",
        "nodes by status",
        ("status",),
        (((status,), figures.nodes.get(status, 0)) for status in statuses),
    )
    yield _gauge(
        "synapse_gpus",
        "GPUs by rack, free or used (an unhealthy GPU is never free)",
        ("rack", "state"),
        sorted(figures.gpus.items()),
    )
    yield _gauge(
        "synapse_gpus_unhealthy",
        "GPUs of each node recorded unhealthy (never placed on until repaired)",
        ("node",),
        (((node_id,), n) for node_id, n in figures.unhealthy.items()),
    )
    yield _gauge(
        "synapse_node_check_failing",
        "1 for each check failing on a node (its health-check program); a node with none "
        "failing has no series",
        ("node", "check"),
        ((key, 1.0) for key in figures.failing),
    )
