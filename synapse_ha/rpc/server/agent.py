"""``NodeAgentService``: a worker's registration and heartbeat, and the desired members
it is sent."""

from __future__ import annotations

import grpc

from synapse_ha.core.identity.access import Kind
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc import from_proto, states
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import ErrorReason, abort
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.heartbeat import (
    answer_fields,
    desired_message,
    heartbeat_events,
    heartbeat_in,
    heartbeat_message,
)
from synapse_ha.rpc.relay import MAX_RELAYED, relay_heartbeats
from synapse_ha.rpc.server.context import ReplicaContext, Servicer, abort_required
from synapse_ha.service.heartbeat import DesiredMembers, heartbeat
from synapse_ha.service.nodes import register_node
from synapse_ha.service.refusal import Refusal, node_not_found

# A worker names the relayed streams it could not reach lately: a few replicas' at most.
MAX_UNREACHABLE = 100


class NodeAgentServicer(Servicer, pb_grpc.NodeAgentServiceServicer):
    """Register and Heartbeat, for synapse-worker agents. Leader only."""

    def __init__(self, ctx: ReplicaContext) -> None:
        super().__init__(ctx)
        self._desired = DesiredMembers()

    def RegisterNode(
        self, request: pb.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> pb.RegisterNodeResponse:
        if len(request.unreachable_streams) > MAX_UNREACHABLE:
            abort(
                context,
                ErrorReason.INVALID_FIELD,
                f"unreachable_streams: at most {MAX_UNREACHABLE} addresses",
                {"field": "unreachable_streams"},
            )
        info = from_proto.node_info_from_proto(request)
        events = heartbeat_events(request.reports)
        if isinstance(events, Refusal):
            self._fail(context, events, caller(context))
        identity = caller(context)
        registered = register_node(
            self.replica, identity, info, self._write_timeout_s(context), events
        )
        if isinstance(registered, Refusal):
            self._fail(context, registered, identity)
        self._send_index(context)
        state = registered.state
        timeouts = state.config.timeouts
        node = state.nodes.get(info.node_id)
        relay = ""
        if state.config.relay_heartbeats and self.ctx.stream_address:
            relay = self.ctx.relays.pick(info.node_id, avoid=set(request.unreachable_streams))
        return pb.RegisterNodeResponse(
            # A node forgotten meanwhile (declared dead) holds nothing: dead.
            **states.node_status_fields(node.status if node is not None else NodeStatus.DEAD),
            heartbeat_interval_ms=timeouts.heartbeat_interval_ms,
            lease_ttl_ms=timeouts.lease_ttl_ms,
            stream_address=relay or self.ctx.stream_address,
            relayed=bool(relay),
            acked_reports=registered.acked_reports,
        )

    def RelayHeartbeats(
        self, request: pb.RelayHeartbeatsRequest, context: grpc.ServicerContext
    ) -> pb.RelayHeartbeatsResponse:
        """A follower's batch of its workers' heartbeats (:mod:`synapse_ha.rpc.relay`)."""
        identity = caller(context)
        if identity.kind is Kind.REPLICA and identity.name != request.replica_id:
            abort(
                context,
                ErrorReason.PERMISSION_DENIED,
                f"{identity} may relay only as itself, not as replica {request.replica_id!r}",
                {"identity": str(identity)},
            )
        if not request.replica_id:
            abort_required(context, "replica_id")
        if all(r.replica_id != request.replica_id for r in self.ctx.replicas):
            abort(
                context,
                ErrorReason.PERMISSION_DENIED,
                f"replica {request.replica_id!r} is not a member of this cluster; "
                "only members relay heartbeats",
                {"identity": str(identity)},
            )
        if len(request.heartbeats) > MAX_RELAYED:
            abort(
                context,
                ErrorReason.INVALID_FIELD,
                f"heartbeats: at most {MAX_RELAYED} in one request",
                {"field": "heartbeats"},
            )
        self._require_serving_leader(context)
        return relay_heartbeats(self.replica, self.ctx, request)

    def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatResponse:
        message = heartbeat_message(request)
        if message.node_id:
            self._as_node(context, message.node_id)
        beat = heartbeat_in(message)
        if isinstance(beat, Refusal):
            self._fail(context, beat)
        self._require_serving_leader(context)
        now = self.ctx.clock_ms()
        taken = heartbeat(self.replica, beat, now)
        if isinstance(taken, Refusal):
            self._fail(context, taken)
        self._settle(context, taken.proposed, node_not_found(beat.node_id))
        term = self.ctx.backend.term()
        state = self.ctx.backend.snapshot()
        desired = self._desired.of(state, beat.node_id)
        return pb.HeartbeatResponse(
            desired=[desired_message(state, d, now) for d in desired],
            acked_reports=taken.acked_reports,
            leader_term=term,
            **answer_fields(state, beat.node_id),
        )
