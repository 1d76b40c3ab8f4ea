"""What every service of a replica shares: the replica's context (its backend, peers,
limits and stores), the base of every servicer (who is calling, routing to the serving
leader, proposing and waiting for the commit) and the helpers that end a call."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from concurrent import futures
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

import grpc
from google.protobuf.message import Message

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import Identity, Role
from synapse_ha.core.membership import MembershipRefusal, MemberView
from synapse_ha.core.model import ClusterState, Token
from synapse_ha.core.scheduler import Plan
from synapse_ha.core.spec.document import SpecError
from synapse_ha.core.spec.validation import Violation, ViolationCode
from synapse_ha.history.events import EventRing
from synapse_ha.history.store import HistoryStore
from synapse_ha.observe.state_metrics import RaftFigures
from synapse_ha.rpc.auth import AUTHORIZATION_KEY, BEARER, AuthInterceptor, caller, method_of
from synapse_ha.rpc.errors import ErrorReason, abort, abort_invalid, refusal_status
from synapse_ha.rpc.load_gates import Overloaded, ReadGate, StreamSlots
from synapse_ha.rpc.relay_table import RelayTable
from synapse_ha.rpc.server.job_messages import JobMessages, JobOrder
from synapse_ha.service import commit
from synapse_ha.service.limits import PendingInFlight, SubmitRate
from synapse_ha.service.refusal import Refusal, denied

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


class HeardFrom(Protocol):
    """Where heartbeats are recorded and read back (the leader loop's liveness table)."""

    def heard(self, node_id: str, now_ms: int) -> None: ...

    def heard_since_election(self, node_id: str) -> int | None: ...


class PaceSink(Protocol):
    """Where workers' member paces go (the leader's slow-node collector)."""

    def note(self, node_id: str, paces: Iterable[PaceReport], now_ms: int) -> None: ...


class RaftStatusView(RaftFigures, Protocol):
    """The Raft figures the metrics report, and the leader's Raft address."""

    @property
    def leader(self) -> str: ...


class Backend(Protocol):
    """What the servicers need from the replica (implemented by the Raft replica)."""

    def propose(self, command: cmd.Command) -> futures.Future[cmd.Result]: ...
    def snapshot(self) -> ClusterState: ...
    def reading(self) -> AbstractContextManager[ClusterState]: ...
    def cluster_config(self) -> ClusterConfig: ...
    def status(self) -> RaftStatusView: ...
    def is_leader(self) -> bool: ...
    def leader_address(self) -> str: ...
    def term(self) -> int: ...


class MembershipControl(Protocol):
    """Membership changes, as the Raft replica offers them (raft/replica.py). Each
    returns the refusal, or a future that resolves once the change is committed."""

    def members(self) -> list[MemberView]: ...
    def add_member(
        self, replica_id: str, raft_address: str, grpc_address: str
    ) -> MembershipRefusal | futures.Future[None]: ...
    def remove_member(self, replica_id: str) -> MembershipRefusal | futures.Future[None]: ...


@dataclass(slots=True)
class PerIdentity:
    """This replica's own per-identity limits (DESIGN §8): its submit buckets, its open
    watch streams, and the submissions it has checked against the pending caps but not
    yet applied."""

    submit_rate: SubmitRate = field(default_factory=SubmitRate)
    watch_slots: StreamSlots = field(default_factory=StreamSlots)
    pending_in_flight: PendingInFlight = field(default_factory=PendingInFlight)


@dataclass(slots=True)
class ReplicaContext:
    """Everything the servicers share. ``serving`` says whether this replica is the leader
    and its term barrier has committed; ``clock_ms`` is wall-clock milliseconds.

    Reads are served from immutable snapshots (``backend.snapshot()``), never while
    holding the lock the log's applies need."""

    self_id: str
    replicas: Sequence[ReplicaAddress]
    backend: Backend
    liveness: HeardFrom
    serving: Callable[[], bool]
    clock_ms: Callable[[], int]
    write_timeout_s: float = 5.0
    # The leader's newest scheduling pass, which ExplainJob answers from.
    last_plan: Callable[[], Plan | None] = lambda: None
    # Rations heavy reads so they cannot starve Raft and heartbeats (rpc/load_gates.py).
    read_gate: ReadGate = field(default_factory=ReadGate)
    # The serving leader's smaller ration for heavy reads a follower could serve (stale,
    # or with a read token), past which it sends them to the followers; None: the leader
    # serves them from ``read_gate`` like any other.
    leader_read_gate: ReadGate | None = None
    # Each job version's API message, converted once (GetJob, ListJobs).
    job_messages: JobMessages = field(default_factory=JobMessages)
    # The newest listed snapshot's jobs in submission order (ListJobs pages through it).
    job_order: JobOrder = field(default_factory=JobOrder)
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
    # Heartbeat streams: where this replica serves NodeStreamService ("": none), and,
    # while it leads with relayed heartbeats on, the followers that relay (rpc/relay.py).
    stream_address: str = ""
    relays: RelayTable = field(default_factory=RelayTable)
    per_identity: PerIdentity = field(default_factory=PerIdentity)
    # Limits this replica's configuration file sets ([limits]): as leader it puts them
    # back, so SetLimits refuses to change them here.
    pinned_limits: frozenset[str] = frozenset()
    # Follower reads (docs/consistency.md): whether this replica follows a leader it heard
    # lately, and how long a read carrying a token waits for this replica to catch up.
    follows_live_leader: Callable[[], bool] = lambda: False
    follower_read_wait_s: float = 0.5
    # The leader's collector of members' paces (leader/slow_nodes.py); None: not kept.
    paces: PaceSink | None = None

    def by_raft(self, raft_address: str) -> ReplicaAddress | None:
        for r in self.replicas:
            if r.raft == raft_address:
                return r
        return None


class ReplicaPort:
    """The replica as the use cases see it (:class:`synapse_ha.service.replica.Replica`):
    its state, proposals, leader routing, liveness table and clock."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx

    def snapshot(self) -> ClusterState:
        return self.ctx.backend.snapshot()

    def reading(self) -> AbstractContextManager[ClusterState]:
        return self.ctx.backend.reading()

    def cluster_config(self) -> ClusterConfig:
        return self.ctx.backend.cluster_config()

    def propose(self, command: cmd.Command) -> futures.Future[cmd.Result]:
        return self.ctx.backend.propose(command)

    def leader_refusal(self) -> Refusal | None:
        return leader_refusal(self.ctx)

    def heard(self, node_id: str, now_ms: int) -> None:
        self.ctx.liveness.heard(node_id, now_ms)

    def note_paces(self, node_id: str, paces: Sequence[PaceReport], now_ms: int) -> None:
        if self.ctx.paces is not None:
            self.ctx.paces.note(node_id, paces, now_ms)

    def clock_ms(self) -> int:
        return self.ctx.clock_ms()


class Servicer:
    """The base of every servicer: who is calling, routing to the serving leader,
    proposing and waiting for the commit, and :meth:`_fail`, where a use case's
    :class:`Refusal` ends the call."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        self.replica = ReplicaPort(ctx)

    def _fail(
        self, context: grpc.ServicerContext, refusal: Refusal, identity: Identity | None = None
    ) -> NoReturn:
        """End the call with ``refusal``'s wire error: the one place a use case's refusal
        becomes a gRPC status. An access refusal is logged and counted with the
        interceptor's, naming the method."""
        extra = None
        if refusal.denied is not None:
            method = method_of(context)
            if self.ctx.auth is not None:
                self.ctx.auth.refused(refusal.denied, identity, method)
            extra = {"method": access.short_method(method)}
        context.abort_with_status(refusal_status(refusal, extra))
        raise AssertionError("unreachable")  # abort_with_status raises

    # ---------------------------------------------------------------- who

    def _refuse(
        self, context: grpc.ServicerContext, refusal: access.AccessRefusal, identity: Identity
    ) -> NoReturn:
        self._fail(context, denied(refusal, identity), identity)

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

    def _read_mode(
        self, context: grpc.ServicerContext, allow_stale: bool, follower: bool = True
    ) -> bool:
        """Check a read may be served here; return whether the answer is stale (served
        by a replica that is not the serving leader). Every answer carries this replica's
        applied index (:data:`INDEX_KEY`).

        A follower serves a read that carries a read token (:data:`MIN_INDEX_KEY`, the
        newest index its client saw) once it has applied that index, while it follows a
        leader it heard lately, waiting up to ``follower_read_wait_s`` to catch up;
        otherwise it redirects to the leader. So a client never reads a state older than
        its own acknowledged writes (docs/consistency.md). ``follower`` False: never
        served by a follower for a token (a read that needs the leader's own view)."""
        if self.ctx.serving():
            self._send_index(context)
            return False
        if allow_stale:
            self._send_index(context)
            return True
        wanted = _read_token(context)
        if (
            follower
            and wanted is not None
            and self.ctx.follows_live_leader()
            and self._caught_up(context, wanted)
        ):
            return True
        self._require_serving_leader(context)
        self._send_index(context)
        return False

    def _caught_up(self, context: grpc.ServicerContext, wanted: int) -> bool:
        """Whether this replica has applied index ``wanted``, waiting (bounded by the
        wait and the call's deadline) for it; the index served is sent back."""
        waited = time.monotonic() + self.ctx.follower_read_wait_s
        remaining = context.time_remaining()
        if remaining is not None:
            waited = min(waited, time.monotonic() + remaining - 0.05)
        while True:
            applied = applied_index(self.ctx.backend)
            if applied >= wanted:
                context.set_trailing_metadata(((INDEX_KEY, str(applied)),))
                return True
            if time.monotonic() >= waited:
                return False
            time.sleep(FOLLOWER_READ_POLL_S)

    def _send_index(self, context: grpc.ServicerContext) -> None:
        applied = applied_index(self.ctx.backend)
        context.set_trailing_metadata(((INDEX_KEY, str(applied)),))

    @contextmanager
    def _heavy_read(
        self, context: grpc.ServicerContext, allow_stale: bool = False, follower: bool = True
    ) -> Iterator[None]:
        """Run the body as a heavy read admitted by the replica's read gate, or abort
        with OVERLOADED.

        The serving leader answers heartbeats and drives the log with the same
        interpreter: a read a follower could serve as well (``allow_stale``, or a read
        token where ``follower`` reads are allowed, as for :meth:`_read_mode`) is
        admitted by its smaller ``leader_read_gate``, and past that ration refused at
        once with the followers' addresses (ErrorInfo ``read_from``), where clients
        send it instead."""
        gate, followers = self.ctx.read_gate, ""
        leader_gate = self._leader_gate(context, allow_stale, follower)
        if leader_gate is not None:
            gate = leader_gate
            followers = ",".join(
                r.grpc for r in self.ctx.replicas if r.replica_id != self.ctx.self_id
            )
        admission = gate.admit()
        try:
            admission.__enter__()
        except Overloaded as exc:
            if followers:
                abort(
                    context,
                    ErrorReason.OVERLOADED,
                    f"the leader keeps its CPU for the log and the heartbeats ({exc}); "
                    f"read from a follower: {followers}",
                    {"read_from": followers},
                )
            abort(context, ErrorReason.OVERLOADED, f"{exc}; retry after a pause")
        try:
            yield
        finally:
            admission.__exit__(None, None, None)

    def _leader_gate(
        self, context: grpc.ServicerContext, allow_stale: bool, follower: bool
    ) -> ReadGate | None:
        """The leader's own gate when this heavy read is one the serving leader hands to
        its followers past its ration (see :meth:`_heavy_read`); else None."""
        gate = self.ctx.leader_read_gate
        if gate is None or len(self.ctx.replicas) < 2:
            return None
        if not (allow_stale or (follower and _read_token(context) is not None)):
            return None
        return gate if self.ctx.serving() else None

    def _propose(self, context: grpc.ServicerContext, command: cmd.Command) -> cmd.Result:
        """Commit ``command`` and return its result; abort on any failure."""
        return self._committed(context, [self._start_proposal(context, command)])[0]

    def _start_proposal(
        self, context: grpc.ServicerContext, command: cmd.Command
    ) -> futures.Future[cmd.Result]:
        """Propose ``command`` (this replica must be the serving leader)."""
        self._require_serving_leader(context)
        return self.ctx.backend.propose(command)

    def _write_timeout_s(self, context: grpc.ServicerContext) -> float:
        """How long a write may wait for its commit: the write timeout, within the
        call's deadline."""
        remaining = context.time_remaining()
        timeout = self.ctx.write_timeout_s
        if remaining is not None:
            timeout = max(0.0, min(timeout, remaining - 0.05))
        return timeout

    def _committed(
        self, context: grpc.ServicerContext, proposed: Sequence[futures.Future[cmd.Result]]
    ) -> list[cmd.Result]:
        """The results of ``proposed``, in order, each committed within the write
        timeout and the call's deadline; abort on the first that is not."""
        results = commit.committed(proposed, self._write_timeout_s(context))
        if isinstance(results, Refusal):
            self._fail(context, results)
        self._send_index(context)  # the state now holds the writes: a read token for them
        return results

    def _settle(
        self,
        context: grpc.ServicerContext,
        proposed: Sequence[futures.Future[cmd.Result]],
        not_found: Refusal,
    ) -> None:
        """Wait for ``proposed`` to commit OK (:func:`commit.settle`); abort otherwise."""
        if not proposed:
            return
        deadline = time.monotonic() + self._write_timeout_s(context)
        refusal = commit.settle(proposed, deadline, not_found)
        if refusal is not None:
            self._fail(context, refusal)
        self._send_index(context)

    def _check(
        self,
        context: grpc.ServicerContext,
        result: cmd.Result,
        not_found: tuple[ErrorReason, str, str] = (ErrorReason.JOB_NOT_FOUND, "job_id", ""),
    ) -> cmd.Result:
        """Abort unless ``result`` is OK. ``not_found`` is the reason for a NOT_FOUND
        result, with the metadata key and value naming what was looked up."""
        if result.ok:
            return result
        reason, key, value = not_found
        refusal = commit.refused(result, Refusal(reason, "", metadata={key: value}))
        assert refusal is not None
        self._fail(context, refusal)

    def _write(
        self,
        context: grpc.ServicerContext,
        identity: Identity,
        command: cmd.Command,
        audited: tuple[str, str],
        not_found: tuple[ErrorReason, str, str] = (ErrorReason.JOB_NOT_FOUND, "job_id", ""),
    ) -> cmd.Result:
        """Commit ``identity``'s ``command``, abort unless its result is OK (``not_found``
        as in :meth:`_check`), and write its audit line (``audited``: the method and what
        it was done to)."""
        result = self._check(context, self._propose(context, command), not_found)
        audit_write(identity, *audited)
        return result

    def _remove(
        self,
        context: grpc.ServicerContext,
        command_type: Callable[..., cmd.Command],
        field: str,
        value: str,
        not_found: tuple[ErrorReason, str],
    ) -> None:
        """Commit the command of ``command_type`` that removes what the request's
        ``field`` (required) names: ``value``; a NOT_FOUND result is ``not_found``'s
        reason with its metadata key set to ``value``. Audited under the command's name."""
        if not value:
            abort_required(context, field)
        identity = caller(context)
        command = command_type(**{field: value}, now_ms=self.ctx.clock_ms(), actor=str(identity))
        reason, key = not_found
        self._write(
            context, identity, command, (type(command).__name__, value), (reason, key, value)
        )

    def _writer(
        self, context: grpc.ServicerContext, request: Message, field: str
    ) -> tuple[Identity, ClusterState]:
        """Who writes the request's required message ``field``, and the state to check
        the write against (this replica must be the serving leader)."""
        if not request.HasField(field):
            abort_required(context, field)
        identity = caller(context)
        self._require_serving_leader(context)
        return identity, self.ctx.backend.snapshot()

    def _put(
        self,
        context: grpc.ServicerContext,
        identity: Identity,
        command: cmd.Command,
        name: str,
        existing: Container[str],
        violations: Sequence[Violation],
    ) -> bool:
        """Commit ``command``, which creates or replaces ``name`` (one of ``existing``),
        unless ``violations`` refuse it; True when ``name`` is new. Audited under the
        command's name."""
        if violations:
            abort_invalid(context, violations)
        existed = name in existing
        self._write(context, identity, command, (type(command).__name__, name))
        return not existed


def audit_write(identity: Identity, method: str, target: str) -> None:
    """One line per accepted write: who did what to which."""
    audit.info("%s %s %s", identity, method, target)


def abort_spec_error(context: grpc.ServicerContext, error: SpecError) -> NoReturn:
    abort_invalid(context, error.violations)


def abort_required(context: grpc.ServicerContext, field: str) -> NoReturn:
    abort_invalid(context, [Violation(ViolationCode.REQUIRED, field, "is required")])


# ListJobs pages: the default and the largest number of jobs in one answer.
DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000


def applied_index(backend: Backend) -> int:
    """How many commands the replica has applied: read under the apply lock, without
    the copy of the record dictionaries a snapshot makes (O(jobs), once per commit)."""
    with backend.reading() as state:
        return state.applied_commands


def presented_token(context: grpc.ServicerContext, state: ClusterState) -> Token | None:
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


# Read tokens (docs/consistency.md): every answer carries the applied index of the state it
# was served from (or, for a write, a state that holds the write); a client that sends the
# newest one it saw is never served an older state.
INDEX_KEY = "x-synapse-index"
MIN_INDEX_KEY = "x-synapse-min-index"
FOLLOWER_READ_POLL_S = 0.005


def _read_token(context: grpc.ServicerContext) -> int | None:
    """The read token a call carries (None: it carries none, or not a number)."""
    for key, value in context.invocation_metadata() or ():
        if key == MIN_INDEX_KEY and isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def abort_job_not_found(
    context: grpc.ServicerContext, job_id: str, state: ClusterState | None = None
) -> NoReturn:
    """JOB_NOT_FOUND; for the id of an array (``state`` given), says so (metadata
    ``array``: its task count) and where its tasks are."""
    array = state.arrays.get(job_id) if state is not None else None
    if array is not None:
        tasks = len(array.indices)
        abort(
            context,
            ErrorReason.JOB_NOT_FOUND,
            f"{job_id} is an array of {tasks} task(s), not one job: GetArray (synctl status "
            f"{job_id}) shows it, and its tasks are the jobs {job_id}_<index>",
            {"job_id": job_id, "array": str(tasks)},
        )
    abort(context, ErrorReason.JOB_NOT_FOUND, f"no job {job_id!r}", {"job_id": job_id})


def leader_refusal(ctx: ReplicaContext) -> Refusal | None:
    """None while this replica is the serving leader; otherwise where to go: NOT_LEADER
    (the leader's id and address), LEADER_NOT_READY or NO_LEADER."""
    if ctx.serving():
        return None
    if ctx.backend.is_leader():
        return Refusal(
            ErrorReason.LEADER_NOT_READY,
            "this replica was just elected leader and is committing its barrier; retry",
            metadata={"leader_id": ctx.self_id},
        )
    leader = ctx.by_raft(ctx.backend.leader_address())
    if leader is None or leader.replica_id == ctx.self_id:
        return Refusal(ErrorReason.NO_LEADER, "no leader is elected; retry shortly")
    return Refusal(
        ErrorReason.NOT_LEADER,
        f"not the leader; the leader is {leader.replica_id} at {leader.grpc}",
        metadata={"leader_id": leader.replica_id, "leader_address": leader.grpc},
    )


def require_serving_leader(ctx: ReplicaContext, context: grpc.ServicerContext) -> None:
    """Return when this replica is the serving leader; otherwise end the call with
    where to go (:func:`leader_refusal`)."""
    refusal = leader_refusal(ctx)
    if refusal is not None:
        context.abort_with_status(refusal_status(refusal))
        raise AssertionError("unreachable")  # abort_with_status raises
