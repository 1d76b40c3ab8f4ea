"""The tail of a job member's log, read for the dashboard as ``synctl logs`` reads it.

A grant from the scheduler's ``GrantLogAccess`` (none on a cluster without TLS), then the
end of the log from the member's worker (``ReadLog`` with a negative offset), each call
made as the viewer.
"""

from __future__ import annotations

import grpc

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import Transport

LOG_TAIL_BYTES = 4096


def read_log_tail(
    client: ClusterClient, transport: Transport, job: pb.Job, member: pb.Member, timeout_s: float
) -> str:
    """The last :data:`LOG_TAIL_BYTES` of ``member``'s log of the job's current attempt;
    raises the API's or the worker's refusal, or LookupError for an unknown node."""
    grant, address = _log_access(client, job, member)
    read = wpb.ReadLogRequest(
        job_id=job.job_id, attempt=job.attempt.number, rank=member.rank, offset=-LOG_TAIL_BYTES
    )
    metadata = ((GRANT_METADATA_KEY, grant),) if grant else ()
    data = bytearray()
    with transport.channel(address, worker=member.node_id) as channel:
        stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        for chunk in stub.ReadLog(read, timeout=timeout_s, metadata=metadata):
            data += chunk.data
            if len(data) >= LOG_TAIL_BYTES:
                break
    return data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")


def _log_access(client: ClusterClient, job: pb.Job, member: pb.Member) -> tuple[str | None, str]:
    """The grant to read ``member``'s log (None without TLS) and its worker's address."""
    request = pb.GrantLogAccessRequest(
        job_id=job.job_id, attempt=job.attempt.number, rank=member.rank
    )
    grant: str | None = None
    address = ""
    try:
        answer = client.call(
            "GrantLogAccess",
            lambda a, t: client.scheduler(a).GrantLogAccess(request, timeout=t),
        )
        grant, address = answer.grant, answer.node_address
    except grpc.RpcError as exc:
        if failure_of(exc).reason is not Reason.NEEDS_TLS:
            raise
    if not address:
        nodes = {n.node_id: n.address for n in client.list_nodes()}
        address = nodes.get(member.node_id, "")
    if not address:
        raise LookupError(f"node {member.node_id} is not known")
    return grant, address
