"""The job methods of ``SchedulerService``: submit (with its admission checks), cancel,
read, list, explain, and the grants that let a caller read a member's log."""

from __future__ import annotations

from bisect import bisect_right
from itertools import islice

import grpc

from synapse_ha.core.identity import access
from synapse_ha.core.model import ArrayJob, ClusterState, Job, JobState
from synapse_ha.core.scheduler import explain, why_pending
from synapse_ha.core.spec.document import SpecError
from synapse_ha.rpc import states, to_proto
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import ErrorReason, abort
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.server.context import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    abort_job_not_found,
    abort_required,
    abort_spec_error,
)
from synapse_ha.rpc.server.job_messages import SUBMISSION_ORDER
from synapse_ha.rpc.server.submit import SubmitService
from synapse_ha.service.jobs import cancel
from synapse_ha.service.refusal import Refusal


def _listed(job: Job, wanted_states: set[JobState], request: pb.ListJobsRequest) -> bool:
    """Whether ``job`` passes the request's state, name and node filters."""
    if wanted_states and job.state not in wanted_states:
        return False
    if request.name and job.spec.name != request.name:
        return False
    return not request.node_id or (
        job.attempt is not None and any(m.node_id == request.node_id for m in job.attempt.members)
    )


def _tasks(state: ClusterState, array: ArrayJob) -> list[Job]:
    return [state.jobs[t] for t in array.task_ids() if t in state.jobs]


# A page ends after a job (its seq), or after a task of an array ("<seq>:<index>"). An
# array shown as one line ends its page at its seq: its tasks are all behind it.
_WHOLE_SEQ = 1 << 62


def _page_token(last: Job | ArrayJob) -> str:
    if isinstance(last, Job) and last.array_id:
        return f"{last.seq}:{last.array_index}"
    return str(last.seq)


def _page_start(context: grpc.ServicerContext, token: str) -> tuple[int, int]:
    """Where the page after ``token`` starts: after this (seq, task index)."""
    if not token:
        return (0, _WHOLE_SEQ)
    seq, _, index = token.partition(":")
    if not seq.isdigit() or (index and not index.isdigit()):
        abort_spec_error(
            context, SpecError("page_token", "is not a next_page_token a replica returned")
        )
    return (int(seq), int(index) if index else _WHOLE_SEQ)


