"""Jobs and arrays as the client library hands them out to synctl: the spec as the core
:class:`~synapse_ha.core.model.JobSpec` (through :mod:`synapse_ha.rpc.from_proto`), with
what the server adds to show it: the state as it names it, the reason, the attempt and
where each member runs, whether it withheld another user's command (``redacted``).

A state stays the text the server showed, so that a state this library does not know
is shown rather than refused; :attr:`JobView.job_state` reads it as a
:class:`~synapse_ha.core.model.JobState` for decisions (it raises ``ValueError`` for an
unknown one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobSpec, JobState
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.rpc import fields, from_proto, states, to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint mark: when (ms since the epoch) and its step (None: it named none)."""

    at_ms: int
    step: int | None


@dataclass(frozen=True, slots=True)
class MemberView:
    rank: int
    node_id: str
    gpus: tuple[int, ...]
    state: str
    exit_code: int | None
    checkpoint: Checkpoint | None
    generation: int = 0  # placed again this many times while its gang ran on
    lost: bool = False  # lost with its node, waiting to be placed again


@dataclass(frozen=True, slots=True)
class AttemptView:
    """The job's current or last attempt; times 0: not yet. ``preempted_by`` "": not
    being preempted."""

    number: int
    fencing_token: int
    outcome: str
    members: tuple[MemberView, ...]
    bound_at_ms: int
    started_at_ms: int
    ended_at_ms: int
    preempted_by: str
    preemption: str
    preempt_deadline_ms: int
    checkpoint: Checkpoint | None


@dataclass(frozen=True, slots=True)
class JobView:
    """One job as the cluster shows it. ``spec``'s command and environment are empty
    when ``redacted``; ``waiting_for``: the dependencies not met yet; times 0: not yet."""

    job_id: str
    spec: JobSpec
    state: str
    reason: str
    reason_code: str
    retries_used: int
    requeues: int
    request_id: str
    owner: str
    cancelled_by: str
    redacted: bool
    attempt: AttemptView | None
    submitted_at_ms: int
    finished_at_ms: int
    waiting_for: Dependencies
    resume_step: int | None

    @property
    def job_state(self) -> JobState:
        return JobState(self.state)


@dataclass(frozen=True, slots=True)
class ArrayView:
    """An array: the spec its tasks share and its tasks (those still kept) counted by
    the state the server named."""

    array_id: str
    spec: JobSpec
    owner: str
    tasks: int
    throttle: int
    task_states: Mapping[str, int]
    submitted_at_ms: int
    request_id: str
    redacted: bool


@dataclass(frozen=True, slots=True)
class Explained:
    """Why a job is where it is: the server's sentence and its machine-readable code."""

    job_id: str
    state: str
    explanation: str
    reason_code: str


def checkpoint_from_proto(mark: pb.Checkpoint) -> Checkpoint:
    return Checkpoint(mark.at_ms, mark.step if mark.HasField("step") else None)


def _mark(msg: Any) -> Checkpoint | None:
    return checkpoint_from_proto(msg.checkpoint) if msg.HasField("checkpoint") else None


def member_from_proto(m: pb.Member) -> MemberView:
    return fields.from_message(
        MemberView,
        m,
        state=states.shown_member_state(m),
        exit_code=m.exit_code if m.has_exit_code else None,
        checkpoint=_mark(m),
    )


def attempt_from_proto(a: pb.Attempt) -> AttemptView:
    return fields.from_message(
        AttemptView, a, members=tuple(member_from_proto(m) for m in a.members), checkpoint=_mark(a)
    )


def job_from_proto(job: pb.Job) -> JobView:
    return fields.from_message(
        JobView,
        job,
        spec=from_proto.spec_from_proto(job.spec),
        state=states.shown_job_state(job),
        attempt=attempt_from_proto(job.attempt) if job.HasField("attempt") else None,
        waiting_for=fields.from_message(Dependencies, job.waiting_for),
    )


def array_from_proto(array: pb.ArraySummary) -> ArrayView:
    return fields.from_message(ArrayView, array, spec=from_proto.spec_from_proto(array.spec))


def explained_from_proto(answer: pb.ExplainJobResponse) -> Explained:
    return fields.from_message(Explained, answer, state=states.shown_job_state(answer))


# ------------------------------------------------------------------------- calls


def submit_job(client: ClusterClient, spec: JobSpec, request_id: str) -> tuple[str, bool]:
    """Submit ``spec``; the job's id, and False when ``request_id`` had already made it."""
    answer = client.submit_job(to_proto.spec_to_proto(spec), request_id)
    return answer.job_id, bool(answer.created)


def get_job(client: ClusterClient, job_id: str) -> JobView:
    return job_from_proto(client.get_job(job_id))


def get_array(client: ClusterClient, array_id: str) -> ArrayView:
    return array_from_proto(client.get_array(array_id))


def list_lines(client: ClusterClient, **filters: Any) -> list[JobView | ArrayView]:
    """Jobs in submission order, an array as one line (see
    :meth:`ClusterClient.list_lines` for the filters)."""
    return [
        job_from_proto(item) if isinstance(item, pb.Job) else array_from_proto(item)
        for item in client.list_lines(**filters)
    ]


def list_jobs(client: ClusterClient, **filters: Any) -> list[JobView]:
    """Every matching job, each task of an array on its own line."""
    return [job_from_proto(j) for j in client.list_jobs(**filters)]


def explain_job(client: ClusterClient, job_id: str) -> Explained:
    return explained_from_proto(client.explain_job(job_id))


def cancel_job(client: ClusterClient, job_id: str, reason: str = "") -> tuple[JobState, str]:
    """Cancel a job: its state now and the cluster's message."""
    answer = client.cancel_job(job_id, reason)
    return states.job_state(answer), answer.message
