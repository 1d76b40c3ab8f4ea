"""A request whose bytes are not a message of its method is refused as an invalid
``request`` once its caller is checked (rpc/auth.py), and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from synapse_ha.rpc.errors import ErrorReason, failure_of
from tests.rpc.authed import Replica, serving_replica
from tests.rpc.test_access import credentials


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


@pytest.mark.parametrize("who", ["alice", "nobody"])
@pytest.mark.parametrize(
    "method", ["/synapse.v1.SchedulerService/SubmitJob", "/synapse.v1.SchedulerService/ListJobs"]
)
def test_an_undecodable_request_is_refused_once_its_caller_is_checked(
    replica: Replica, who: str, method: str
) -> None:
    jobs_before = set(replica.backend.state.jobs)
    raw = replica.channel.unary_unary(method)
    with pytest.raises(grpc.RpcError) as refused:
        raw(b"\xff\xff\xff\xff", metadata=credentials(replica, who), timeout=5)
    failure = failure_of(refused.value)
    if who == "nobody":
        assert failure.reason is ErrorReason.UNAUTHENTICATED
    else:
        assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
        assert failure.reason is ErrorReason.INVALID_FIELD
        assert failure.field == "request"
        assert "is not a message of this method" in failure.message
    assert set(replica.backend.state.jobs) == jobs_before
