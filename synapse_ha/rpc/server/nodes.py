"""The node methods of ``SchedulerService``: cordon, uncordon, drain, repair GPUs and
list."""

from __future__ import annotations

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc import convert, states
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import ErrorReason
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.server.context import Servicer, abort_required, audit_write


class NodeService(Servicer):
    """CordonNode, UncordonNode, DrainNode, RepairGpus and ListNodes."""

    def _set_node_status(
        self, request: pb.NodeStatusRequest, context: grpc.ServicerContext, status: NodeStatus
    ) -> pb.NodeStatusResponse:
        if not request.node_id:
            abort_required(context, "node_id")
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
            (ErrorReason.NODE_NOT_FOUND, "node_id", request.node_id),
        )
        audit_write(identity, f"SetNodeStatus({status})", request.node_id)
        node = self.ctx.backend.snapshot().nodes.get(request.node_id)
        # A node forgotten meanwhile (declared dead) holds nothing: dead.
        status = node.status if node is not None else NodeStatus.DEAD
        return pb.NodeStatusResponse(**states.node_status_fields(status))

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

    def RepairGpus(
        self, request: pb.RepairGpusRequest, context: grpc.ServicerContext
    ) -> pb.RepairGpusResponse:
        if not request.node_id:
            abort_required(context, "node_id")
        identity = caller(context)
        command = cmd.RepairGpus(
            node_id=request.node_id,
            gpus=tuple(sorted(set(request.gpus))),
            now_ms=self.ctx.clock_ms(),
            actor=str(identity),
        )
        result = self._check(
            context,
            self._propose(context, command),
            (ErrorReason.NODE_NOT_FOUND, "node_id", request.node_id),
        )
        audit_write(identity, f"RepairGpus({list(command.gpus) or 'all'})", request.node_id)
        node = self.ctx.backend.snapshot().nodes.get(request.node_id)
        left = node.gpu_faults if node is not None else ()
        return pb.RepairGpusResponse(
            message=result.message, gpu_faults=convert.gpu_faults_to_proto(left)
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
