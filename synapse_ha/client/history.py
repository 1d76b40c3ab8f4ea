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
from synapse_ha.rpc import states
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
    return FinishedAttempt(
        number=a.number,
        fencing_token=a.fencing_token,
        state=states.shown_attempt_state(a),
        nodes=tuple(a.nodes),
        gpus=a.gpus,
        bound_at_ms=a.bound_at_ms,
        started_at_ms=a.started_at_ms,
        ended_at_ms=a.ended_at_ms,
        gpu_ms=a.gpu_ms,
        outcome_code=a.outcome_code,
        outcome=a.outcome,
    )


def finished_job_from_proto(j: pb.HistoryJob) -> FinishedJob:
    r = j.spec.resources
    return FinishedJob(
        job_id=j.job_id,
        name=j.name,
        owner=j.owner,
        queue=j.queue,
        state=states.shown_job_state(j),
        reason_code=j.reason_code,
        reason=j.reason,
        submitted_at_ms=j.submitted_at_ms,
        started_at_ms=j.started_at_ms,
        finished_at_ms=j.finished_at_ms,
        attempts=j.attempts,
        retries_used=j.retries_used,
        requeues=j.requeues,
        gpus_per_attempt=j.gpus_per_attempt,
        gpu_ms=j.gpu_ms,
        nodes=tuple(j.nodes),
        cancelled_by=j.cancelled_by,
        replicas=j.spec.replicas,
        resources=Resources(r.cpu_milli, r.memory_mib, r.gpu),
        attempt_list=tuple(attempt_from_proto(a) for a in j.attempt_list),
        checkpoint=checkpoint_from_proto(j.checkpoint) if j.HasField("checkpoint") else None,
        resume_step=j.resume_step if j.HasField("resume_step") else None,
    )


def usage_from_proto(answer: pb.GetUsageResponse) -> Usage:
    rows = tuple(UsageRow(r.key, r.day, r.gpu_ms, r.attempts) for r in answer.rows)
    return Usage(answer.by, answer.since_ms, answer.until_ms, rows)


def event_from_proto(e: pb.Event) -> ClusterEvent:
    return ClusterEvent(
        index=e.index,
        kind=e.kind,
        time_ms=e.time_ms,
        job_id=e.job_id,
        job_name=e.job_name,
        owner=e.owner,
        queue=e.queue,
        attempt=e.attempt,
        nodes=tuple(e.nodes),
        node_id=e.node_id,
        reason_code=e.reason_code,
        detail=e.detail,
        leader_id=e.leader_id,
    )


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
