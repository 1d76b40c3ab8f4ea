"""Follower reads (docs/consistency.md): a follower serves a read that carries a read
token only once it has applied that index, while it follows a live leader, waiting a
bounded time to catch up; otherwise it redirects. Every answer carries its index, and
the client's :class:`ReadToken` keeps the newest and sends it."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import grpc
import pytest

from synapse_ha.client.token import INDEX_KEY, MIN_INDEX_KEY, ReadToken
from synapse_ha.core.model import ClusterState
from synapse_ha.rpc.errors import LEADER_METADATA_KEY
from synapse_ha.rpc.server.context import ReplicaAddress, ReplicaContext, Servicer

LEADER = "127.0.0.1:8001"  # the leader's gRPC address


class Aborted(Exception):
    def __init__(self, status: Any) -> None:
        self.status = status


class Context:
    """The parts of a servicer context a read uses."""

    def __init__(self, token: int | None, remaining_s: float = 5.0) -> None:
        self.metadata = [] if token is None else [(MIN_INDEX_KEY, str(token))]
        self.remaining_s = remaining_s
        self.trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def time_remaining(self) -> float:
        return self.remaining_s

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    def abort_with_status(self, status: Any) -> None:
        raise Aborted(status)


class Follower:
    """A follower's backend whose applied index advances by ``step`` at each look."""

    def __init__(self, applied: int, step: int = 0) -> None:
        self.applied = applied
        self.step = step
        self.looks = 0

    def snapshot(self) -> ClusterState:
        self.looks += 1
        state = ClusterState(applied_commands=self.applied)
        self.applied += self.step
        return state

    def reading(self) -> AbstractContextManager[ClusterState]:
        return nullcontext(self.snapshot())

    def is_leader(self) -> bool:
        return False

    def leader_address(self) -> str:
        return "127.0.0.1:7001"


def replica(backend: Follower, live_leader: bool = True, wait_s: float = 0.2) -> Servicer:
    ctx = ReplicaContext(
        self_id="r2",
        replicas=[ReplicaAddress("r1", "127.0.0.1:7001", LEADER), ReplicaAddress("r2", "", "")],
        backend=backend,  # type: ignore[arg-type]
        liveness=None,  # type: ignore[arg-type]
        serving=lambda: False,
        clock_ms=lambda: 0,
        follows_live_leader=lambda: live_leader,
        follower_read_wait_s=wait_s,
    )
    return Servicer(ctx)


def redirected(base: Servicer, context: Context, **kw: Any) -> bool:
    """Whether the read ended in NOT_LEADER naming the leader's address."""
    with pytest.raises(Aborted) as ended:
        base._read_mode(context, allow_stale=False, **kw)  # type: ignore[arg-type]
    status = ended.value.status
    return (
        status.code is grpc.StatusCode.FAILED_PRECONDITION
        and (LEADER_METADATA_KEY, LEADER) in tuple(status.trailing_metadata)
        and not context.trailing  # no index: nothing was served
    )


def test_a_follower_serves_a_token_it_has_applied_and_says_its_index() -> None:
    context = Context(token=5)
    assert replica(Follower(applied=7))._read_mode(context, allow_stale=False) is True  # type: ignore[arg-type]
    assert context.trailing == ((INDEX_KEY, "7"),)


def test_a_follower_behind_the_token_waits_for_it() -> None:
    backend = Follower(applied=3, step=2)
    context = Context(token=9)
    assert replica(backend)._read_mode(context, allow_stale=False) is True  # type: ignore[arg-type]
    assert int(context.trailing[0][1]) >= 9 and backend.looks == 4


def test_a_follower_that_does_not_catch_up_redirects_to_the_leader() -> None:
    assert redirected(replica(Follower(applied=3), wait_s=0.05), Context(token=4))


@pytest.mark.parametrize(
    ("token", "live", "follower"),
    [(None, True, True), (1, False, True), (1, True, False)],
    ids=["no-token", "no-live-leader", "leader-only-read"],
)
def test_otherwise_a_follower_redirects(token: int | None, live: bool, follower: bool) -> None:
    assert redirected(replica(Follower(applied=10), live), Context(token), follower=follower)


def test_the_wait_ends_with_the_calls_deadline() -> None:
    backend = Follower(applied=0, step=0)
    assert redirected(replica(backend, wait_s=30.0), Context(token=1, remaining_s=0.1))
    assert backend.looks < 100  # bounded by the deadline (0.1 s), not by the 30 s wait


class Outcome:
    def __init__(self, trailing: tuple[tuple[str, str], ...]) -> None:
        self.trailing = trailing

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.trailing

    def done(self) -> bool:
        return True  # a blocking call's outcome: complete when the continuation returns


class Details(grpc.ClientCallDetails):
    def __init__(self) -> None:
        self.method = "/synapse.v1.SchedulerService/GetJob"
        self.timeout = 1.0
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", "Bearer x"),)
        self.credentials = None
        self.wait_for_ready = None
        self.compression = None


def test_the_client_keeps_the_newest_index_and_sends_it_when_asked() -> None:
    token = ReadToken()
    sent: list[Any] = []

    def answer(index: str) -> Any:
        def continuation(details: Any, request: Any) -> Outcome:
            sent.append(dict(details.metadata))
            return Outcome(((INDEX_KEY, index),))

        return continuation

    token.intercept_unary_unary(answer("12"), Details(), None)
    token.intercept_unary_unary(answer("7"), Details(), None)  # an older state: kept 12
    assert token.index == 12 and MIN_INDEX_KEY not in sent[0]
    token.send = True
    token.intercept_unary_unary(answer("13"), Details(), None)
    assert sent[2][MIN_INDEX_KEY] == "12" and sent[2]["authorization"] == "Bearer x"
    assert token.index == 13
