"""gRPC servicers of one replica: thin adapters that convert, call and convert back.

Routing (see protos/synapse/v1/control.proto): writes and fresh reads need the serving
leader (leader whose term barrier has committed). Elsewhere a request gets NOT_LEADER
(FAILED_PRECONDITION, the leader's id and gRPC address in the ErrorInfo metadata and, for
older clients, in the trailing metadata key ``synapse-leader``), or LEADER_NOT_READY /
NO_LEADER (UNAVAILABLE). Writes wait for their commit with a deadline; an unknown outcome
is OUTCOME_UNKNOWN (DEADLINE_EXCEEDED, safe to retry with the same request id).

Every error is built by :mod:`synapse_ha.rpc.errors` and carries a machine-readable
reason (docs/errors.md).

Who may call what is checked before a handler runs (:mod:`synapse_ha.rpc.auth`, the
policy in :mod:`synapse_ha.core.access`); handlers read the caller with
:func:`~synapse_ha.rpc.auth.caller` and narrow further: a user manages only its own jobs
and sees the command and environment of no other job, a worker speaks only for its own
node. Every accepted write names its actor in the command (audit, in the replicated
state) and in one INFO line on the ``synapse_ha.audit`` logger.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NoReturn, Protocol

import grpc

from synapse_ha.app.leader import Liveness
from synapse_ha.app.ports import ProposalError
from synapse_ha.core import access, admission, validation
from synapse_ha.core import commands as cmd
from synapse_ha.core.access import Identity, Role
from synapse_ha.core.codec import READABLE_VERSIONS, encode_state
from synapse_ha.core.membership import MembershipCode, MembershipRefusal, MemberView
from synapse_ha.core.model import (
    ClusterConfig,
    ClusterState,
    Job,
    JobSpec,
    JobState,
    Limits,
    NodeStatus,
    Token,
)
from synapse_ha.core.queue_usage import queue_usage
from synapse_ha.core.scheduler import Plan, explain, why_pending
from synapse_ha.core.spec import SpecError
from synapse_ha.core.validation import Violation, ViolationCode
from synapse_ha.core.views import DesiredMember, desired_by_node
from synapse_ha.history.events import EventRing, EventsExpired
from synapse_ha.history.store import USAGE_KEYS, HistoryFilter, HistoryStore
from synapse_ha.rpc import convert
from synapse_ha.rpc import history as history_pb
from synapse_ha.rpc.admission import (
    Overloaded,
    PendingInFlight,
    ReadGate,
    StreamRefusal,
    StreamSlots,
    SubmitRate,
)
from synapse_ha.rpc.auth import (
    AUTHORIZATION_KEY,
    BEARER,
    AuthInterceptor,
    abort_refused,
    caller,
    method_of,
    new_token,
)
from synapse_ha.rpc.errors import LEADER_METADATA_KEY, Reason, abort, abort_invalid
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
audit = logging.getLogger("synapse_ha.audit")

# Signs a short-lived grant to read one member's log: (job id, subject, node id) →
# (grant, expires_at_ms). Set where the cluster has TLS (its key signs the grants).
GrantSigner = Callable[[str, str, str], tuple[str, int]]


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    replica_id: str
    raft: str
    grpc: str


class RaftStatusView(Protocol):
    @property
    def role(self) -> str: ...
    @property
    def term(self) -> int: ...
    @property
    def commit_index(self) -> int: ...
    @property
    def last_applied(self) -> int: ...
    @property
    def leader(self) -> str: ...
    @property
    def has_quorum(self) -> bool: ...


class Backend(Protocol):
    """What the servicers need from the replica (implemented by the Raft replica)."""

    def propose(self, command: cmd.Command) -> futures.Future[cmd.Result]: ...
    def snapshot(self) -> ClusterState: ...
    def reading(self) -> AbstractContextManager[ClusterState]: ...
    def cluster_config(self) -> ClusterConfig: ...
    def status(self) -> RaftStatusView: ...
    def is_leader(self) -> bool: ...
    def leader_address(self) -> str: ...


class MembershipControl(Protocol):
    """Membership changes, as the Raft replica offers them (raft/replica.py). Each
    returns the refusal, or a future that resolves once the change is committed."""

    def members(self) -> list[MemberView]: ...
    def add_member(
        self, replica_id: str, raft_address: str, grpc_address: str
    ) -> MembershipRefusal | futures.Future[None]: ...
    def remove_member(self, replica_id: str) -> MembershipRefusal | futures.Future[None]: ...


@dataclass(slots=True)
class ReplicaContext:
    """Everything the servicers share. ``serving`` says whether this replica is the leader
    and its term barrier has committed; ``clock_ms`` is wall-clock milliseconds.

    Reads are served from immutable snapshots (``backend.snapshot()``), never while
    holding the lock the log's applies need."""

    self_id: str
    replicas: Sequence[ReplicaAddress]
    backend: Backend
    liveness: Liveness
    serving: Callable[[], bool]
    clock_ms: Callable[[], int]
    write_timeout_s: float = 5.0
    # The leader's newest scheduling pass, which ExplainJob answers from.
    last_plan: Callable[[], Plan | None] = lambda: None
    # Rations heavy reads so they cannot starve Raft and heartbeats (rpc/admission.py).
    read_gate: ReadGate = field(default_factory=ReadGate)
    grant_signer: GrantSigner | None = None
    # Where handlers report the refusals they make themselves (another user's job, a
    # worker speaking for another node), to be logged and counted with the rest.
    auth: AuthInterceptor | None = None
    # Opens a channel to another replica (GetClusterStatus asks each one); with TLS, one
    # that presents this replica's certificate.
    peer_channel: Callable[[str], grpc.Channel] = grpc.insecure_channel
    # Online membership changes (AddReplica, RemoveReplica); None: not offered here.
    membership: MembershipControl | None = None
    # History and events: this replica's own copies; None when turned off.
    history: HistoryStore | None = None
    events: EventRing | None = None
    # Observability: where this replica serves /metrics and its dashboard;
    # reported in its ReplicaStatus ("" when it serves neither).
    metrics_url: str = ""
    dashboard_url: str = ""
    # Heartbeat streams: where this replica serves NodeStreamService ("": none).
    stream_address: str = ""
    # Per-identity limits (DESIGN §8): this replica's submit buckets and open streams,
    # and the submissions it has checked against the pending caps but not yet applied.
    submit_rate: SubmitRate = field(default_factory=SubmitRate)
    watch_slots: StreamSlots = field(default_factory=StreamSlots)
    pending_in_flight: PendingInFlight = field(default_factory=PendingInFlight)
    # Limits this replica's configuration file sets ([limits]): as leader it puts them
    # back, so SetLimits refuses to change them here.
    pinned_limits: frozenset[str] = frozenset()

    def by_raft(self, raft_address: str) -> ReplicaAddress | None:
        for r in self.replicas:
            if r.raft == raft_address:
                return r
        return None


