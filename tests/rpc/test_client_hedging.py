"""Hedged calls: a replica that has not answered within the hedge delay is left running
and the next replica is asked too; the first definitive answer wins. A frozen replica
(its socket accepts, nothing answers) then costs the hedge delay, not the per-try
deadline, and a healthy call still goes to one replica only.

The replicas are in-process gRPC servers on 127.0.0.1 whose answers are scripted; the
per-try deadlines are long, so that a client that waited one out would fail the test by
its duration, never pass it by luck."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from synapse_ha.client.attempts import Workers
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.local.waiting import wait_until
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.test_client_suspect import frozen, not_leader, thaw
from tests.rpc.test_errors import Replica, Step, answer, fails, serve, submit

__all__ = ["serve", "thaw"]

PER_TRY_S = 20.0  # what a client that waited on a frozen replica would lose
HEDGE_S = 0.05


def _client(
    *replicas: Replica,
    per_try_s: float = PER_TRY_S,
    timeout_s: float = 30.0,
    hedge_s: float = HEDGE_S,
    backoff_s: float = 0.001,
    max_backoff_s: float = 0.002,
) -> ClusterClient:
    return ClusterClient(
        [r.address for r in replicas],
        timeout_s=timeout_s,
        per_try_timeout_s=per_try_s,
        backoff_s=backoff_s,
        max_backoff_s=max_backoff_s,
        election_backoff_s=0.2,
        rng=random.Random(7),
        hedge_s=hedge_s,
    )


def slow(seconds: float, job_id: str) -> Step:
    """A leader that takes ``seconds`` to answer (busy, not frozen)."""

    def step(context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        time.sleep(seconds)
        return pb.SubmitJobResponse(job_id=job_id, created=True)

    return step


def _timed(call: Callable[[], pb.SubmitJobResponse]) -> tuple[pb.SubmitJobResponse, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


def test_a_frozen_first_replica_costs_the_hedge_delay_not_the_per_try_deadline(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event
) -> None:
    old = serve([frozen(thaw)])
    new = serve([answer("job-new")])
    with _client(old, new) as client:
        got, took = _timed(lambda: submit(client))
        assert got.job_id == "job-new"
        assert took < PER_TRY_S / 2
        assert (old.servicer.calls, new.servicer.calls) == (1, 1)
        assert client.leader_hint == new.address


def test_a_redirect_to_a_replica_still_silent_is_not_followed(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event
) -> None:
    """A fresh client during an election: a follower names the frozen leader until it
    has elected another; the frozen one is asked once, never waited on again."""
    old = serve([frozen(thaw)])
    new = serve([fails(ErrorReason.NO_LEADER), answer("job-new")])
    follower = serve([not_leader(old)])
    with _client(follower, old, new) as client:
        # follower (to old), old (silent: hedged), new (no leader yet), follower (to
        # old, still silent: next), new (elected).
        got, took = _timed(lambda: submit(client))
        assert got.job_id == "job-new"
        assert took < PER_TRY_S / 2
        assert old.servicer.calls == 1
        assert follower.servicer.calls == 2
        assert new.servicer.calls == 2


def test_a_healthy_call_is_sent_to_one_replica_only(
    serve: Callable[[list[Step]], Replica],
) -> None:
    leader = serve([answer("job-leader")])
    followers = [serve([not_leader(leader)]) for _ in range(2)]
    with _client(leader, *followers, hedge_s=1.0) as client:
        for _ in range(20):
            assert submit(client).job_id == "job-leader"
    assert leader.servicer.calls == 20
    assert [f.servicer.calls for f in followers] == [0, 0]


def test_a_slow_leader_answers_and_is_never_asked_twice(
    serve: Callable[[list[Step]], Replica],
) -> None:
    leader = serve([slow(0.4, "job-leader")])
    followers = [serve([not_leader(leader)]) for _ in range(2)]
    with _client(leader, *followers, backoff_s=0.05, max_backoff_s=1.0) as client:
        assert submit(client).job_id == "job-leader"
        assert client.leader_hint == leader.address
    assert leader.servicer.calls == 1
    # While it works, its followers are asked a few times an election back-off (they
    # name it, so it is not asked again), not in a loop.
    asked = sum(f.servicer.calls for f in followers)
    assert 1 <= asked <= 20, asked


@pytest.mark.parametrize(
    ("idempotent", "hedge"), [(False, True), (True, False)], ids=["not-idempotent", "no-hedge"]
)
def test_a_call_that_must_not_be_sent_twice_waits_for_the_replica_asked(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event, idempotent: bool, hedge: bool
) -> None:
    old = serve([frozen(thaw)])
    new = serve([answer("job-new")])
    request = pb.SubmitJobRequest(spec=pb.JobSpec(name="a"), request_id="r1")
    with _client(old, new, per_try_s=0.3) as client:

        def once() -> pb.SubmitJobResponse:
            response: pb.SubmitJobResponse = client.call(
                "SubmitJob",
                lambda a, t: client.scheduler(a).SubmitJob(request, timeout=t),
                idempotent=idempotent,
                hedge=hedge,
            )
            return response

        if idempotent:  # retried after the per-try deadline, never alongside
            got, took = _timed(once)
            assert got.job_id == "job-new"
            assert took >= 0.3
        else:
            with pytest.raises(grpc.RpcError) as info:
                once()
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert new.servicer.calls == 0
    assert old.servicer.calls == 1


def test_a_refusal_from_the_next_replica_ends_the_call(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event
) -> None:
    old = serve([frozen(thaw)])
    new = serve([fails(ErrorReason.INVALID_FIELD, field="name", rule="is required")])
    with _client(old, new) as client, pytest.raises(grpc.RpcError) as info:
        submit(client)
    assert failure_of(info.value).reason is ErrorReason.INVALID_FIELD


def test_when_no_replica_answers_the_error_names_each_one_tried(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event
) -> None:
    replicas = [serve([frozen(thaw)]) for _ in range(2)]
    with _client(*replicas, per_try_s=0.4, timeout_s=0.4) as client:
        with pytest.raises(ClusterUnavailable) as info:
            submit(client)
        message = str(info.value)
    assert "SubmitJob: no replica answered before the deadline" in message
    for r in replicas:
        assert f"{r.address}: DEADLINE_EXCEEDED" in message, message
    assert [r.servicer.calls for r in replicas] == [1, 1]


def test_a_replica_silent_after_the_call_was_answered_becomes_suspect(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event
) -> None:
    old = serve([frozen(thaw)])
    new = serve([answer("job-new")])
    with _client(old, new, per_try_s=0.3) as client:
        assert submit(client).job_id == "job-new"
        wait_until("the silent replica suspect", lambda: old.address in client.suspects, 10.0)


def test_idle_threads_are_reused() -> None:
    workers = Workers()
    release = threading.Event()
    running = threading.Barrier(4, timeout=10.0)

    def task() -> None:
        running.wait()
        release.wait(10.0)

    for _ in range(3):
        workers.run(task)
    running.wait()  # three tasks run side by side: three threads
    release.set()
    assert workers.started == 3
    wait_until("the threads idle", lambda: workers.idle == 3, 10.0)
    running.reset()
    release.clear()
    for _ in range(3):
        workers.run(task)
    running.wait()
    release.set()
    assert workers.started == 3


def test_closed_workers_end_their_threads_and_still_run_what_comes() -> None:
    workers = Workers()
    ran = [threading.Event() for _ in range(2)]
    workers.run(ran[0].set)
    assert ran[0].wait(10.0)
    wait_until("the thread idle", lambda: workers.idle == 1, 10.0)
    workers.close()
    wait_until("the idle thread ended", lambda: workers.threads == 0, 10.0)
    workers.run(ran[1].set)  # on a thread of its own, which then ends
    assert ran[1].wait(10.0)
    wait_until("that thread ended", lambda: workers.threads == 0, 10.0)
