"""``NodeAgentService``: a worker's registration and heartbeat, and the desired members
it is sent."""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core import validation
from synapse_ha.core.access import Kind
from synapse_ha.core.formats import NEW_FIELDS, format_needed
from synapse_ha.core.model import NodeInfo, NodeStatus
from synapse_ha.core.spec import SpecError
from synapse_ha.rpc import convert, states
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import Reason, abort, abort_invalid
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.heartbeat import (
    DesiredMembers,
    answer_fields,
    check_problems,
    desired_message,
    gpu_fault_problems,
    heartbeat_commands,
)
from synapse_ha.rpc.relay import MAX_RELAYED, relay_heartbeats
from synapse_ha.rpc.server.context import ReplicaContext, _Base, _invalid, _required

# A worker names the relayed streams it could not reach lately: a few replicas' at most.
MAX_UNREACHABLE = 100


class NodeAgentServicer(_Base, pb_grpc.NodeAgentServiceServicer):
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
                Reason.INVALID_FIELD,
                f"unreachable_streams: at most {MAX_UNREACHABLE} addresses",
                {"field": "unreachable_streams"},
            )
        info = convert.node_info_from_proto(request)
        floor = self.ctx.backend.snapshot().format_floor
        if format_needed(info) > floor:  # left out: not every replica reads them yet
            newer: dict[str, Any] = {
                name: "" for name, version in NEW_FIELDS[NodeInfo].items() if version > floor
            }
            info = dataclasses.replace(info, **newer)
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
        )

    def RelayHeartbeats(
        self, request: pb.RelayHeartbeatsRequest, context: grpc.ServicerContext
    ) -> pb.RelayHeartbeatsResponse:
        """A follower's batch of its workers' heartbeats (:mod:`synapse_ha.rpc.relay`)."""
        identity = caller(context)
        if identity.kind is Kind.REPLICA and identity.name != request.replica_id:
            abort(
                context,
                Reason.PERMISSION_DENIED,
                f"{identity} may relay only as itself, not as replica {request.replica_id!r}",
                {"identity": str(identity)},
            )
        if not request.replica_id:
            _required(context, "replica_id")
        if all(r.replica_id != request.replica_id for r in self.ctx.replicas):
            abort(
                context,
                Reason.PERMISSION_DENIED,
                f"replica {request.replica_id!r} is not a member of this cluster; "
                "only members relay heartbeats",
                {"identity": str(identity)},
            )
        if len(request.heartbeats) > MAX_RELAYED:
            abort(
                context,
                Reason.INVALID_FIELD,
                f"heartbeats: at most {MAX_RELAYED} in one request",
                {"field": "heartbeats"},
            )
        self._require_serving_leader(context)
        return relay_heartbeats(self.ctx, self.ctx.relays, request)

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
        state = self.ctx.backend.snapshot()
        if request.node_id not in state.nodes:
            abort(
                context,
                Reason.NODE_NOT_FOUND,
                f"node {request.node_id!r} is not registered; call RegisterNode",
                {"node_id": request.node_id},
            )
        faults = convert.gpu_faults_from_proto(request.gpu_faults)
        checks = convert.checks_from_proto(request.checks)
        violations = gpu_fault_problems(state, request.node_id, faults) + check_problems(checks)
        if violations:
            abort_invalid(context, violations)
        self.ctx.liveness.heard(request.node_id, now)
        for command in heartbeat_commands(state, request.node_id, faults, checks, events, now):
            self._check(
                context,
                self._propose(context, command),
                (Reason.NODE_NOT_FOUND, "node_id", request.node_id),
            )
        term = self.ctx.backend.term()
        state = self.ctx.backend.snapshot()
        desired = self._desired.of(state, request.node_id)
        return pb.HeartbeatResponse(
            desired=[desired_message(state, d, now) for d in desired],
            acked_reports=len(events),
            leader_term=term,
            **answer_fields(state, request.node_id),
        )