# The reason for each error result of ``apply``; NOT_FOUND depends on what was looked up.
_RESULT_REASON = {
    cmd.ResultCode.INVALID: Reason.INVALID_FIELD,
    cmd.ResultCode.CONFLICT: Reason.CONFLICT,
    cmd.ResultCode.INTERNAL: Reason.INTERNAL,
}


class _Base:
    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx

    # ---------------------------------------------------------------- who

    def _refuse(
        self, context: grpc.ServicerContext, refusal: access.Refusal, identity: Identity
    ) -> NoReturn:
        method = method_of(context)
        if self.ctx.auth is not None:
            self.ctx.auth.refused(refusal, identity, method)
        abort_refused(context, refusal, identity, method)
        raise AssertionError("unreachable")

    def _may_manage(
        self, context: grpc.ServicerContext, identity: Identity, job_id: str, owner: str
    ) -> None:
        refusal = access.job_refusal(identity, job_id, owner)
        if refusal is not None:
            self._refuse(context, refusal, identity)

    def _as_node(self, context: grpc.ServicerContext, node_id: str) -> Identity:
        identity = caller(context)
        refusal = access.may_speak_for_node(identity, node_id)
        if refusal is not None:
            self._refuse(context, refusal, identity)
        return identity

    # ----------------------------------------------------------------- routing

    def _require_serving_leader(self, context: grpc.ServicerContext) -> None:
        require_serving_leader(self.ctx, context)

    def _read_mode(self, context: grpc.ServicerContext, allow_stale: bool) -> bool:
        """Check a read may be served here; return whether the answer is stale."""
        if self.ctx.serving():
            return False
        if allow_stale:
            return True
        self._require_serving_leader(context)
        return False

    @contextmanager
    def _heavy_read(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Run the body as a heavy read admitted by the replica's read gate, or abort
        with OVERLOADED."""
        admission = self.ctx.read_gate.admit()
        try:
            admission.__enter__()
        except Overloaded as exc:
            abort(context, Reason.OVERLOADED, f"{exc}; retry after a pause")
        try:
            yield
        finally:
            admission.__exit__(None, None, None)

    def _propose(self, context: grpc.ServicerContext, command: cmd.Command) -> cmd.Result:
        """Commit ``command`` and return its result; abort on any failure."""
        self._require_serving_leader(context)
        remaining = context.time_remaining()
        timeout = self.ctx.write_timeout_s
        if remaining is not None:
            timeout = max(0.0, min(timeout, remaining - 0.05))
        future = self.ctx.backend.propose(command)
        try:
            result = future.result(timeout=timeout)
        except futures.TimeoutError:
            abort(
                context,
                Reason.OUTCOME_UNKNOWN,
                "the outcome is unknown (not committed within the deadline); "
                "retrying with the same request is safe",
            )
        except ProposalError as exc:
            if exc.committed_unknown:
                abort(
                    context,
                    Reason.OUTCOME_UNKNOWN,
                    f"the outcome is unknown ({exc}); retrying with the same request is safe",
                )
            abort(context, Reason.NOT_COMMITTED, f"not committed: {exc}; retry")
        return result

    def _check(
        self,
        context: grpc.ServicerContext,
        result: cmd.Result,
        not_found: tuple[Reason, str, str] = (Reason.JOB_NOT_FOUND, "job_id", ""),
    ) -> cmd.Result:
        """Abort unless ``result`` is OK. ``not_found`` is the reason for a NOT_FOUND
        result, with the metadata key and value naming what was looked up."""
        if result.ok:
            return result
        if result.code is cmd.ResultCode.NOT_FOUND:
            reason, key, value = not_found
            abort(context, reason, result.message, {key: value})
        abort(context, _RESULT_REASON.get(result.code, Reason.INTERNAL), result.message)


def _audit(identity: Identity, method: str, target: str) -> None:
    """One line per accepted write: who did what to which."""
    audit.info("%s %s %s", identity, method, target)


def _invalid(context: grpc.ServicerContext, error: SpecError) -> NoReturn:
    abort_invalid(context, error.violations)


def _required(context: grpc.ServicerContext, field: str) -> NoReturn:
    abort_invalid(context, [Violation(ViolationCode.REQUIRED, field, "is required")])


# ListJobs pages: the default and the largest number of jobs in one answer.
DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000


def _presented_token(context: grpc.ServicerContext, state: ClusterState) -> Token | None:
    """The token the caller presented (the interceptor already proved it), or None when
    it presented none (a certificate, or an insecure server). A token the state does
    not hold (only ever the bootstrap token, before it commits) allows no more than a
    certificate."""
    for key, value in context.invocation_metadata():
        if key == AUTHORIZATION_KEY and isinstance(value, str) and value.startswith(BEARER):
            parts = access.split_token(value[len(BEARER) :].strip())
            token = state.tokens.get(parts[0]) if parts is not None else None
            return token if token is not None else _NO_GRANTS
    return None


# A token the state does not hold: it names no queues and allows nothing more.
_NO_GRANTS = Token("", "", Role.USER, "", 0, "")


def _refuse_limit(
    context: grpc.ServicerContext, identity: Identity, refusal: admission.LimitExceeded | None
) -> None:
    """Abort with LIMIT_EXCEEDED naming the limit and the figures, when there is one."""
    if refusal is None:
        return
    audit.info("%s refused by limits.%s (%d of %d)", identity, refusal.limit,
               refusal.actual, refusal.allowed)  # fmt: skip
    abort(
        context,
        Reason.LIMIT_EXCEEDED,
        refusal.message,
        {"limit": refusal.limit, "allowed": str(refusal.allowed), "actual": str(refusal.actual)},
    )


def _job_not_found(context: grpc.ServicerContext, job_id: str) -> NoReturn:
    abort(context, Reason.JOB_NOT_FOUND, f"no job {job_id!r}", {"job_id": job_id})


class SchedulerServicer(_Base, pb_grpc.SchedulerServiceServicer):
    # ------------------------------------------------------------------- writes

    def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        identity = caller(context)
        limits = self.ctx.backend.cluster_config().limits
        limited = admission.limited(identity)
        if limited:
            self._charge_submission(context, identity, limits)
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
        owner = identity.name
        request_id = admission.request_key(
            state, owner, request.request_id or f"srv-{uuid.uuid4().hex}"
        )
        existing = state.request_ids.get(request_id)
        if existing is not None:  # a retry: nothing new to admit
            return pb.SubmitJobResponse(job_id=existing, created=False)
        held = limited and self._hold_pending(context, identity, spec, limits)
        try:
            command = cmd.SubmitJob(
                spec=spec, request_id=request_id, now_ms=self.ctx.clock_ms(), owner=owner
            )
            result = self._check(context, self._propose(context, command))
        finally:
            if held:
                self.ctx.pending_in_flight.release(owner, spec.queue)
        if result.created:
            _audit(identity, "SubmitJob", result.job_id)
        return pb.SubmitJobResponse(job_id=result.job_id, created=result.created)

    def _charge_submission(
        self, context: grpc.ServicerContext, identity: Identity, limits: Limits
    ) -> None:
        """Abort with LIMIT_EXCEEDED when ``identity`` submits faster than its rate."""
        wait_s = self.ctx.submit_rate.take(str(identity), limits.submit_burst, limits.submit_per_s)
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
        self, context: grpc.ServicerContext, identity: Identity, spec: JobSpec, limits: Limits
    ) -> bool:
        """Count the submission against the pending caps until it is applied (abort with
        LIMIT_EXCEEDED when it would pass one); True once held. The state is read under
        the lock a release takes after its apply, so every other submission is counted
        once: in the state, or as held."""
        in_flight = self.ctx.pending_in_flight
        with in_flight.lock:
            state = self.ctx.backend.snapshot()
            counts = admission.pending_counts(state, identity.name, spec.queue)
            mine, queued = in_flight.counts(identity.name, spec.queue)
            total = admission.PendingCounts(counts.owner + mine, counts.queue + queued)
            refusal = admission.pending_refusal(limits, total, identity.name, spec.queue)
            if refusal is None:
                in_flight.hold(identity.name, spec.queue)
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
        violations = validation.check_job_queue(spec, state.queues, classes)
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

    def CancelJob(
        self, request: pb.CancelJobRequest, context: grpc.ServicerContext
    ) -> pb.CancelJobResponse:
        if not request.job_id:
            _required(context, "job_id")
        identity = caller(context)
        self._require_serving_leader(context)
        known = self.ctx.backend.snapshot().jobs.get(request.job_id)
        if known is None:
            _job_not_found(context, request.job_id)
        self._may_manage(context, identity, request.job_id, known.owner)
        command = cmd.CancelJob(
            job_id=request.job_id,
            reason=request.reason[:1024] or "cancelled by user",
            now_ms=self.ctx.clock_ms(),
            actor=str(identity),
        )
        result = self._check(
            context,
            self._propose(context, command),
            (Reason.JOB_NOT_FOUND, "job_id", request.job_id),
        )
        _audit(identity, "CancelJob", request.job_id)
        job = self.ctx.backend.snapshot().jobs.get(request.job_id)
        job_state = str(job.state) if job is not None else str(JobState.CANCELLED)
        return pb.CancelJobResponse(state=job_state, message=result.message)

    def _set_node_status(
        self, request: pb.NodeStatusRequest, context: grpc.ServicerContext, status: NodeStatus
    ) -> pb.NodeStatusResponse:
        if not request.node_id:
            _required(context, "node_id")
        identity = caller(context)
        command = cmd.SetNodeStatus(
            node_id=request.node_id,
            status=status,
            reason=request.reason[:1024],
            now_ms=self.ctx.clock_ms(),
            actor=str(identity),
        )
        self._check(
            context,
            self._propose(context, command),
            (Reason.NODE_NOT_FOUND, "node_id", request.node_id),
        )
        _audit(identity, f"SetNodeStatus({status})", request.node_id)
        node = self.ctx.backend.snapshot().nodes.get(request.node_id)
        return pb.NodeStatusResponse(status=str(node.status) if node else "")

    def CordonNode(
        self, request: pb.NodeStatusRequest, context: grpc.ServicerContext
    ) -> pb.NodeStatusResponse:
        return self._set_node_status(request, context, NodeStatus.CORDONED)

    def UncordonNode(
        self, request: pb.NodeStatusRequest, context: grpc.ServicerContext
    ) -> pb.NodeStatusResponse:
        return self._set_node_status(request, context, NodeStatus.READY)

    def DrainNode(
        self, request: pb.NodeStatusRequest, context: grpc.ServicerContext
    ) -> pb.NodeStatusResponse:
        return self._set_node_status(request, context, NodeStatus.DRAINING)

    # -------------------------------------------------------------------- reads

    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.GetJobResponse:
        if not request.job_id:
            _required(context, "job_id")
        stale = self._read_mode(context, request.allow_stale)
        job = self.ctx.backend.snapshot().jobs.get(request.job_id)
        if job is not None:
            redacted = not access.may_manage_job(caller(context), job.owner)
            return pb.GetJobResponse(job=convert.job_to_proto(job, redacted), stale=stale)
        _job_not_found(context, request.job_id)

    def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.ServicerContext
    ) -> pb.ListJobsResponse:
        wanted_states = set()
        for i, name in enumerate(request.states):
            try:
                wanted_states.add(JobState(name.upper()))
            except ValueError:
                allowed = ", ".join(s.value for s in JobState)
                _invalid(context, SpecError(f"states[{i}]", f"{name!r} is not one of {allowed}"))
        if request.limit < 0:
            _invalid(context, SpecError("limit", "must not be negative"))
        after_seq = 0
        if request.page_token:
            if not request.page_token.isdigit():
                _invalid(
                    context,
                    SpecError("page_token", "is not a next_page_token a replica returned"),
                )
            after_seq = int(request.page_token)
        page_size = min(request.limit or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        stale = self._read_mode(context, request.allow_stale)
        identity = caller(context)
        with self._heavy_read(context):
            state = self.ctx.backend.snapshot()
            page: list[Job] = []
            more = False
            for job in sorted(state.jobs.values(), key=lambda j: j.seq):
                if job.seq <= after_seq:
                    continue
                if wanted_states and job.state not in wanted_states:
                    continue
                if request.name and job.spec.name != request.name:
                    continue
                if request.node_id and not (
                    job.attempt is not None
                    and any(m.node_id == request.node_id for m in job.attempt.members)
                ):
                    continue
                if len(page) == page_size:
                    more = True
                    break
                page.append(job)
            out = [
                convert.job_to_proto(job, not access.may_manage_job(identity, job.owner))
                for job in page
            ]
        next_token = str(page[-1].seq) if more else ""
        return pb.ListJobsResponse(jobs=out, stale=stale, next_page_token=next_token)

    def ExplainJob(
        self, request: pb.ExplainJobRequest, context: grpc.ServicerContext
    ) -> pb.ExplainJobResponse:
        if not request.job_id:
            _required(context, "job_id")
        stale = self._read_mode(context, request.allow_stale)
        now = self.ctx.clock_ms()
        state = self.ctx.backend.snapshot()
        job = state.jobs.get(request.job_id)
        if job is None:
            _job_not_found(context, request.job_id)
        self._may_manage(context, caller(context), job.job_id, job.owner)
        last_plan = None if stale else self.ctx.last_plan()
        with self._heavy_read(context):
            waiting = why_pending(state, job.job_id, now, last_plan)
            explanation = explain(state, job.job_id, now, last_plan)
        return pb.ExplainJobResponse(
            job_id=job.job_id,
            state=str(job.state),
            explanation=explanation,
            stale=stale,
            reason_code=str((waiting or job.reason).code),
        )

    def ListNodes(
        self, request: pb.ListNodesRequest, context: grpc.ServicerContext
    ) -> pb.ListNodesResponse:
        stale = self._read_mode(context, request.allow_stale)
        now = self.ctx.clock_ms()
        out = []
        state = self.ctx.backend.snapshot()
        with self._heavy_read(context):
            for node_id in sorted(state.nodes):
                heard = None if stale else self.ctx.liveness.heard_since_election(node_id)
                age = -1 if heard is None else max(0, now - heard)
                out.append(convert.node_to_proto(state.nodes[node_id], age))
        return pb.ListNodesResponse(nodes=out, stale=stale)

    def GetClusterStatus(
        self, request: pb.GetClusterStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetClusterStatusResponse:
        ctx = self.ctx
        own = self._local_status()
        replicas = [own]
        if not request.local_only:
            replicas = [
                own if r.replica_id == ctx.self_id else _ask_replica(r, ctx.peer_channel)
                for r in ctx.replicas
            ]
        leader = ctx.by_raft(ctx.backend.leader_address())
        state = ctx.backend.snapshot()
        jobs = state.jobs.values()
        by_state = Counter(map(attrgetter("state"), jobs))  # one pass, in C
        return pb.GetClusterStatusResponse(
            answered_by=ctx.self_id,
            leader_id=leader.replica_id if leader else "",
            leader_address=leader.grpc if leader else "",
            replicas=replicas,
            nodes=len(state.nodes),
            jobs=len(jobs),
            pending_jobs=by_state[JobState.PENDING],
            running_jobs=sum(n for s, n in by_state.items() if s.holds_resources),
        )

    def GetReplicaState(
        self, request: pb.GetReplicaStateRequest, context: grpc.ServicerContext
    ) -> pb.GetReplicaStateResponse:
        """This replica's own state, never redirected: a snapshot taken while applies are
        held off (the state lock), with the applied index of that moment, so the bytes
        are one consistent state. It is encoded after the lock is released."""
        backend = self.ctx.backend
        with backend.reading():
            state = backend.snapshot()
            last_applied = backend.status().last_applied
        with self._heavy_read(context):
            encoded = encode_state(state)
        return pb.GetReplicaStateResponse(
            replica_id=self.ctx.self_id,
            last_applied=last_applied,
            encoded_state=encoded,
            state_sha256=hashlib.sha256(encoded).hexdigest(),
        )

    # ------------------------------------------------------------------- tokens

    def CreateToken(
        self, request: pb.CreateTokenRequest, context: grpc.ServicerContext
    ) -> pb.CreateTokenResponse:
        identity = caller(context)
        try:
            role: object = Role(request.role or Role.USER)
        except ValueError:
            role = request.role
        queues = list(request.queues)
        classes = tuple(request.priority_classes)
        violations = validation.check_token("", request.user, role, queues, "0" * 64, 0)
        violations += admission.check_priority_allowance(classes, request.max_priority)
        if request.ttl_ms < 0:
            violations.append(validation.invalid("ttl_ms", "must be 0 (never) or positive"))
        if violations:
            abort_invalid(context, violations)
        assert isinstance(role, Role)
        text, command = new_token(
            request.user,
            role,
            queues,
            request.ttl_ms,
            self.ctx.clock_ms(),
            str(identity),
            classes,
            request.max_priority,
        )
        self._check(context, self._propose(context, command))
        _audit(identity, "CreateToken", f"{command.token_id} ({request.user}, role {role})")
        return pb.CreateTokenResponse(
            token=text, token_id=command.token_id, expires_at_ms=command.expires_at_ms
        )

    def ListTokens(
        self, request: pb.ListTokensRequest, context: grpc.ServicerContext
    ) -> pb.ListTokensResponse:
        self._read_mode(context, allow_stale=False)
        tokens = self.ctx.backend.snapshot().tokens.values()
        ordered = sorted(tokens, key=lambda t: (t.created_at_ms, t.token_id))
        return pb.ListTokensResponse(tokens=[convert.token_to_proto(t) for t in ordered])

    def RevokeToken(
        self, request: pb.RevokeTokenRequest, context: grpc.ServicerContext
    ) -> pb.RevokeTokenResponse:
        if not request.token_id:
            _required(context, "token_id")
        identity = caller(context)
        command = cmd.RevokeToken(
            token_id=request.token_id, now_ms=self.ctx.clock_ms(), actor=str(identity)
        )
        self._check(
            context,
            self._propose(context, command),
            (Reason.TOKEN_NOT_FOUND, "token_id", request.token_id),
        )
        _audit(identity, "RevokeToken", request.token_id)
        token = self.ctx.backend.snapshot().tokens.get(request.token_id)
        return pb.RevokeTokenResponse(revoked_at_ms=token.revoked_at_ms if token else 0)

    # --------------------------------------------------------------------- logs

    def GrantLogAccess(
        self, request: pb.GrantLogAccessRequest, context: grpc.ServicerContext
    ) -> pb.GrantLogAccessResponse:
        """A signed grant to read one member's log on its worker, for whoever may manage
        the job. ``attempt`` 0 means the current (or last) attempt."""
        if not request.job_id:
            _required(context, "job_id")
        identity = caller(context)
        self._read_mode(context, allow_stale=False)
        state = self.ctx.backend.snapshot()
        job = state.jobs.get(request.job_id)
        if job is None:
            _job_not_found(context, request.job_id)
        self._may_manage(context, identity, job.job_id, job.owner)
        attempt = job.attempt
        if attempt is None or request.attempt not in (0, attempt.number):
            _invalid(context, SpecError("attempt", "names no attempt of this job that has run"))
        if not 0 <= request.rank < len(attempt.members):
            _invalid(
                context, SpecError("rank", f"must be between 0 and {len(attempt.members) - 1}")
            )
        signer = self.ctx.grant_signer
        if signer is None:
            abort(
                context,
                Reason.NEEDS_TLS,
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

    # ------------------------------------------------- membership and backup

    def AddReplica(
        self, request: pb.AddReplicaRequest, context: grpc.ServicerContext
    ) -> pb.MembershipResponse:
        """Add a replica (admin, on the serving leader); answers once the membership
        entry is committed. The new replica catches up afterwards."""
        violations = [
            Violation(ViolationCode.REQUIRED, name, "is required")
            for name in ("replica_id", "raft_address", "grpc_address")
            if not getattr(request, name)
        ]
        for name in ("raft_address", "grpc_address"):
            value = getattr(request, name)
            host, sep, port = value.rpartition(":")
            if value and (not sep or not host or not port.isdigit() or not 0 < int(port) < 65536):
                violations.append(validation.invalid(name, "must be HOST:PORT"))
        if violations:
            abort_invalid(context, violations)
        control = self._membership(context)
        identity = caller(context)
        outcome = control.add_member(request.replica_id, request.raft_address, request.grpc_address)
        self._await_change(context, outcome, request.replica_id)
        _audit(identity, "AddReplica", f"{request.replica_id} ({request.raft_address})")
        return self._members_response(control)

    def RemoveReplica(
        self, request: pb.RemoveReplicaRequest, context: grpc.ServicerContext
    ) -> pb.MembershipResponse:
        """Remove a replica (admin, on the serving leader); answers once committed."""
        if not request.replica_id:
            _required(context, "replica_id")
        control = self._membership(context)
        identity = caller(context)
        outcome = control.remove_member(request.replica_id)
        self._await_change(context, outcome, request.replica_id)
        _audit(identity, "RemoveReplica", request.replica_id)
        return self._members_response(control)

    def SaveSnapshot(
        self, request: pb.SaveSnapshotRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.SnapshotChunk]:
        """The serving leader's state as of one applied index, in chunks. The state is
        read while applies are held off, with its index and term; it is encoded after
        the lock is released (a copy-on-write snapshot)."""
        self._require_serving_leader(context)
        backend = self.ctx.backend
        with backend.reading():
            state = backend.snapshot()
            status = backend.status()
            raft_index, raft_term = status.last_applied, status.term
        with self._heavy_read(context):
            encoded = encode_state(state)
        digest = hashlib.sha256(encoded).hexdigest()
        _audit(caller(context), "SaveSnapshot", f"index {raft_index}, {len(encoded)} bytes")
        for offset in range(0, max(len(encoded), 1), SNAPSHOT_CHUNK_BYTES):
            data = encoded[offset : offset + SNAPSHOT_CHUNK_BYTES]
            if offset == 0:
                yield pb.SnapshotChunk(
                    data=data,
                    raft_index=raft_index,
                    raft_term=raft_term,
                    replica_id=self.ctx.self_id,
                    total_bytes=len(encoded),
                    sha256=digest,
                )
            else:
                yield pb.SnapshotChunk(data=data)

    def _membership(self, context: grpc.ServicerContext) -> MembershipControl:
        self._require_serving_leader(context)
        control = self.ctx.membership
        if control is None:
            abort(context, Reason.INTERNAL, "this replica offers no membership changes")
        return control

    def _await_change(
        self,
        context: grpc.ServicerContext,
        outcome: MembershipRefusal | futures.Future[None],
        replica_id: str,
    ) -> None:
        if isinstance(outcome, MembershipRefusal):
            reason = _MEMBERSHIP_REASON[outcome.code]
            abort(context, reason, outcome.message, {"replica_id": replica_id})
        remaining = context.time_remaining()
        timeout = self.ctx.write_timeout_s
        if remaining is not None:
            timeout = max(0.0, min(timeout, remaining - 0.05))
        try:
            outcome.result(timeout=timeout)
        except futures.TimeoutError:
            abort(
                context,
                Reason.OUTCOME_UNKNOWN,
                "the membership change was not confirmed within the deadline; read the "
                "members with `synctl cluster` before retrying",
            )
        except ProposalError as exc:
            if exc.committed_unknown:
                abort(context, Reason.OUTCOME_UNKNOWN, f"the outcome is unknown ({exc})")
            abort(context, Reason.NOT_COMMITTED, f"not committed: {exc}; retry")

    @staticmethod
    def _members_response(control: MembershipControl) -> pb.MembershipResponse:
        return pb.MembershipResponse(
            members=[
                pb.ReplicaMember(
                    replica_id=m.replica_id, raft_address=m.raft, grpc_address=m.grpc, live=m.live
                )
                for m in control.members()
            ]
        )

    # ------------------------------------------------ history and events

    def _history_owner(self, context: grpc.ServicerContext, asked: str) -> str:
        """The owner a history read is limited to: ``asked`` for those who see every
        job's history; a user's own name (asking for another user is refused)."""
        identity = caller(context)
        if access.sees_all_history(identity):
            return asked
        if asked and asked != identity.name:
            self._refuse(
                context,
                access.Refusal(
                    access.RefusalCode.PERMISSION_DENIED,
                    f"{access.describe_caller(identity)} may read only its own history, "
                    f"not user {asked}'s; it needs role operator or admin",
                ),
                identity,
            )
        return identity.name

    def _history_store(self, context: grpc.ServicerContext) -> HistoryStore:
        if self.ctx.history is None:
            abort(context, Reason.CONFLICT, "history is turned off on this replica")
        return self.ctx.history

    def ListHistory(
        self, request: pb.ListHistoryRequest, context: grpc.ServicerContext
    ) -> pb.ListHistoryResponse:
        """Finished jobs from this replica's history, newest first."""
        violations = [
            validation.invalid(name, "must be 0 or positive")
            for name in ("since_ms", "until_ms", "limit")
            if getattr(request, name) < 0
        ]
        if violations:
            abort_invalid(context, violations)
        owner = self._history_owner(context, request.user)
        store = self._history_store(context)
        wanted = HistoryFilter(
            owner=owner,
            queue=request.queue,
            node_id=request.node_id,
            since_ms=request.since_ms,
            until_ms=request.until_ms,
            limit=request.limit or 1000,
        )
        with self._heavy_read(context):
            jobs = store.jobs(wanted)
        return pb.ListHistoryResponse(
            jobs=[history_pb.history_job_to_proto(j) for j in jobs], answered_by=self.ctx.self_id
        )

    def GetUsage(
        self, request: pb.GetUsageRequest, context: grpc.ServicerContext
    ) -> pb.GetUsageResponse:
        """GPU-milliseconds per user or queue and UTC day, from this replica's history."""
        until = request.until_ms or self.ctx.clock_ms()
        violations = []
        if request.by not in USAGE_KEYS:
            violations.append(validation.invalid("by", f"must be one of {', '.join(USAGE_KEYS)}"))
        if request.since_ms <= 0:
            violations.append(validation.invalid("since_ms", "must be a positive time"))
        elif until <= request.since_ms:
            violations.append(validation.invalid("until_ms", "must be later than since_ms"))
        if violations:
            abort_invalid(context, violations)
        owner = self._history_owner(context, "")
        store = self._history_store(context)
        with self._heavy_read(context):
            rows = store.usage(request.by, request.since_ms, until, owner=owner)
        return pb.GetUsageResponse(
            rows=[history_pb.usage_row_to_proto(r) for r in rows],
            by=request.by,
            since_ms=request.since_ms,
            until_ms=until,
            answered_by=self.ctx.self_id,
        )

    def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Event]:
        """Events after ``since_index`` from this replica's ring; with ``follow``, new ones
        as they are applied until the client goes away. Each open stream holds a thread:
        a user or operator may hold ``limits.watch_streams_per_identity`` of them on a
        replica, all of them together ``limits.watch_streams_total``; admins and replicas
        have slots of their own (:class:`StreamSlots`), so users cannot lock them out.
        Text a job controls is withheld from callers who may not manage the job."""
        if request.since_index < 0:
            abort_invalid(context, [validation.invalid("since_index", "must be 0 or positive")])
        ring = self.ctx.events
        if ring is None:
            abort(context, Reason.CONFLICT, "events are turned off on this replica")
        identity = caller(context)
        limits = self.ctx.backend.cluster_config().limits
        limited = admission.limited(identity)
        who = str(identity)
        refusal = self.ctx.watch_slots.acquire(
            who, limited, limits.watch_streams_per_identity, limits.watch_streams_total
        )
        if refusal is not None:
            _refuse_limit(context, identity, _stream_limit(identity, refusal))
        try:
            yield from _stream_events(ring, request, context, identity)
        finally:
            self.ctx.watch_slots.release(who, limited)

    # ------------------------------------------------------------ per-identity limits

    def GetLimits(
        self, request: pb.GetLimitsRequest, context: grpc.ServicerContext
    ) -> pb.GetLimitsResponse:
        limits = self.ctx.backend.cluster_config().limits
        return pb.GetLimitsResponse(limits=convert.limits_to_proto(limits))

    def SetLimits(
        self, request: pb.SetLimitsRequest, context: grpc.ServicerContext
    ) -> pb.GetLimitsResponse:
        """Replicate the limits with the named ones changed (admins only). A limit this
        leader's configuration file sets is refused: the leader would put it back."""
        identity = caller(context)
        self._require_serving_leader(context)
        config = self.ctx.backend.cluster_config()
        try:
            limits = convert.limits_with(config.limits, request.values)
        except SpecError as exc:
            _invalid(context, exc)
        pinned = sorted({v.name for v in request.values} & self.ctx.pinned_limits)
        if pinned:
            abort(
                context,
                Reason.CONFLICT,
                f"limits {', '.join(pinned)} are set by the leader's configuration file "
                f"([limits] in its TOML), which it puts back: change them there",
            )
        violations = admission.check_limits(limits)
        if violations:
            abort_invalid(context, violations)
        wanted = dataclasses.replace(config, limits=limits)
        command = cmd.Configure(config=wanted, now_ms=self.ctx.clock_ms(), actor=str(identity))
        self._check(context, self._propose(context, command))
        changed = ", ".join(f"{v.name}={v.value}" for v in request.values)
        _audit(identity, "SetLimits", changed or "nothing")
        limits = self.ctx.backend.cluster_config().limits
        return pb.GetLimitsResponse(limits=convert.limits_to_proto(limits))

    # ------------------------------------------------- queues and preemption

    def ListQueues(
        self, request: pb.ListQueuesRequest, context: grpc.ServicerContext
    ) -> pb.ListQueuesResponse:
        """Every queue with its settings and usage (:mod:`synapse_ha.core.queue_usage`),
        the cluster's priority classes and preemption mode."""
        stale = self._read_mode(context, request.allow_stale)
        state = self.ctx.backend.snapshot()
        with self._heavy_read(context):
            usage = queue_usage(state)
        return pb.ListQueuesResponse(
            queues=[
                pb.QueueStatus(
                    queue=convert.queue_to_proto(state.queues[name]),
                    usage=convert.queue_usage_to_proto(usage[name]),
                )
                for name in sorted(state.queues)
            ],
            stale=stale,
            priority_classes=[
                convert.priority_class_to_proto(c) for c in state.config.priority_classes
            ],
            preemption=str(state.config.preemption),
        )

    def SetQueue(
        self, request: pb.SetQueueRequest, context: grpc.ServicerContext
    ) -> pb.SetQueueResponse:
        if not request.HasField("queue"):
            _required(context, "queue")
        identity = caller(context)
        queue = convert.queue_from_proto(request.queue)
        self._require_serving_leader(context)
        state = self.ctx.backend.snapshot()
        violations = validation.check_queue(queue, state.config.priority_classes)
        if violations:
            abort_invalid(context, violations)
        existed = queue.name in state.queues
        command = cmd.SetQueue(queue=queue, now_ms=self.ctx.clock_ms(), actor=str(identity))
        self._check(context, self._propose(context, command))
        _audit(identity, "SetQueue", queue.name)
        return pb.SetQueueResponse(created=not existed)

    def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: grpc.ServicerContext
    ) -> pb.DeleteQueueResponse:
        if not request.name:
            _required(context, "name")
        identity = caller(context)
        command = cmd.DeleteQueue(
            name=request.name, now_ms=self.ctx.clock_ms(), actor=str(identity)
        )
        self._check(
            context,
            self._propose(context, command),
            (Reason.QUEUE_NOT_FOUND, "queue", request.name),
        )
        _audit(identity, "DeleteQueue", request.name)
        return pb.DeleteQueueResponse()

    def _local_status(self) -> pb.ReplicaStatus:
        ctx = self.ctx
        raft = ctx.backend.status()
        me = next(r for r in ctx.replicas if r.replica_id == ctx.self_id)
        leader = ctx.by_raft(raft.leader)
        healthy = raft.has_quorum and leader is not None
        error = ""
        if not raft.has_quorum:
            error = "cannot reach a majority of replicas"
        elif leader is None:
            error = "no leader known"
        return pb.ReplicaStatus(
            replica_id=me.replica_id,
            raft_address=me.raft,
            grpc_address=me.grpc,
            role=raft.role,
            term=raft.term,
            commit_index=raft.commit_index,
            last_applied=raft.last_applied,
            leader_id=leader.replica_id if leader else "",
            healthy=healthy,
            error=error,
            format_version=max(READABLE_VERSIONS),
            metrics_url=ctx.metrics_url,
            dashboard_url=ctx.dashboard_url,
        )


