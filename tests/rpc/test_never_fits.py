"""A job no set of the cluster's nodes could ever hold is refused through the real gRPC
submit path (in-process replica with the auth interceptor, tests/rpc/authed.py: two
nodes of 2 GPUs), with what is missing; ``wait_for_nodes`` lets it wait instead."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import NOW, Replica, serving_replica
from tests.rpc.test_access import credentials


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def raise_format(replica: Replica) -> None:
    assert replica.backend.propose(cmd.RaiseFormat(FORMAT, ("r1",), NOW)).result().ok


def request(name: str, gpu: int, replicas: int = 1, wait: bool = False) -> pb.SubmitJobRequest:
    spec = pb.JobSpec(
        name=name,
        replicas=replicas,
        resources=pb.Resources(cpu_milli=100, gpu=gpu),
        shell_command="true",
        wait_for_nodes=wait,
    )
    return pb.SubmitJobRequest(spec=spec, request_id=f"req-{name}")


def submit(replica: Replica, item: pb.SubmitJobRequest) -> pb.SubmitJobResponse:
    answer: pb.SubmitJobResponse = replica.scheduler.SubmitJob(
        item, metadata=credentials(replica, "alice"), timeout=10
    )
    return answer


def test_a_job_no_node_could_hold_is_refused_with_what_is_missing(replica: Replica) -> None:
    raise_format(replica)
    before = set(replica.backend.state.jobs)
    with pytest.raises(grpc.RpcError) as caught:
        submit(replica, request("big", gpu=3))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    failure = failure_of(caught.value)
    assert failure.reason is ErrorReason.INVALID_FIELD
    assert "no node has 3 GPUs; the largest has 2" in failure.message
    assert "wait_for_nodes" in failure.message
    with pytest.raises(grpc.RpcError) as caught:
        submit(replica, request("wide", gpu=2, replicas=3))
    assert "needs 3 nodes with 2 GPUs; the cluster has 2" in failure_of(caught.value).message
    assert set(replica.backend.state.jobs) == before  # nothing was made


def test_wait_for_nodes_is_accepted_through_the_api(replica: Replica) -> None:
    raise_format(replica)
    job_id = submit(replica, request("big", gpu=3, wait=True)).job_id
    job = replica.backend.state.jobs[job_id]
    assert job.spec.wait_for_nodes is True


def test_below_the_format_the_flag_is_moot_and_dropped(replica: Replica) -> None:
    # A replica of an older release may still run: nothing is refused for never fitting,
    # and the flag, which it could not read, is not replicated.
    assert replica.backend.state.format_floor < FORMAT
    job_id = submit(replica, request("big", gpu=3, wait=True)).job_id
    assert replica.backend.state.jobs[job_id].spec.wait_for_nodes is False
    assert replica.backend.state.jobs[job_id].reason.code is not ReasonCode.WAITING_FOR_NODES
