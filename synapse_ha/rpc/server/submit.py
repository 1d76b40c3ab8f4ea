"""Submissions: ``SubmitJob`` and ``SubmitJobs`` (many jobs in one call), with their
admission checks — the spec's rules, the caller's queue and priority, the per-identity
submit rate and pending caps (DESIGN §8) — before anything is proposed.

``SubmitJobs`` admits every job of the call first, in order; the first one refused ends
the call with that refusal, its message beginning ``jobs[i]:``, and nothing is proposed.
The admitted jobs are then proposed at once (the replica commits them in as few Raft
entries as its group commit makes) and each is applied as its own ``SubmitJob``: with
its own request id, so a call that fails part-way (a job refused at apply, a deadline)
is retried whole, and the jobs already made come back with ``created`` false.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from synapse_ha.core import access, admission, queue_rules, validation
from synapse_ha.core import commands as cmd
from synapse_ha.core.access import Identity
from synapse_ha.core.arrays import parse_array
from synapse_ha.core.cluster_config import Limits
from synapse_ha.core.feasibility import REFUSES_AT_FORMAT
from synapse_ha.core.machine.dependencies import submission_problem as dependency_problem
from synapse_ha.core.model import ClusterState, JobSpec
from synapse_ha.core.spec import SpecError
from synapse_ha.rpc import convert
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import Reason, abort, abort_invalid, for_item
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.server.context import (
    _audit,
    _Base,
    _invalid,
    _presented_token,
    _refuse_limit,
    _required,
)

MAX_SUBMIT_BATCH = 1_000  # jobs in one SubmitJobs call


@dataclass(slots=True)
class _Admitted:
    """One admitted submission: the job its request id already names, or the command
    to propose; ``held``: (owner, queue, jobs) counted against the pending caps until
    it is applied."""

    existing: str = ""
    command: cmd.SubmitJob | None = None
    held: tuple[str, str, int] | None = None


class _ItemContext:
    """The call's context for the ``index``-th job of a ``SubmitJobs``: a refusal's
    message begins ``jobs[index]:`` and the fields it names ``jobs[index].``; everything
    else is the call's."""

    def __init__(self, context: grpc.ServicerContext, index: int) -> None:
        self._context = context
        self._index = index

    def abort_with_status(self, status: grpc.Status) -> NoReturn:
        self._context.abort_with_status(for_item(status, self._index))
        raise AssertionError("unreachable")  # abort_with_status raises

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class SubmitService(_Base):
    """SubmitJob and SubmitJobs."""

    def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        identity = caller(context)
        limits = self.ctx.backend.cluster_config().limits
        limited = admission.limited(identity)
        if limited:
            self._charge_submission(context, identity, limits, 1)
        admitted = self._admit(context, identity, request, limits, limited)
        try:
            return self._submitted(context, identity, [admitted])[0]
        finally:
            self._release([admitted])

    def SubmitJobs(
        self, request: pb.SubmitJobsRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobsResponse:
        identity = caller(context)
        if not request.jobs:
            _required(context, "jobs")
        if len(request.jobs) > MAX_SUBMIT_BATCH:
            _invalid(context, SpecError("jobs", f"at most {MAX_SUBMIT_BATCH} jobs a call"))
        limits = self.ctx.backend.cluster_config().limits
        limited = admission.limited(identity)
        if limited:
            self._charge_submission(context, identity, limits, len(request.jobs))
        admitted: list[_Admitted] = []
        try:
            for i, item in enumerate(request.jobs):
                item_context: Any = _ItemContext(context, i)
                admitted.append(self._admit(item_context, identity, item, limits, limited))
            return pb.SubmitJobsResponse(jobs=self._submitted(context, identity, admitted))
        finally:
            self._release(admitted)

    def _submitted(
        self, context: grpc.ServicerContext, identity: Identity, admitted: Sequence[_Admitted]
    ) -> list[pb.SubmitJobResponse]:
        """Propose the admitted submissions at once; their answers, in order."""
        proposed = [self._start_proposal(context, a.command) for a in admitted if a.command]
        results = iter(self._committed(context, proposed) if proposed else [])
        out = []
        for i, a in enumerate(admitted):
            if a.command is None:  # a retry: nothing new to admit
                out.append(pb.SubmitJobResponse(job_id=a.existing, created=False))
                continue
            item_context: Any = _ItemContext(context, i) if len(admitted) > 1 else context
            result = self._check(item_context, next(results))
            if result.created:
                _audit(identity, "SubmitJob", result.job_id)
            out.append(pb.SubmitJobResponse(job_id=result.job_id, created=result.created))
        return out

    def _release(self, admitted: Sequence[_Admitted]) -> None:
        for a in admitted:
            if a.held is not None:
                self.ctx.pending_in_flight.release(*a.held)
                a.held = None

    def _admit(
        self,
        context: grpc.ServicerContext,
        identity: Identity,
        request: pb.SubmitJobRequest,
        limits: Limits,
        limited: bool,
    ) -> _Admitted:
        """Check one submission (abort on the first rule it breaks): the command to
        propose, or the job its request id already names."""
        if not request.HasField("spec"):
            _required(context, "spec")
        spec = convert.spec_from_proto(request.spec)
        levels = self.ctx.backend.cluster_config().topology_levels
        violations = validation.check_job_spec(spec, levels)
        violations += validation.check_request_id(request.request_id)
        if violations:
            abort_invalid(context, violations)
        _refuse_limit(context, identity, admission.size_refusal(limits, spec))
        self._require_serving_leader(context)
        # The policy lets only users submit (jobs run as their owner); the queue must
        # exist and be one the caller's credential allows (docs/queues.md), at a priority
        # it may use.
        state = self._check_queue(context, identity, spec)
        problem = dependency_problem(state, spec)
        if problem is not None:  # apply checks it again, on the state it applies to
            _invalid(context, SpecError(*problem))
        owner = identity.name
        request_id = admission.request_key(
            state, owner, request.request_id or f"srv-{uuid.uuid4().hex}"
        )
        existing = state.request_ids.get(request_id)
        if existing is not None:
            return _Admitted(existing=existing)
        if spec.wait_for_nodes and state.format_floor < REFUSES_AT_FORMAT:
            # Below that format nothing is refused for never fitting: the flag is moot,
            # and a replica of an older release could not read it.
            spec = dataclasses.replace(spec, wait_for_nodes=False)
        jobs = len(parse_array(spec.array).indices) if spec.array else 1
        held = limited and self._hold_pending(context, identity, spec, limits, jobs)
        command = cmd.SubmitJob(
            spec=spec, request_id=request_id, now_ms=self.ctx.clock_ms(), owner=owner
        )
        return _Admitted(command=command, held=(owner, spec.queue, jobs) if held else None)

    def _charge_submission(
        self, context: grpc.ServicerContext, identity: Identity, limits: Limits, count: int
    ) -> None:
        """Abort with LIMIT_EXCEEDED when ``identity`` submits ``count`` jobs faster than
        its rate allows (or more at once than its burst)."""
        if count > limits.submit_burst:
            abort(
                context,
                Reason.LIMIT_EXCEEDED,
                f"{access.describe_caller(identity)} may submit at most limits.submit_burst "
                f"({limits.submit_burst}) jobs at once; this call has {count}",
                {
                    "limit": admission.LimitName.SUBMIT_PER_S,
                    "allowed": str(limits.submit_burst),
                    "actual": str(count),
                },
            )
        wait_s = self.ctx.submit_rate.take(
            str(identity), limits.submit_burst, limits.submit_per_s, count
        )
        if wait_s > 0:
            abort(
                context,
                Reason.LIMIT_EXCEEDED,
                f"{access.describe_caller(identity)} submits faster than limits.submit_per_s "
                f"({limits.submit_per_s} a second, bursts of {limits.submit_burst}); retry in "
                f"{wait_s:.2f}s",
                {
                    "limit": admission.LimitName.SUBMIT_PER_S,
                    "allowed": str(limits.submit_per_s),
                    "actual": str(limits.submit_burst),
                    "retry_after_ms": str(max(1, round(wait_s * 1000))),
                },
            )

    def _hold_pending(
        self,
        context: grpc.ServicerContext,
        identity: Identity,
        spec: JobSpec,
        limits: Limits,
        jobs: int,
    ) -> bool:
        """Count the submission's ``jobs`` (an array's tasks) against the pending caps
        until it is applied (abort with LIMIT_EXCEEDED when it would pass one); True once
        held. The state is read under the lock a release takes after its apply, so every
        other submission is counted once: in the state, or as held."""
        in_flight = self.ctx.pending_in_flight
        with in_flight.lock:
            state = self.ctx.backend.snapshot()
            counts = admission.pending_counts(state, identity.name, spec.queue)
            mine, queued = in_flight.counts(identity.name, spec.queue)
            total = admission.PendingCounts(counts.owner + mine, counts.queue + queued)
            refusal = admission.pending_refusal(limits, total, identity.name, spec.queue, jobs)
            if refusal is None:
                in_flight.hold(identity.name, spec.queue, jobs)
        _refuse_limit(context, identity, refusal)
        return True

    def _check_queue(
        self, context: grpc.ServicerContext, identity: Identity, spec: JobSpec
    ) -> ClusterState:
        """Abort unless ``spec``'s queue and class exist (INVALID_FIELD), the caller may
        submit to that queue (PERMISSION_DENIED, :func:`access.queue_refusal`) and at that
        priority (:func:`admission.priority_refusal`); the state it was checked against."""
        state = self.ctx.backend.snapshot()
        classes = state.config.priority_classes
        violations = queue_rules.check_job_queue(spec, state.queues, classes)
        if violations:
            abort_invalid(context, violations)
        token = _presented_token(context, state)
        queues = None if token is None else token.queues
        refusal = access.queue_refusal(identity, spec.queue, queues)
        if refusal is None:
            grant = admission.PriorityGrant()
            if token is not None:
                grant = admission.PriorityGrant(token.priority_classes, token.max_priority)
            queue = state.queues[spec.queue]
            refusal = admission.priority_refusal(identity, spec, queue, classes, grant)
        if refusal is not None:
            self._refuse(context, refusal, identity)
        return state