class JobService(SubmitService):
    """SubmitJob(s) (:class:`SubmitService`), CancelJob, RequeueJob, GetJob, GetArray, ListJobs,
    ExplainJob and GrantLogAccess."""

    def CancelJob(
        self, request: pb.CancelJobRequest, context: grpc.ServicerContext
    ) -> pb.CancelJobResponse:
        identity = caller(context)
        done = cancel(
            self.replica, identity, request.job_id, request.reason, self._write_timeout_s(context)
        )
        if isinstance(done, Refusal):
            self._fail(context, done, identity)
        self._send_index(context)  # the state now holds the write: a read token for it
        return pb.CancelJobResponse(message=done.message, **states.job_state_fields(done.state))

    def RequeueJob(
        self, request: pb.RequeueJobRequest, context: grpc.ServicerContext
    ) -> pb.RequeueJobResponse:
        identity = caller(context)
        timeout_s = self._write_timeout_s(context)
        done = cancel(
            self.replica, identity, request.job_id, request.reason, timeout_s, requeue=True
        )
        if isinstance(done, Refusal):
            self._fail(context, done, identity)
        self._send_index(context)
        return pb.RequeueJobResponse(message=done.message, **states.job_state_fields(done.state))

    # -------------------------------------------------------------------- reads

    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.GetJobResponse:
        if not request.job_id:
            abort_required(context, "job_id")
        stale = self._read_mode(context, request.allow_stale)
        state = self.ctx.backend.snapshot()
        job = state.jobs.get(request.job_id)
        if job is not None:
            redacted = not access.may_manage_job(caller(context), job.owner)
            return pb.GetJobResponse(job=self.ctx.job_messages.of(job, redacted), stale=stale)
        abort_job_not_found(context, request.job_id, state)

    def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.ServicerContext
    ) -> pb.ListJobsResponse:
        wanted_states = set()
        for i, name in enumerate(states.job_state_filter_of(request)):
            try:
                wanted_states.add(JobState(name.upper()))
            except ValueError:
                allowed = ", ".join(s.value for s in JobState)
                abort_spec_error(
                    context, SpecError(f"states[{i}]", f"{name!r} is not one of {allowed}")
                )
        if request.limit < 0:
            abort_spec_error(context, SpecError("limit", "must not be negative"))
        after = _page_start(context, request.page_token)
        page_size = min(request.limit or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        stale = self._read_mode(context, request.allow_stale)
        identity = caller(context)
        with self._heavy_read(context, request.allow_stale):
            state = self.ctx.backend.snapshot()
            page: list[Job | ArrayJob] = []
            more = False
            shown: set[str] = set()  # arrays already on the page
            ordered = self.ctx.job_order.of(state)
            start = bisect_right(ordered, after, key=SUBMISSION_ORDER)
            for job in islice(ordered, start, None):
                if job.array_id in shown:
                    continue
                if request.array_id and job.array_id != request.array_id:
                    continue
                if not _listed(job, wanted_states, request):
                    continue
                if len(page) == page_size:
                    more = True
                    break
                if request.collapse_arrays and job.array_id:
                    shown.add(job.array_id)
                    page.append(state.arrays[job.array_id])
                else:
                    page.append(job)
            out = []
            arrays = []
            for item in page:
                redacted = not access.may_manage_job(identity, item.owner)
                if isinstance(item, ArrayJob):
                    arrays.append(to_proto.array_to_proto(item, _tasks(state, item), redacted))
                else:
                    out.append(self.ctx.job_messages.of(item, redacted))
            next_token = _page_token(page[-1]) if more else ""
            # Built within the gate: copying the messages in is most of a listing's cost
            # now that each job is converted once, and the gate must count it.
            return pb.ListJobsResponse(
                jobs=out, arrays=arrays, stale=stale, next_page_token=next_token
            )

    def GetArray(
        self, request: pb.GetArrayRequest, context: grpc.ServicerContext
    ) -> pb.GetArrayResponse:
        if not request.array_id:
            abort_required(context, "array_id")
        stale = self._read_mode(context, request.allow_stale)
        state = self.ctx.backend.snapshot()
        array = state.arrays.get(request.array_id)
        if array is None:
            abort_job_not_found(context, request.array_id)
        redacted = not access.may_manage_job(caller(context), array.owner)
        summary = to_proto.array_to_proto(array, _tasks(state, array), redacted)
        return pb.GetArrayResponse(array=summary, stale=stale)

    def ExplainJob(
        self, request: pb.ExplainJobRequest, context: grpc.ServicerContext
    ) -> pb.ExplainJobResponse:
        if not request.job_id:
            abort_required(context, "job_id")
        stale = self._read_mode(context, request.allow_stale, follower=False)
        now = self.ctx.clock_ms()
        state = self.ctx.backend.snapshot()
        job = state.jobs.get(request.job_id)
        if job is None:
            abort_job_not_found(context, request.job_id, state)
        self._may_manage(context, caller(context), job.job_id, job.owner)
        last_plan = None if stale else self.ctx.last_plan()
        with self._heavy_read(context, request.allow_stale, follower=False):
            waiting = why_pending(state, job.job_id, now, last_plan)
            explanation = explain(state, job.job_id, now, last_plan)
        return pb.ExplainJobResponse(
            job_id=job.job_id,
            **states.job_state_fields(job.state),
            explanation=explanation,
            stale=stale,
            reason_code=str((waiting or job.reason).code),
        )

    # --------------------------------------------------------------------- logs

    def GrantLogAccess(
        self, request: pb.GrantLogAccessRequest, context: grpc.ServicerContext
    ) -> pb.GrantLogAccessResponse:
        """A signed grant to read one member's log on its worker, for whoever may manage
        the job. ``attempt`` 0 means the current (or last) attempt."""
        if not request.job_id:
            abort_required(context, "job_id")
        identity = caller(context)
        self._read_mode(context, allow_stale=False, follower=False)
        state = self.ctx.backend.snapshot()
        job = state.jobs.get(request.job_id)
        if job is None:
            abort_job_not_found(context, request.job_id, state)
        self._may_manage(context, identity, job.job_id, job.owner)
        attempt = job.attempt
        if attempt is None or request.attempt not in (0, attempt.number):
            abort_spec_error(
                context, SpecError("attempt", "names no attempt of this job that has run")
            )
        if not 0 <= request.rank < len(attempt.members):
            abort_spec_error(
                context, SpecError("rank", f"must be between 0 and {len(attempt.members) - 1}")
            )
        signer = self.ctx.grant_signer
        if signer is None:
            abort(
                context,
                ErrorReason.NEEDS_TLS,
                "log grants need TLS: this cluster has no key to sign them; read logs "
                "from the worker directly",
            )
        node_id = attempt.members[request.rank].node_id
        node = state.nodes.get(node_id)
        grant, expires_at_ms = signer(job.job_id, str(identity), node_id)
        return pb.GrantLogAccessResponse(
            grant=grant,
            node_id=node_id,
            node_address=node.info.address if node is not None else "",
            expires_at_ms=expires_at_ms,
        )
