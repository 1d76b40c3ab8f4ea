"""The cluster's history as the client library hands it out: finished jobs with their
attempts (:class:`FinishedJob`, :class:`FinishedAttempt`), GPU usage per user or queue
and day (:class:`Usage`), and the event stream (:class:`ClusterEvent`). States stay the
text the server showed, so that one this library does not know is shown, not refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.client.jobs import Checkpoint, checkpoint_from_proto
from synapse_ha.core.model import Resources
from synapse_ha.rpc import fields, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


@dataclass(frozen=True, slots=True)
class FinishedAttempt:
    """One attempt of a finished job; ``gpus``: members x GPUs per member;
    ``gpu_ms``: gpus x (end - bind); ``started_at_ms`` 0: no member ever ran."""

    number: int
    fencing_token: int
    state: str
    nodes: tuple[str, ...]
    gpus: int
    bound_at_ms: int
    started_at_ms: int
    ended_at_ms: int
    gpu_ms: int
    outcome_code: str
    outcome: str


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A finished job as the history keeps it; ``started_at_ms`` 0: it never ran."""

    job_id: str
    name: str
    owner: str
    queue: str
    state: str
    reason_code: str
    reason: str
    submitted_at_ms: int
    started_at_ms: int
    finished_at_ms: int
    attempts: int
    retries_used: int
    requeues: int
    gpus_per_attempt: int
    gpu_ms: int
    nodes: tuple[str, ...]
    cancelled_by: str
    replicas: int
    resources: Resources
    attempt_list: tuple[FinishedAttempt, ...]
    checkpoint: Checkpoint | None
    resume_step: int | None


@dataclass(frozen=True, slots=True)
class UsageRow:
    """GPU-milliseconds of one user or queue (``key``) on one UTC day (YYYY-MM-DD)."""

    key: str
    day: str
    gpu_ms: int
    attempts: int


@dataclass(frozen=True, slots=True)
class Usage:
    by: str
    since_ms: int
    until_ms: int
    rows: tuple[UsageRow, ...]


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One event; a field left empty (or 0) does not apply to its kind."""

    index: int
    kind: str
    time_ms: int
    job_id: str
    job_name: str
    owner: str
    queue: str
    attempt: int
    nodes: tuple[str, ...]
    node_id: str
    reason_code: str
    detail: str
    leader_id: str


def attempt_from_proto(a: pb.HistoryAttempt) -> FinishedAttempt:
    return fields.from_message(FinishedAttempt, a, state=states.shown_attempt_state(a))


def finished_job_from_proto(j: pb.HistoryJob) -> FinishedJob:
    r = j.spec.resources
    return fields.from_message(
        FinishedJob,
        j,
        state=states.shown_job_state(j),
        replicas=j.spec.replicas,
        resources=Resources(r.cpu_milli, r.memory_mib, r.gpu),
        attempt_list=tuple(attempt_from_proto(a) for a in j.attempt_list),
        checkpoint=checkpoint_from_proto(j.checkpoint) if j.HasField("checkpoint") else None,
    )


def usage_from_proto(answer: pb.GetUsageResponse) -> Usage:
    rows = tuple(fields.from_message(UsageRow, r) for r in answer.rows)
    return fields.from_message(Usage, answer, rows=rows)


def event_from_proto(e: pb.Event) -> ClusterEvent:
    return fields.from_message(ClusterEvent, e)


def list_history(client: ClusterClient, **filters: object) -> list[FinishedJob]:
    """Finished jobs, newest first (see :meth:`ClusterClient.list_history`)."""
    return [finished_job_from_proto(j) for j in client.list_history(**filters)]


def get_usage(client: ClusterClient, by: str, since_ms: int, until_ms: int = 0) -> Usage:
    """GPU-milliseconds per ``by`` (user or queue) and UTC day."""
    return usage_from_proto(client.get_usage(by, since_ms, until_ms))


def watch_events(
    client: ClusterClient,
    since_index: int = 0,
    follow: bool = False,
    reconnect_s: float | None = None,
) -> Iterator[ClusterEvent]:
    """Events after ``since_index`` (see :meth:`ClusterClient.watch_events`)."""
    stream = client.watch_events(since_index, follow=follow, reconnect_s=reconnect_s)
    return (event_from_proto(e) for e in stream)