# Membership and backup: the gRPC reason of each refusal, and the size of one
# SaveSnapshot chunk (well under gRPC's 4 MB default message limit).
_MEMBERSHIP_REASON = {
    MembershipCode.CHANGE_IN_FLIGHT: Reason.CHANGE_IN_FLIGHT,
    MembershipCode.WOULD_LOSE_QUORUM: Reason.WOULD_LOSE_QUORUM,
    MembershipCode.REPLICA_EXISTS: Reason.REPLICA_EXISTS,
    MembershipCode.REPLICA_NOT_FOUND: Reason.REPLICA_NOT_FOUND,
    MembershipCode.LAST_REPLICA: Reason.LAST_REPLICA,
    MembershipCode.IS_LEADER: Reason.LEADER_STEPPING_DOWN,
}
SNAPSHOT_CHUNK_BYTES = 1 << 20


def _stream_limit(identity: Identity, refusal: StreamRefusal) -> admission.LimitExceeded:
    who = access.describe_caller(identity)
    if refusal.limit == "unlimited_streams":
        message = (
            f"{refusal.actual} event streams of admins and replicas are open on this replica, "
            "all it has; close one, or watch another replica"
        )
        return admission.LimitExceeded(
            admission.LimitName.WATCH_STREAMS_TOTAL, refusal.allowed, refusal.actual, message
        )
    name = admission.LimitName(refusal.limit)
    if name is admission.LimitName.WATCH_STREAMS_PER_IDENTITY:
        message = (
            f"{who} has {refusal.actual} event streams open on this replica; "
            f"limits.watch_streams_per_identity allows {refusal.allowed}: close one first"
        )
    else:
        message = (
            f"{refusal.actual} event streams of users are open on this replica; "
            f"limits.watch_streams_total allows {refusal.allowed}: retry after a pause, or "
            "watch another replica"
        )
    return admission.LimitExceeded(name, refusal.allowed, refusal.actual, message)


