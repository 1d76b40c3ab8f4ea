"""The replica-set methods of ``SchedulerService``: status of every replica, one
replica's state, membership changes and backups."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from operator import attrgetter

import grpc

from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.membership import MembershipCode, MembershipRefusal, ReplicaRole
from synapse_ha.core.model import JobState
from synapse_ha.core.spec import validation
from synapse_ha.core.spec.validation import Violation, ViolationCode
from synapse_ha.leader.ports import ProposalError
from synapse_ha.rpc import states
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import ErrorReason, abort, abort_invalid
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.server.context import (
    MembershipControl,
    ReplicaAddress,
    Servicer,
    abort_required,
    audit_write,
)


class ClusterService(Servicer):
    """GetClusterStatus, GetReplicaState, AddReplica, RemoveReplica and SaveSnapshot."""

    def GetClusterStatus(
        self, request: pb.GetClusterStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetClusterStatusResponse:
        ctx = self.ctx
        own = self._local_status()
        replicas = [own]
        if not request.local_only:
            replicas = [
                own if r.replica_id == ctx.self_id else ask_replica(r, ctx.peer_channel)
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
            format_floor=state.format_floor,
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
        audit_write(identity, "AddReplica", f"{request.replica_id} ({request.raft_address})")
        return self._members_response(control)

    def RemoveReplica(
        self, request: pb.RemoveReplicaRequest, context: grpc.ServicerContext
    ) -> pb.MembershipResponse:
        """Remove a replica (admin, on the serving leader); answers once committed."""
        if not request.replica_id:
            abort_required(context, "replica_id")
        control = self._membership(context)
        identity = caller(context)
        outcome = control.remove_member(request.replica_id)
        self._await_change(context, outcome, request.replica_id)
        audit_write(identity, "RemoveReplica", request.replica_id)
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
        audit_write(caller(context), "SaveSnapshot", f"index {raft_index}, {len(encoded)} bytes")
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
            abort(context, ErrorReason.INTERNAL, "this replica offers no membership changes")
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
                ErrorReason.OUTCOME_UNKNOWN,
                "the membership change was not confirmed within the deadline; read the "
                "members with `synctl cluster` before retrying",
            )
        except ProposalError as exc:
            if exc.committed_unknown:
                abort(context, ErrorReason.OUTCOME_UNKNOWN, f"the outcome is unknown ({exc})")
            abort(context, ErrorReason.NOT_COMMITTED, f"not committed: {exc}; retry")

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
            **states.replica_role_fields(states.replica_role_of(raft.role)),
            term=raft.term,
            commit_index=raft.commit_index,
            last_applied=raft.last_applied,
            leader_id=leader.replica_id if leader else "",
            healthy=healthy,
            error=error,
            format_version=FORMAT,
            metrics_url=ctx.metrics_url,
            dashboard_url=ctx.dashboard_url,
        )


# Membership and backup: the gRPC reason of each refusal, and the size of one
# SaveSnapshot chunk (well under gRPC's 4 MB default message limit).
_MEMBERSHIP_REASON = {
    MembershipCode.CHANGE_IN_FLIGHT: ErrorReason.CHANGE_IN_FLIGHT,
    MembershipCode.WOULD_LOSE_QUORUM: ErrorReason.WOULD_LOSE_QUORUM,
    MembershipCode.REPLICA_EXISTS: ErrorReason.REPLICA_EXISTS,
    MembershipCode.REPLICA_NOT_FOUND: ErrorReason.REPLICA_NOT_FOUND,
    MembershipCode.LAST_REPLICA: ErrorReason.LAST_REPLICA,
    MembershipCode.IS_LEADER: ErrorReason.LEADER_STEPPING_DOWN,
}
SNAPSHOT_CHUNK_BYTES = 1 << 20


def ask_replica(
    replica: ReplicaAddress, open_channel: Callable[[str], grpc.Channel]
) -> pb.ReplicaStatus:
    """``replica``'s own status, or an UNREACHABLE one saying why it did not answer."""
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
            **states.replica_role_fields(ReplicaRole.UNREACHABLE),
            healthy=False,
            error=str(detail),
        )
