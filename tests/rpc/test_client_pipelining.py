"""A client's calls made with ``future`` are in flight together: the interceptor that
keeps the newest applied index reads it when each call completes, and never makes a call
wait for the one before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.client.token import INDEX_KEY
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

CALLS = 4


@pytest.fixture
def together() -> Iterator[tuple[str, list[str]]]:
    """A server whose ListJobs answers only once ``CALLS`` calls wait at once (a barrier
    that breaks after 5 s otherwise), each answer carrying an applied index."""
    barrier = threading.Barrier(CALLS, timeout=5.0)
    answered: list[str] = []
    lock = threading.Lock()

    def list_jobs(request: pb.ListJobsRequest, context: grpc.ServicerContext) -> Any:
        try:
            position = barrier.wait()
        except threading.BrokenBarrierError:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the calls came one at a time")
        with lock:
            answered.append(request.name)
        context.set_trailing_metadata(((INDEX_KEY, str(100 + position)),))
        return pb.ListJobsResponse()

    handler = grpc.method_handlers_generic_handler(
        "synapse.v1.SchedulerService",
        {
            "ListJobs": grpc.unary_unary_rpc_method_handler(
                list_jobs,
                request_deserializer=pb.ListJobsRequest.FromString,
                response_serializer=pb.ListJobsResponse.SerializeToString,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=CALLS + 2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", answered
    finally:
        server.stop(grace=None)


def test_calls_made_with_future_are_in_flight_together(together: tuple[str, list[str]]) -> None:
    address, answered = together
    with ClusterClient([address], channel_factory=grpc.insecure_channel) as client:
        stub = client.scheduler(address)
        calls = [
            stub.ListJobs.future(pb.ListJobsRequest(name=f"c{i}"), timeout=10) for i in range(CALLS)
        ]
        for call in calls:
            call.result()
        assert sorted(answered) == [f"c{i}" for i in range(CALLS)]
        # The newest index the answers carried is kept, read as each call completed (by
        # the call's own completion callback, which may run just after result returns).
        for _ in range(200):
            if client.read_token.index == 100 + CALLS - 1:
                break
            threading.Event().wait(0.01)
        assert client.read_token.index == 100 + CALLS - 1
