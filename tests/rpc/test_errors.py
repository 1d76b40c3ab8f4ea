"""Machine-readable gRPC errors: statuses built by the server helper and read back by the
client helper over a real in-process gRPC server on 127.0.0.1, and the cluster client
branching on each reason (never on the sentence)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.spec.validation import Violation, ViolationCode
from synapse_ha.rpc.errors import (
    DOMAIN,
    LEADER_METADATA_KEY,
    STATUS_OF,
    ErrorReason,
    abort,
    abort_invalid,
    build_status,
    failure_of,
)
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc

# What one SubmitJob call does: answer, or abort through the server helper.
Step = Callable[[grpc.ServicerContext], pb.SubmitJobResponse]


@dataclass
class ScriptedServicer(pb_grpc.SchedulerServiceServicer):
    """SubmitJob runs the next step of its script (the last one repeats); counts calls."""

    script: list[Step]
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        with self.lock:
            step = self.script[min(self.calls, len(self.script) - 1)]
            self.calls += 1
        return step(context)


@dataclass
class Replica:
    address: str
    servicer: ScriptedServicer


@pytest.fixture
def serve() -> Iterator[Callable[[list[Step]], Replica]]:
    servers: list[grpc.Server] = []

    def start(script: list[Step]) -> Replica:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        servicer = ScriptedServicer(script)
        pb_grpc.add_SchedulerServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        assert port
        servers.append(server)
        server.start()
        return Replica(f"127.0.0.1:{port}", servicer)

    try:
        yield start
    finally:
        for server in servers:
            server.stop(grace=None)


def answer(job_id: str = "job-000001") -> Step:
    return lambda context: pb.SubmitJobResponse(job_id=job_id, created=True)


def fails(reason: ErrorReason, message: str = "", **metadata: str) -> Step:
    def step(context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        abort(context, reason, message or f"{reason} happened", metadata)

    return step


def fails_plain(code: grpc.StatusCode, message: str) -> Step:
    """An error without ErrorInfo (an older server, or a proxy)."""

    def step(context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        context.abort(code, message)
        raise AssertionError("unreachable")

    return step


def client_for(*replicas: Replica, timeout_s: float = 3.0) -> ClusterClient:
    return ClusterClient(
        [r.address for r in replicas],
        timeout_s=timeout_s,
        per_try_timeout_s=1.0,
        backoff_s=0.001,
        max_backoff_s=0.002,
        rng=random.Random(7),
    )


def submit(client: ClusterClient, idempotent: bool = True) -> pb.SubmitJobResponse:
    request = pb.SubmitJobRequest(spec=pb.JobSpec(name="a"), request_id="r1")
    response: pb.SubmitJobResponse = client.call(
        "SubmitJob",
        lambda a, t: client.scheduler(a).SubmitJob(request, timeout=t),
        idempotent=idempotent,
    )
    return response


def error_from(replica: Replica) -> grpc.RpcError:
    with client_for(replica) as client, pytest.raises(grpc.RpcError) as info:
        client.scheduler(replica.address).SubmitJob(pb.SubmitJobRequest(), timeout=5)
    return info.value


# --------------------------------------------------------------- build and parse


@pytest.mark.parametrize("reason", [r for r in ErrorReason if r is not ErrorReason.UNKNOWN])
def test_every_reason_goes_over_the_wire_with_its_code_and_metadata(
    serve: Callable[[list[Step]], Replica], reason: ErrorReason
) -> None:
    replica = serve([fails(reason, "the sentence", job_id="job-7")])
    error = error_from(replica)
    assert error.code() is STATUS_OF[reason]
    failure = failure_of(error)
    assert failure.reason is reason
    assert failure.code is STATUS_OF[reason]
    assert failure.message == "the sentence"
    assert failure.metadata == {"job_id": "job-7"}


def test_invalid_fields_carry_every_violation(serve: Callable[[list[Step]], Replica]) -> None:
    violations = [
        Violation(ViolationCode.REQUIRED, "name", "is required"),
        Violation(ViolationCode.INVALID_FIELD, "resources.gpu", "must be between 0 and 64"),
    ]

    def step(context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        abort_invalid(context, violations)

    error = error_from(serve([step]))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    failure = failure_of(error)
    assert failure.reason is ErrorReason.INVALID_FIELD
    assert failure.violations == tuple(violations)
    assert (failure.field, failure.rule) == ("name", "is required")
    assert failure.metadata == {"field": "name", "rule": "is required", "violation": "required"}
    assert failure.message == "name: is required; resources.gpu: must be between 0 and 64"


def test_extra_trailing_metadata_travels_beside_the_details(
    serve: Callable[[list[Step]], Replica],
) -> None:
    def step(context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        abort(
            context,
            ErrorReason.NOT_LEADER,
            "not the leader",
            {"leader_address": "127.0.0.1:1"},
            trailing=((LEADER_METADATA_KEY, "127.0.0.1:1"),),
        )

    error = error_from(serve([step]))
    assert (LEADER_METADATA_KEY, "127.0.0.1:1") in tuple(error.trailing_metadata() or ())
    assert failure_of(error).metadata == {"leader_address": "127.0.0.1:1"}


def test_an_error_without_details_has_no_reason(serve: Callable[[list[Step]], Replica]) -> None:
    error = error_from(serve([fails_plain(grpc.StatusCode.NOT_FOUND, "no job 'x'")]))
    failure = failure_of(error)
    assert failure.reason is ErrorReason.UNKNOWN
    assert failure.code is grpc.StatusCode.NOT_FOUND
    assert failure.message == "no job 'x'"
    assert failure.describe() == "NOT_FOUND: no job 'x'"


def test_another_domain_or_a_newer_reason_is_unknown() -> None:
    status = build_status(ErrorReason.CONFLICT, "x")
    assert status.code is grpc.StatusCode.FAILED_PRECONDITION

    class Fake(grpc.RpcError):
        def __init__(self, trailing: tuple[tuple[str, bytes], ...]) -> None:
            self._trailing = trailing

        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.FAILED_PRECONDITION

        def details(self) -> str:
            return "x"

        def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
            return self._trailing

    assert failure_of(Fake(status.trailing_metadata)).reason is ErrorReason.CONFLICT
    from google.rpc import error_details_pb2, status_pb2

    for domain, reason in (("other.v1", "CONFLICT"), (DOMAIN, "FROM_THE_FUTURE")):
        rich = status_pb2.Status(code=9, message="x")
        rich.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain=domain))
        fake = Fake((("grpc-status-details-bin", rich.SerializeToString()),))
        assert failure_of(fake).reason is ErrorReason.UNKNOWN


# ------------------------------------------------------------- the client branches


def test_not_leader_sends_the_call_to_the_named_leader(
    serve: Callable[[list[Step]], Replica],
) -> None:
    leader = serve([answer("job-000042")])
    follower = serve([fails(ErrorReason.NOT_LEADER, leader_address=leader.address, leader_id="r2")])
    with client_for(follower) as client:  # the leader's address is not even configured
        assert submit(client).job_id == "job-000042"
    assert (follower.servicer.calls, leader.servicer.calls) == (1, 1)


def test_the_words_of_a_message_are_never_followed(serve: Callable[[list[Step]], Replica]) -> None:
    leader = serve([answer()])

    def old_style_redirect(context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        context.set_trailing_metadata(((LEADER_METADATA_KEY, leader.address),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the leader; the leader is r2")
        raise AssertionError("unreachable")

    replica = serve([old_style_redirect])
    with client_for(replica) as client, pytest.raises(grpc.RpcError) as info:
        submit(client)
    # Without the NOT_LEADER reason neither the sentence nor the legacy key is followed.
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert (replica.servicer.calls, leader.servicer.calls) == (1, 0)


def test_a_replica_that_does_not_answer_is_passed_over(
    serve: Callable[[list[Step]], Replica],
) -> None:
    down = serve([fails_plain(grpc.StatusCode.UNAVAILABLE, "just elected, or so it says")])
    good = serve([answer()])
    with client_for(down, good) as client:
        assert submit(client).created
    assert (down.servicer.calls, good.servicer.calls) == (1, 1)


@pytest.mark.parametrize(
    "reason",
    [
        ErrorReason.LEADER_NOT_READY,
        ErrorReason.OVERLOADED,
        ErrorReason.NO_LEADER,
        ErrorReason.NOT_COMMITTED,
    ],
)
def test_a_replica_that_cannot_take_the_call_yet_is_asked_again(
    serve: Callable[[list[Step]], Replica], reason: ErrorReason
) -> None:
    replica = serve([fails(reason), fails(reason), answer()])
    with client_for(replica) as client:
        assert submit(client).created
    assert replica.servicer.calls == 3


def test_no_leader_moves_on_to_the_next_replica(serve: Callable[[list[Step]], Replica]) -> None:
    lost = serve([fails(ErrorReason.NO_LEADER)])
    good = serve([answer()])
    with client_for(lost, good) as client:
        assert submit(client).created
        assert client.leader_hint == good.address
    assert lost.servicer.calls == 1


def test_an_unknown_outcome_is_retried_only_when_idempotent(
    serve: Callable[[list[Step]], Replica],
) -> None:
    replica = serve([fails(ErrorReason.OUTCOME_UNKNOWN), answer()])
    with client_for(replica) as client:
        assert submit(client, idempotent=True).created
    assert replica.servicer.calls == 2
    once = serve([fails(ErrorReason.OUTCOME_UNKNOWN), answer()])
    with client_for(once) as client, pytest.raises(grpc.RpcError) as info:
        submit(client, idempotent=False)
    assert failure_of(info.value).reason is ErrorReason.OUTCOME_UNKNOWN
    assert once.servicer.calls == 1


@pytest.mark.parametrize(
    "reason",
    [
        ErrorReason.INVALID_FIELD,
        ErrorReason.JOB_NOT_FOUND,
        ErrorReason.NODE_NOT_FOUND,
        ErrorReason.CONFLICT,
        ErrorReason.INTERNAL,
    ],
)
def test_the_callers_errors_are_raised_at_once(
    serve: Callable[[list[Step]], Replica], reason: ErrorReason
) -> None:
    replica = serve([fails(reason), answer()])
    with client_for(replica) as client, pytest.raises(grpc.RpcError) as info:
        submit(client)
    assert failure_of(info.value).reason is reason
    assert replica.servicer.calls == 1
