"""Protobuf forms of history rows, usage rows and events."""

from __future__ import annotations

from synapse_ha.core.model import AttemptState, JobState
from synapse_ha.core.reasons import render, withheld
from synapse_ha.history.store import HistoryAttempt, HistoryJob, UsageRow
from synapse_ha.history.tracker import Event
from synapse_ha.rpc import states
from synapse_ha.rpc.convert import checkpoint_to_proto, clamp_int32, spec_to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def attempt_to_proto(a: HistoryAttempt) -> pb.HistoryAttempt:
    return pb.HistoryAttempt(
        number=clamp_int32(a.number),
        fencing_token=a.fencing_token,
        **states.attempt_state_fields(AttemptState(a.state)),
        nodes=list(a.nodes),
        gpus=a.gpus,
        bound_at_ms=a.bound_at_ms,
        started_at_ms=a.started_at_ms,
        ended_at_ms=a.ended_at_ms,
        gpu_ms=a.gpu_ms,
        outcome_code=a.outcome_code,
        outcome=a.outcome,
    )


def history_job_to_proto(j: HistoryJob) -> pb.HistoryJob:
    msg = pb.HistoryJob(
        job_id=j.job_id,
        name=j.name,
        owner=j.owner,
        queue=j.queue,
        **states.job_state_fields(JobState(j.state)),
        reason_code=j.reason_code,
        reason=j.reason,
        submitted_at_ms=j.submitted_at_ms,
        started_at_ms=j.started_at_ms,
        finished_at_ms=j.finished_at_ms,
        attempts=clamp_int32(j.attempts),
        retries_used=clamp_int32(j.retries_used),
        requeues=clamp_int32(j.requeues),
        gpus_per_attempt=j.gpus_per_attempt,
        gpu_ms=j.gpu_ms,
        nodes=list(j.nodes),
        cancelled_by=j.cancelled_by,
        spec=spec_to_proto(j.spec),
        attempt_list=[attempt_to_proto(a) for a in j.attempt_list],
        applied_index=j.applied_index,
    )
    if j.checkpoint_at_ms:
        msg.checkpoint.CopyFrom(checkpoint_to_proto(j.checkpoint_at_ms, j.checkpoint_step))
    if j.resume_step is not None:
        msg.resume_step = j.resume_step
    return msg


def usage_row_to_proto(r: UsageRow) -> pb.UsageRow:
    return pb.UsageRow(key=r.key, day=r.day, gpu_ms=r.gpu_ms, attempts=clamp_int32(r.attempts))


def event_to_proto(e: Event, redacted: bool = False) -> pb.Event:
    """The event as the API shows it; ``redacted`` withholds the text its job controls
    (:func:`synapse_ha.core.reasons.withheld`) from a caller who may not manage the job."""
    detail = e.description
    if redacted and e.reason is not None:
        detail = render(withheld(e.reason))
    return pb.Event(
        index=e.index,
        kind=str(e.kind),
        time_ms=e.time_ms,
        job_id=e.job_id,
        job_name=e.job_name,
        owner=e.owner,
        queue=e.queue,
        attempt=clamp_int32(e.attempt),
        nodes=list(e.nodes),
        node_id=e.node_id,
        reason_code=e.reason_code,
        detail=detail,
        leader_id=e.leader_id,
    )