def _stream_events(
    ring: EventRing,
    request: pb.WatchEventsRequest,
    context: grpc.ServicerContext,
    viewer: Identity,
) -> Iterator[pb.Event]:
    since = request.since_index
    end = None if request.follow else ring.newest_index
    while context.is_active():
        try:
            events = ring.wait_after(since, timeout_s=0.5) if end is None else ring.after(since)
        except EventsExpired as exc:
            abort(
                context,
                Reason.EVENTS_EXPIRED,
                str(exc),
                {"oldest_index": str(exc.complete_after), "since_index": str(exc.since)},
            )
        for event in events:
            if end is not None and event.index > end:
                return
            redacted = bool(event.job_id) and not access.may_manage_job(viewer, event.owner)
            yield history_pb.event_to_proto(event, redacted)
            since = event.index
        if end is not None and (not events or since >= end):
            return


def _ask_replica(
    replica: ReplicaAddress, open_channel: Callable[[str], grpc.Channel]
) -> pb.ReplicaStatus:
    try:
        with open_channel(replica.grpc) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
            answer = stub.GetClusterStatus(pb.GetClusterStatusRequest(local_only=True), timeout=0.5)
        if answer.replicas:
            status: pb.ReplicaStatus = answer.replicas[0]
            return status
        raise RuntimeError("empty answer")
    except (grpc.RpcError, RuntimeError) as exc:
        detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
        return pb.ReplicaStatus(
            replica_id=replica.replica_id,
            raft_address=replica.raft,
            grpc_address=replica.grpc,
            role="unreachable",
            healthy=False,
            error=str(detail),
        )


