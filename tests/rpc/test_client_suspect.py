"""A replica that does not answer at all (a frozen or cut-off leader, which closes no
connection) is suspect: calls start elsewhere, NOT_LEADER redirects to it are not
followed while other replicas may answer, tries there are short, and it is trusted again
as soon as it answers."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.errors import ErrorReason
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.test_errors import Replica, Step, answer, fails, serve, submit

__all__ = ["serve"]


@pytest.fixture
def thaw() -> Iterator[threading.Event]:
    """Set on the way out: every frozen step returns then."""
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


def frozen(thaw: threading.Event) -> Step:
    """Answers nothing until the test ends (a stopped process whose socket accepts)."""

    def step(context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        thaw.wait(10.0)
        return pb.SubmitJobResponse(job_id="stale")

    return step


def not_leader(leader: Replica) -> Step:
    return fails(ErrorReason.NOT_LEADER, leader_address=leader.address, leader_id="old")


def _client(*replicas: Replica, timeout_s: float) -> ClusterClient:
    """Without hedging: the suspects alone (hedged calls: test_client_hedging)."""
    return ClusterClient(
        [r.address for r in replicas],
        timeout_s=timeout_s,
        per_try_timeout_s=timeout_s,
        backoff_s=0.001,
        max_backoff_s=0.002,
        rng=random.Random(7),
        suspect_try_s=0.2,
        hedge_s=None,
    )


def test_a_silent_leader_is_not_asked_first_nor_followed_back_to(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event
) -> None:
    old = serve([frozen(thaw)])
    follower = serve([answer("placeholder")])
    new = serve([answer("job-new")])
    follower.servicer.script = [not_leader(old)]
    with _client(old, follower, new, timeout_s=1.0) as client:
        # The whole first call goes to the leader that stopped answering.
        with pytest.raises(Exception, match="no replica answered"):
            submit(client)
        assert old.servicer.calls == 1
        assert client.leader_hint != old.address
        # The next call starts elsewhere; the follower's redirect to the silent leader is
        # not followed, the next replica is asked instead.
        assert submit(client).job_id == "job-new"
        assert old.servicer.calls == 1
        assert client.leader_hint == new.address


def test_a_replica_reported_silent_is_asked_last_and_briefly(
    serve: Callable[[list[Step]], Replica], thaw: threading.Event
) -> None:
    old = serve([frozen(thaw)])
    new = serve([fails(ErrorReason.NO_LEADER), answer("job-new")])
    follower = serve([not_leader(old)])
    with _client(old, follower, new, timeout_s=5.0) as client:
        client.suspect(old.address)
        # follower (redirect to the suspect: next), new (no leader yet: next), old (a
        # short try), follower again, new (elected).
        assert submit(client).job_id == "job-new"
        assert old.servicer.calls == 1
        assert new.servicer.calls == 2


def test_a_suspect_that_answers_is_trusted_again(
    serve: Callable[[list[Step]], Replica],
) -> None:
    leader = serve([answer("job-leader")])
    follower = serve([not_leader(leader)])
    with _client(leader, follower, timeout_s=5.0) as client:
        client.suspect(leader.address)
        assert client.leader_hint == follower.address
        # The follower names the suspect; after a round it is tried, and it answers.
        assert submit(client).job_id == "job-leader"
        assert client.leader_hint == leader.address
        leader.servicer.calls = 0
        follower.servicer.calls = 0
        assert submit(client).job_id == "job-leader"
        assert (leader.servicer.calls, follower.servicer.calls) == (1, 0)
