"""A submission's admission, before anything is proposed: the spec's rules, the size
limits, the serving leader, the caller's queue and priority, the job's dependencies,
the request id already used, the submit rate and the pending caps (DESIGN §8).

:func:`admit` checks one job and returns what to propose (or the job its request id
already names), or the first :class:`Refusal`; the transport proposes the admitted
jobs at once and :func:`release` lets go of their pending holds once they have an
outcome."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import Limits
from synapse_ha.core.feasibility import REFUSES_AT_FORMAT
from synapse_ha.core.identity import access, admission
from synapse_ha.core.identity.access import Identity
from synapse_ha.core.machine.apply_dependencies import submission_problem as dependency_problem
from synapse_ha.core.model import ClusterState, JobSpec, Token
from synapse_ha.core.queues import job_rules as queue_rules
from synapse_ha.core.spec import validation
from synapse_ha.core.spec.document import SpecError
from synapse_ha.core.workflows.arrays import parse_array
from synapse_ha.service.limits import PendingInFlight, SubmitRate
from synapse_ha.service.refusal import ErrorReason, Refusal, denied, invalid
from synapse_ha.service.replica import Replica

audit = logging.getLogger("synapse_ha.audit")

# The token the caller presented, read against a state (None: it presented none).
PresentedToken = Callable[[ClusterState], Token | None]


@dataclass(slots=True)
class Admitted:
    """One admitted submission: the job its request id already names, or the command
    to propose; ``held``: (owner, queue, jobs) counted against the pending caps until
    it is applied."""

    existing: str = ""
    command: cmd.SubmitJob | None = None
    held: tuple[str, str, int] | None = None


def limit_refusal(identity: Identity, refusal: admission.LimitExceeded) -> Refusal:
    """LIMIT_EXCEEDED naming the limit and the figures (and one audit line)."""
    audit.info("%s refused by limits.%s (%d of %d)", identity, refusal.limit,
               refusal.actual, refusal.allowed)  # fmt: skip
    return Refusal(
        ErrorReason.LIMIT_EXCEEDED,
        refusal.message,
        metadata={
            "limit": refusal.limit,
            "allowed": str(refusal.allowed),
            "actual": str(refusal.actual),
        },
    )


def charge(rate: SubmitRate, identity: Identity, limits: Limits, count: int) -> Refusal | None:
    """LIMIT_EXCEEDED when ``identity`` submits ``count`` jobs faster than its rate
    allows (or more at once than its burst); else the submissions are charged."""
    if count > limits.submit_burst:
        return Refusal(
            ErrorReason.LIMIT_EXCEEDED,
            f"{access.describe_caller(identity)} may submit at most limits.submit_burst "
            f"({limits.submit_burst}) jobs at once; this call has {count}",
            metadata={
                "limit": admission.LimitName.SUBMIT_PER_S,
                "allowed": str(limits.submit_burst),
                "actual": str(count),
            },
        )
    wait_s = rate.take(str(identity), limits.submit_burst, limits.submit_per_s, count)
    if wait_s > 0:
        return Refusal(
            ErrorReason.LIMIT_EXCEEDED,
            f"{access.describe_caller(identity)} submits faster than limits.submit_per_s "
            f"({limits.submit_per_s} a second, bursts of {limits.submit_burst}); retry in "
            f"{wait_s:.2f}s",
            metadata={
                "limit": admission.LimitName.SUBMIT_PER_S,
                "allowed": str(limits.submit_per_s),
                "actual": str(limits.submit_burst),
                "retry_after_ms": str(max(1, round(wait_s * 1000))),
            },
        )
    return None


def admit(
    replica: Replica,
    identity: Identity,
    spec: JobSpec,
    request_id: str,
    *,
    limits: Limits,
    limited: bool,
    presented: PresentedToken,
    pending: PendingInFlight,
) -> Admitted | Refusal:
    """Check one submission of ``identity``: the command to propose, or the job its
    request id already names, or the first rule it breaks."""
    levels = replica.cluster_config().topology_levels
    violations = validation.check_job_spec(spec, levels)
    violations += validation.check_request_id(request_id)
    if violations:
        return invalid(violations)
    too_big = admission.size_refusal(limits, spec)
    if too_big is not None:
        return limit_refusal(identity, too_big)
    elsewhere = replica.leader_refusal()
    if elsewhere is not None:
        return elsewhere
    owner = identity.name
    # Each check reads a few records: under the apply lock, without a snapshot's copy.
    with replica.reading() as state:
        refusal = _queue_refusal(state, identity, spec, presented(state))
        if refusal is not None:
            return refusal
        problem = dependency_problem(state, spec)
        if problem is not None:  # apply checks it again, on the state it applies to
            return invalid(SpecError(*problem).violations)
        key = admission.request_key(state, owner, request_id or f"srv-{uuid.uuid4().hex}")
        existing = state.request_ids.get(key)
        floor = state.format_floor
    if existing is not None:
        return Admitted(existing=existing)
    if spec.wait_for_nodes and floor < REFUSES_AT_FORMAT:
        # Below that format nothing is refused for never fitting: the flag is moot,
        # and a replica of an older release could not read it.
        spec = dataclasses.replace(spec, wait_for_nodes=False)
    jobs = len(parse_array(spec.array).indices) if spec.array else 1
    held = None
    if limited:
        over = _hold_pending(replica, pending, identity, spec, limits, jobs)
        if over is not None:
            return over
        held = (owner, spec.queue, jobs)
    command = cmd.SubmitJob(spec=spec, request_id=key, now_ms=replica.clock_ms(), owner=owner)
    return Admitted(command=command, held=held)


def release(pending: PendingInFlight, admitted: Sequence[Admitted]) -> None:
    """Let go of the pending holds of ``admitted`` (their proposals have an outcome)."""
    for a in admitted:
        if a.held is not None:
            pending.release(*a.held)
            a.held = None


def _hold_pending(
    replica: Replica,
    pending: PendingInFlight,
    identity: Identity,
    spec: JobSpec,
    limits: Limits,
    jobs: int,
) -> Refusal | None:
    """Count the submission's ``jobs`` (an array's tasks) against the pending caps
    until it is applied, or LIMIT_EXCEEDED when it would pass one. The state is read
    under the lock a release takes after its apply, so every other submission is
    counted once: in the state, or as held."""
    with pending.lock:
        state = replica.snapshot()
        counts = admission.pending_counts(state, identity.name, spec.queue)
        mine, queued = pending.counts(identity.name, spec.queue)
        total = admission.PendingCounts(counts.owner + mine, counts.queue + queued)
        refusal = admission.pending_refusal(limits, total, identity.name, spec.queue, jobs)
        if refusal is None:
            pending.hold(identity.name, spec.queue, jobs)
    return None if refusal is None else limit_refusal(identity, refusal)


def _queue_refusal(
    state: ClusterState, identity: Identity, spec: JobSpec, token: Token | None
) -> Refusal | None:
    """INVALID_FIELD unless ``spec``'s queue and class exist; PERMISSION_DENIED unless
    the caller may submit to that queue (:func:`access.queue_refusal`) and at that
    priority (:func:`admission.priority_refusal`)."""
    classes = state.config.priority_classes
    violations = queue_rules.check_job_queue(spec, state.queues, classes)
    if violations:
        return invalid(violations)
    queues = None if token is None else token.queues
    refusal = access.queue_refusal(identity, spec.queue, queues)
    if refusal is None:
        grant = admission.PriorityGrant()
        if token is not None:
            grant = admission.PriorityGrant(token.priority_classes, token.max_priority)
        queue = state.queues[spec.queue]
        refusal = admission.priority_refusal(identity, spec, queue, classes, grant)
    return None if refusal is None else denied(refusal, identity)