class NodeAgentServicer(_Base, pb_grpc.NodeAgentServiceServicer):
    """Register and Heartbeat, for synapse-worker agents. Leader only."""

    def __init__(self, ctx: ReplicaContext) -> None:
        super().__init__(ctx)
        self._desired_lock = threading.Lock()
        self._desired_version = -1
        self._desired: dict[str, list[DesiredMember]] = {}

    def RegisterNode(
        self, request: pb.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> pb.RegisterNodeResponse:
        info = convert.node_info_from_proto(request)
        self._as_node(context, info.node_id)
        violations = validation.check_node_info(info)
        if violations:
            abort_invalid(context, violations)
        now = self.ctx.clock_ms()
        self._check(
            context,
            self._propose(context, cmd.RegisterNode(info=info, now_ms=now)),
            (Reason.NODE_NOT_FOUND, "node_id", info.node_id),
        )
        self.ctx.liveness.heard(info.node_id, now)
        state = self.ctx.backend.snapshot()
        timeouts = state.config.timeouts
        node = state.nodes.get(info.node_id)
        return pb.RegisterNodeResponse(
            status=str(node.status) if node else "",
            heartbeat_interval_ms=timeouts.heartbeat_interval_ms,
            lease_ttl_ms=timeouts.lease_ttl_ms,
            stream_address=self.ctx.stream_address,
        )

    def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatResponse:
        if not request.node_id:
            _required(context, "node_id")
        self._as_node(context, request.node_id)
        try:
            events = convert.member_events_from_proto(list(request.reports))
        except SpecError as exc:
            _invalid(context, exc)
        self._require_serving_leader(context)
        now = self.ctx.clock_ms()
        if request.node_id not in self.ctx.backend.snapshot().nodes:
            abort(
                context,
                Reason.NODE_NOT_FOUND,
                f"node {request.node_id!r} is not registered; call RegisterNode",
                {"node_id": request.node_id},
            )
        self.ctx.liveness.heard(request.node_id, now)
        acked = 0
        if events:
            command = cmd.ReportMembers(
                node_id=request.node_id,
                events=events,
                jitter_seed=uuid.uuid4().int & ((1 << 63) - 1),
                now_ms=now,
            )
            self._check(
                context,
                self._propose(context, command),
                (Reason.NODE_NOT_FOUND, "node_id", request.node_id),
            )
            acked = len(events)
        term = self.ctx.backend.status().term
        state = self.ctx.backend.snapshot()
        desired = self._desired_for(state, request.node_id)
        node = state.nodes.get(request.node_id)
        timeouts = state.config.timeouts
        node_status = str(node.status) if node else str(NodeStatus.DEAD)
        return pb.HeartbeatResponse(
            desired=[_desired_to_proto(state, d, now) for d in desired],
            lease_ttl_ms=timeouts.lease_ttl_ms,
            heartbeat_interval_ms=timeouts.heartbeat_interval_ms,
            acked_reports=acked,
            node_status=node_status,
            leader_term=term,
        )

    def _desired_for(self, state: ClusterState, node_id: str) -> list[DesiredMember]:
        """Desired members, computed once per snapshot version and shared by heartbeats
        (outside the apply lock: ``state`` is a snapshot)."""
        with self._desired_lock:
            # A heartbeat holding an older snapshot than another's gets the newer answer.
            if self._desired_version < state.applied_commands:
                self._desired = desired_by_node(state)
                self._desired_version = state.applied_commands
            return self._desired.get(node_id, [])


def _desired_to_proto(state: ClusterState, d: DesiredMember, now_ms: int) -> pb.DesiredMember:
    """A desired member, with the grace left before SIGKILL when its gang is being
    preempted (the attempt's deadline is the leader's clock; the worker gets a duration)."""
    msg = convert.desired_to_proto(d)
    job = state.jobs.get(d.job_id)
    attempt = job.attempt if job is not None else None
    if attempt is not None and attempt.fencing_token == d.fencing_token:
        convert.preemption_to_desired(msg, attempt, now_ms)
    return msg


def require_serving_leader(ctx: ReplicaContext, context: grpc.ServicerContext) -> None:
    """Return when this replica is the serving leader; otherwise end the call with
    where to go: NOT_LEADER (the leader's id and address), LEADER_NOT_READY or
    NO_LEADER."""
    if ctx.serving():
        return
    if ctx.backend.is_leader():
        abort(
            context,
            Reason.LEADER_NOT_READY,
            "this replica was just elected leader and is committing its barrier; retry",
            {"leader_id": ctx.self_id},
        )
    leader = ctx.by_raft(ctx.backend.leader_address())
    if leader is None or leader.replica_id == ctx.self_id:
        abort(context, Reason.NO_LEADER, "no leader is elected; retry shortly")
    abort(
        context,
        Reason.NOT_LEADER,
        f"not the leader; the leader is {leader.replica_id} at {leader.grpc}",
        {"leader_id": leader.replica_id, "leader_address": leader.grpc},
        trailing=((LEADER_METADATA_KEY, leader.grpc),),
    )


def build_server(
    ctx: ReplicaContext,
    address: str,
    max_workers: int = 128,
    auth: AuthInterceptor | None = None,
    add_port: Callable[[grpc.Server, str], int] | None = None,
) -> grpc.Server:
    """A gRPC server with both services bound to ``address`` (not started).

    ``auth`` checks every call (:class:`~synapse_ha.rpc.auth.AuthInterceptor`); without
    one the server runs in insecure mode, every caller the anonymous admin, and says so
    in a warning. It is also set as ``ctx.auth``, where handlers report their refusals.
    ``add_port`` binds the address (``Transport.add_port``: mutual TLS); plaintext
    without it."""
    if auth is None:
        log.warning(
            "the gRPC server at %s checks no credentials: every caller is an admin", address
        )
        auth = AuthInterceptor.without_credentials()
    ctx.auth = auth
    # A token this replica cannot verify may be one it has not applied yet: only the
    # serving leader's answer is final, elsewhere the caller is sent there.
    auth.unverified_token = lambda context: require_serving_leader(ctx, context)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=[auth],
        options=[("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(ctx), server)  # type: ignore[no-untyped-call]
    pb_grpc.add_NodeAgentServiceServicer_to_server(NodeAgentServicer(ctx), server)  # type: ignore[no-untyped-call]
    port = add_port(server, address) if add_port is not None else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC address {address}")
    return server
