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
policy in :mod:`synapse_ha.core.identity.access`); handlers read the caller with
:func:`~synapse_ha.rpc.auth.caller` and narrow further: a user manages only its own jobs
and sees the command and environment of no other job, a worker speaks only for its own
node. Every accepted write names its actor in the command (audit, in the replicated
state) and in one INFO line on the ``synapse_ha.audit`` logger.

The services, one module per concern: :mod:`.jobs`, :mod:`.nodes`, :mod:`.cluster`,
:mod:`.admin` (tokens, limits, queues), :mod:`.events` (history and events) and
:mod:`.agent` (workers); what they share is :mod:`.context`. The use cases with rules
of their own (a heartbeat, a submission, a cancellation, a registration) live in
:mod:`synapse_ha.service`: a servicer converts, calls one and ends the call with its
refusal (``Servicer._fail``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from synapse_ha.rpc.auth import AuthInterceptor
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.load_gates import metered
from synapse_ha.rpc.server.admin import AdminService
from synapse_ha.rpc.server.agent import NodeAgentServicer
from synapse_ha.rpc.server.cluster import ClusterService
from synapse_ha.rpc.server.context import (
    Backend,
    GrantSigner,
    MembershipControl,
    RaftStatusView,
    ReplicaAddress,
    ReplicaContext,
    log,
    require_serving_leader,
)
from synapse_ha.rpc.server.events import EventService
from synapse_ha.rpc.server.jobs import JobService
from synapse_ha.rpc.server.nodes import NodeService

__all__ = [
    "Backend",
    "GrantSigner",
    "MembershipControl",
    "NodeAgentServicer",
    "RaftStatusView",
    "ReplicaAddress",
    "ReplicaContext",
    "SchedulerServicer",
    "build_server",
    "require_serving_leader",
]


class SchedulerServicer(
    JobService,
    NodeService,
    ClusterService,
    AdminService,
    EventService,
    pb_grpc.SchedulerServiceServicer,
):
    """``SchedulerService``: the methods of every concern, on one servicer."""


SERVICE = "synapse.v1.SchedulerService"
# The unary reads the read gate admits (``_heavy_read``): their answers are encoded with
# the encoding's CPU charged to the gate.
HEAVY_READS = (
    "ListJobs",
    "ExplainJob",
    "ListNodes",
    "ListQueues",
    "GetReplicaState",
    "ListHistory",
    "GetUsage",
)


def heavy_read_handlers(
    servicer: SchedulerServicer,
) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """The :data:`HEAVY_READS` handlers, each answer's encoding charged to the read gate
    that admitted it (:func:`~synapse_ha.rpc.load_gates.metered`), so that the CPU share
    bounds a listing's whole cost, not only what its handler spends."""
    methods = pb.DESCRIPTOR.services_by_name["SchedulerService"].methods_by_name
    handlers = {}
    for name in HEAVY_READS:
        method = methods[name]
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=request.FromString,
            response_serializer=metered(response.SerializeToString),
        )
    return handlers


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
    servicer = SchedulerServicer(ctx)
    # The heavy reads' own handlers come first (the generic handlers are asked in the
    # order they were added) and replace the generated ones among the registered methods.
    heavy = heavy_read_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, heavy),))
    pb_grpc.add_SchedulerServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_registered_method_handlers(SERVICE, heavy)  # type: ignore[attr-defined]
    pb_grpc.add_NodeAgentServiceServicer_to_server(NodeAgentServicer(ctx), server)  # type: ignore[no-untyped-call]
    port = add_port(server, address) if add_port is not None else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC address {address}")
    return server
