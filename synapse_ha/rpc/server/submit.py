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

from collections.abc import Sequence
from typing import Any, NoReturn

import grpc

from synapse_ha.core.cluster_config import Limits
from synapse_ha.core.identity import admission
from synapse_ha.core.identity.access import Identity
from synapse_ha.core.spec.document import SpecError
from synapse_ha.rpc import from_proto
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import for_item
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.server.context import (
    Servicer,
    abort_required,
    abort_spec_error,
    audit_write,
    presented_token,
)
from synapse_ha.service import submit
from synapse_ha.service.refusal import Refusal

MAX_SUBMIT_BATCH = 1_000  # jobs in one SubmitJobs call


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


class SubmitService(Servicer):
    """SubmitJob and SubmitJobs: the transport of :mod:`synapse_ha.service.submit`."""

    def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        identity = caller(context)
        limits = self.ctx.backend.cluster_config().limits
        limited = admission.limited(identity)
        if limited:
            self._charge(context, identity, limits, 1)
        admitted = self._admit(context, identity, request, limits, limited)
        try:
            return self._submitted(context, identity, [admitted])[0]
        finally:
            submit.release(self.ctx.per_identity.pending_in_flight, [admitted])

    def SubmitJobs(
        self, request: pb.SubmitJobsRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobsResponse:
        identity = caller(context)
        if not request.jobs:
            abort_required(context, "jobs")
        if len(request.jobs) > MAX_SUBMIT_BATCH:
            abort_spec_error(context, SpecError("jobs", f"at most {MAX_SUBMIT_BATCH} jobs a call"))
        limits = self.ctx.backend.cluster_config().limits
        limited = admission.limited(identity)
        if limited:
            self._charge(context, identity, limits, len(request.jobs))
        admitted: list[submit.Admitted] = []
        try:
            for i, item in enumerate(request.jobs):
                item_context: Any = _ItemContext(context, i)
                admitted.append(self._admit(item_context, identity, item, limits, limited))
            return pb.SubmitJobsResponse(jobs=self._submitted(context, identity, admitted))
        finally:
            submit.release(self.ctx.per_identity.pending_in_flight, admitted)

    def _submitted(
        self,
        context: grpc.ServicerContext,
        identity: Identity,
        admitted: Sequence[submit.Admitted],
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
                audit_write(identity, "SubmitJob", result.job_id)
            out.append(pb.SubmitJobResponse(job_id=result.job_id, created=result.created))
        return out

    def _charge(
        self, context: grpc.ServicerContext, identity: Identity, limits: Limits, count: int
    ) -> None:
        refusal = submit.charge(self.ctx.per_identity.submit_rate, identity, limits, count)
        if refusal is not None:
            self._fail(context, refusal)

    def _admit(
        self,
        context: grpc.ServicerContext,
        identity: Identity,
        request: pb.SubmitJobRequest,
        limits: Limits,
        limited: bool,
    ) -> submit.Admitted:
        """One submission, converted and admitted (:func:`submit.admit`); abort on the
        first rule it breaks."""
        if not request.HasField("spec"):
            abort_required(context, "spec")
        admitted = submit.admit(
            self.replica,
            identity,
            from_proto.spec_from_proto(request.spec),
            request.request_id,
            limits=limits,
            limited=limited,
            presented=lambda state: presented_token(context, state),
            pending=self.ctx.per_identity.pending_in_flight,
        )
        if isinstance(admitted, Refusal):
            self._fail(context, admitted, identity)
        return admitted
