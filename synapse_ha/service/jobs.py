"""A job's cancellation or requeue by its owner (or an operator)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from synapse_ha.core import commands as cmd
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import Identity
from synapse_ha.core.model import JobState
from synapse_ha.service import commit
from synapse_ha.service.refusal import ErrorReason, Refusal, denied, required
from synapse_ha.service.replica import Replica

audit = logging.getLogger("synapse_ha.audit")

MAX_REASON = 1024  # characters of a cancellation's reason kept


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What the cancellation says, and the job's state after it (an array: its tasks')."""

    message: str
    state: JobState


def job_not_found(job_id: str) -> Refusal:
    return Refusal(ErrorReason.JOB_NOT_FOUND, f"no job {job_id!r}", metadata={"job_id": job_id})


def cancel(
    replica: Replica,
    identity: Identity,
    job_id: str,
    reason: str,
    timeout_s: float,
    requeue: bool = False,
) -> Cancelled | Refusal:
    """Cancel ``job_id`` (a job or an array) as ``identity``, who must manage it; with
    ``requeue``, stop its live attempt and queue it again instead (``RequeueJob``)."""
    if not job_id:
        return required("job_id")
    elsewhere = replica.leader_refusal()
    if elsewhere is not None:
        return elsewhere
    snapshot = replica.snapshot()
    known = snapshot.jobs.get(job_id) or snapshot.arrays.get(job_id)
    if known is None:
        return job_not_found(job_id)
    refusal = access.job_refusal(identity, job_id, known.owner)
    if refusal is not None:
        return denied(refusal, identity)
    kind = cmd.RequeueJob if requeue else cmd.CancelJob
    command = kind(
        job_id=job_id,
        reason=reason[:MAX_REASON] or ("requeued" if requeue else "cancelled") + " by user",
        now_ms=replica.clock_ms(),
        actor=str(identity),
    )
    results = commit.committed([replica.propose(command)], timeout_s)
    if isinstance(results, Refusal):
        return results
    failed = commit.refused(results[0], job_not_found(job_id))
    if failed is not None:
        return failed
    audit.info("%s %s %s", identity, kind.__name__, job_id)
    job = replica.snapshot().jobs.get(job_id)
    return Cancelled(results[0].message, job.state if job is not None else JobState.CANCELLED)
