"""``SubmitJobs``: many submissions in one call against an in-process replica with the
auth interceptor (tests/rpc/authed.py). Every job is checked before any is proposed; a
refusal names the job (``jobs[i]``) and makes nothing; each job keeps its request id."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import grpc
import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import Limits, Queue
from synapse_ha.core.machine import apply
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import NOW, Replica, serving_replica
from tests.rpc.test_access import credentials


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def item(name: str, request_id: str, cpu_milli: int = 100, queue: str = "") -> pb.SubmitJobRequest:
    spec = pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=cpu_milli),
        shell_command="true",
        queue=queue,
    )
    return pb.SubmitJobRequest(spec=spec, request_id=request_id)


def submit(replica: Replica, who: str, *items: pb.SubmitJobRequest) -> pb.SubmitJobsResponse:
    answer: pb.SubmitJobsResponse = replica.scheduler.SubmitJobs(
        pb.SubmitJobsRequest(jobs=list(items)), metadata=credentials(replica, who), timeout=10
    )
    return answer


def refused(replica: Replica, who: str, *items: pb.SubmitJobRequest) -> grpc.RpcError:
    jobs_before = set(replica.backend.state.jobs)
    with pytest.raises(grpc.RpcError) as caught:
        submit(replica, who, *items)
    assert set(replica.backend.state.jobs) == jobs_before  # nothing was made
    return caught.value


def test_the_jobs_are_made_in_order_and_a_retry_makes_none_again(replica: Replica) -> None:
    items = [item(f"batch-{i}", f"batch-req-{i}") for i in range(3)]
    first = submit(replica, "alice", *items)
    assert [a.created for a in first.jobs] == [True, True, True]
    state = replica.backend.state
    assert [state.jobs[a.job_id].spec.name for a in first.jobs] == ["batch-0", "batch-1", "batch-2"]
    assert {state.jobs[a.job_id].owner for a in first.jobs} == {"alice"}
    again = submit(replica, "alice", *items)
    assert [(a.job_id, a.created) for a in again.jobs] == [(a.job_id, False) for a in first.jobs]


def test_a_job_breaking_a_rule_is_named_and_nothing_is_made(replica: Replica) -> None:
    error = refused(
        replica, "alice", item("ok", "r-ok"), item("bad", "r-bad", cpu_milli=-5), item("x", "r-x")
    )
    failure = failure_of(error)
    assert failure.reason is ErrorReason.INVALID_FIELD
    assert failure.message.startswith("jobs[1]: ")
    assert failure.metadata["field"] == "jobs[1].resources.cpu"
    assert [v.field for v in failure.violations] == ["jobs[1].resources.cpu"]


def test_a_queue_that_does_not_exist_is_refused_for_that_job(replica: Replica) -> None:
    assert apply(replica.backend.state, cmd.SetQueue(Queue("gold", gpu=4), NOW)).ok
    error = refused(replica, "bob", item("a", "q-a"), item("b", "q-b", queue="nope"))
    failure = failure_of(error)
    assert failure.reason is ErrorReason.INVALID_FIELD, failure.message
    assert failure.message.startswith("jobs[1]: queue: no queue 'nope'")


def test_an_empty_or_oversized_call_is_refused(replica: Replica) -> None:
    empty = failure_of(refused(replica, "alice"))
    assert empty.reason is ErrorReason.INVALID_FIELD and empty.metadata["field"] == "jobs"
    many = [item(f"m{i}", f"m{i}") for i in range(1_001)]
    big = failure_of(refused(replica, "admin", *many))
    assert big.reason is ErrorReason.INVALID_FIELD and "at most 1000 jobs a call" in big.message


def test_a_users_batch_is_charged_job_by_job_against_the_submit_rate(replica: Replica) -> None:
    state = replica.backend.state
    limits = dataclasses.replace(state.config.limits, submit_burst=3, submit_per_s=1)
    config = dataclasses.replace(state.config, limits=limits)
    assert apply(state, cmd.Configure(config, NOW)).ok
    assert Limits().submit_burst > 3  # the test lowers it
    over = failure_of(refused(replica, "alice", *[item(f"o{i}", f"o{i}") for i in range(4)]))
    assert over.reason is ErrorReason.LIMIT_EXCEEDED
    assert "may submit at most limits.submit_burst (3) jobs at once; this call has 4" in (
        over.message
    )
    made = submit(replica, "alice", *[item(f"k{i}", f"k{i}") for i in range(3)])
    assert len(made.jobs) == 3
    # The bucket is empty now: one more job waits for the rate.
    later = failure_of(refused(replica, "alice", item("late", "late")))
    assert later.reason is ErrorReason.LIMIT_EXCEEDED and "submits faster than" in later.message
    # Admins are not limited by it.
    assert len(submit(replica, "admin", *[item(f"a{i}", f"a{i}") for i in range(5)]).jobs) == 5
