"""The node methods of ``SchedulerService``: cordon, uncordon, drain, repair GPUs and
list."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import NodeStatus
from synapse_ha.core.scheduler.defrag import draining_for
from synapse_ha.core.spares import spare_nodes
from synapse_ha.rpc import states, to_proto
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import ErrorReason
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.server.context import Servicer, abort_required

StatusMethod = Callable[
    ["NodeService", pb.NodeStatusRequest, grpc.ServicerContext], pb.NodeStatusResponse
]


def _node_status_method(status: NodeStatus) -> StatusMethod:
    """The method that sets a node's status to ``status``."""

    def method(
        self: NodeService, request: pb.NodeStatusRequest, context: grpc.ServicerContext
    ) -> pb.NodeStatusResponse:
        return self._set_node_status(request, context, status)

    return method


class NodeService(Servicer):
    """CordonNode, UncordonNode, DrainNode, RepairGpus and ListNodes."""

    def _set_node_status(
        self, request: pb.NodeStatusRequest, context: grpc.ServicerContext, status: NodeStatus
    ) -> pb.NodeStatusResponse:
        audited = f"SetNodeStatus({status})"
        fields = {"status": status, "reason": request.reason[:1024]}
        self._node_write(context, request.node_id, cmd.SetNodeStatus, audited, fields)
        node = self.ctx.backend.snapshot().nodes.get(request.node_id)
        # A node forgotten meanwhile (declared dead) holds nothing: dead.
        status = node.status if node is not None else NodeStatus.DEAD
        return pb.NodeStatusResponse(**states.node_status_fields(status))

    def _node_write(
        self,
        context: grpc.ServicerContext,
        node_id: str,
        command_type: Callable[..., cmd.Command],
        method: str,
        fields: Mapping[str, object],
    ) -> cmd.Result:
        """Commit the command of ``command_type`` on node ``node_id`` (required) with
        ``fields``, audited as ``method``."""
        if not node_id:
            abort_required(context, "node_id")
        identity = caller(context)
        command = command_type(
            node_id=node_id, **fields, now_ms=self.ctx.clock_ms(), actor=str(identity)
        )
        not_found = (ErrorReason.NODE_NOT_FOUND, "node_id", node_id)
        return self._write(context, identity, command, (method, node_id), not_found)

    # CordonNode, UncordonNode and DrainNode: one status each.
    CordonNode = _node_status_method(NodeStatus.CORDONED)
    UncordonNode = _node_status_method(NodeStatus.READY)
    DrainNode = _node_status_method(NodeStatus.DRAINING)

    def RepairGpus(
        self, request: pb.RepairGpusRequest, context: grpc.ServicerContext
    ) -> pb.RepairGpusResponse:
        gpus = tuple(sorted(set(request.gpus)))
        audited = f"RepairGpus({list(gpus) or 'all'})"
        result = self._node_write(context, request.node_id, cmd.RepairGpus, audited, {"gpus": gpus})
        node = self.ctx.backend.snapshot().nodes.get(request.node_id)
        left = node.gpu_faults if node is not None else ()
        return pb.RepairGpusResponse(
            message=result.message, gpu_faults=to_proto.gpu_faults_to_proto(left)
        )

    def ListNodes(
        self, request: pb.ListNodesRequest, context: grpc.ServicerContext
    ) -> pb.ListNodesResponse:
        stale = self._read_mode(context, request.allow_stale)
        now = self.ctx.clock_ms()
        out = []
        state = self.ctx.backend.snapshot()
        plan = None if stale else self.ctx.last_plan()
        with self._heavy_read(context, request.allow_stale):
            spares = spare_nodes(state)
            for node_id in sorted(state.nodes):
                heard = None if stale else self.ctx.liveness.heard_since_election(node_id)
                age = -1 if heard is None else max(0, now - heard)
                node = state.nodes[node_id]
                drain = draining_for(plan, node_id)
                out.append(to_proto.node_to_proto(node, age, node_id in spares, drain))
        return pb.ListNodesResponse(nodes=out, stale=stale)
