"""Where one call of :class:`~synapse_ha.client.cluster.ClusterClient` goes after an
attempt fails, and how long it pauses first: the rules of that module's docstring, as
:class:`Route` applies them to one call.

Replicas with an attempt of the call still in flight (*busy*: a hedged call left them
running, :mod:`synapse_ha.client.attempts`) are skipped: the rotation passes over them,
a redirect to one is taken as NO_LEADER (the followers name it until they elect
another), and a round without an answer counts only the replicas that could be asked.
A call that is not hedged never has a replica busy when it is steered.

With the client's ``fail_fast``, a call gives up as soon as every replica's latest
attempt failed to connect for a cause that waiting does not cure (refused, a name that
does not resolve, a failed TLS handshake: :func:`~synapse_ha.client.unavailable.cause_of`)
and none is still in flight, instead of retrying until the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from synapse_ha.client.suspects import as_no_leader, silent
from synapse_ha.client.unavailable import Cause, ClusterUnavailable, cause_of
from synapse_ha.rpc.errors import Reason, RpcFailure, failure_of

if TYPE_CHECKING:
    from synapse_ha.client.cluster import ClusterClient

# Reasons after which the same call is sent again (to the next replica, or the leader).
MOVE_ON = frozenset({Reason.NO_LEADER, Reason.NOT_COMMITTED})
# Reasons after which the same replica is asked again after a back-off; but a leader
# that names followers (``read_from``) for a read one of them can serve is left for them.
WAIT_HERE = frozenset({Reason.LEADER_NOT_READY, Reason.OVERLOADED, Reason.LEADER_STEPPING_DOWN})
# Reasons that say a leader is being elected or is committing its barrier right now.
ELECTING = frozenset({Reason.NO_LEADER, Reason.LEADER_NOT_READY})


@dataclass(eq=False)
class Route:
    """The course of one call until ``deadline`` (monotonic): what each replica
    answered (``attempts``, for :class:`ClusterUnavailable`), the failures in this round
    and the back-off reached."""

    client: ClusterClient
    method: str
    idempotent: bool
    deadline: float
    attempts: list[tuple[str, str]] = field(default_factory=list, init=False)
    failures_in_round: int = field(default=0, init=False)
    backoff: float = field(init=False)
    tried_briefly: set[str] = field(default_factory=set, init=False)
    # address -> why its latest attempt got no answer
    causes: dict[str, Cause] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.backoff = self.client.backoff_s

    def per_try(self, address: str, now: float) -> float:
        """The deadline of the attempt at ``address`` sent ``now`` (<= 0: too late). The
        first try at a suspect in a call is brief: it may only be slow."""
        per_try = min(self.client.per_try_timeout_s, self.deadline - now)
        if address in self.client.suspects and address not in self.tried_briefly:
            self.tried_briefly.add(address)
            per_try = min(per_try, self.client.suspects.try_s)
        return per_try

    def hedged(self, address: str, busy: Collection[str]) -> str | None:
        """The replica to ask while ``address`` is left to answer (None: every one is
        busy)."""
        return self.next_free(address, busy)

    def next_free(self, address: str, busy: Collection[str]) -> str | None:
        """The address after ``address`` in the rotation that is not ``busy``."""
        candidate = address
        for _ in range(len(self.client.addresses)):
            candidate = self.client.next_address(candidate)
            if candidate not in busy:
                return candidate
        return None

    def failed(
        self, address: str, error: Exception, busy: Collection[str], *, steer: bool = True
    ) -> tuple[str | None, float]:
        """Record that the attempt at ``address`` raised ``error``. Raises it when the
        call must not be sent again; else the replica to ask next (None: every one is
        busy) and the pause before. Without ``steer`` (an attempt the call has moved on
        from) only the record is kept."""
        if not isinstance(error, grpc.RpcError):
            raise error
        failure = failure_of(error)
        self.attempts.append((address, failure.describe()))
        cause = cause_of(failure)
        if cause is None:
            self.causes.pop(address, None)
        else:
            self.causes[address] = cause
            if self.client.fail_fast and self.hopeless(busy):
                raise self.unavailable(busy, fast=True)
        hint = failure.metadata.get("leader_address", "")
        if failure.reason is Reason.NOT_LEADER and hint:
            self.client.learn(hint)
            if hint not in self.client.suspects and hint not in busy:
                return (hint, 0.0) if steer else (None, 0.0)
            failure = as_no_leader(failure)  # named by followers until they elect
        elif silent(failure):
            self.client.suspect(address)
        if not retriable(failure, self.idempotent):
            raise error
        if not steer:
            return None, 0.0
        self.failures_in_round += 1
        free = [a for a in self.client.addresses if a not in busy]
        if failure.reason in WAIT_HERE and not failure.metadata.get("read_from"):
            self.failures_in_round = max(1, len(free))  # back off, then ask it again
            following: str | None = address
        else:
            following = self.next_free(address, busy)
        if self.failures_in_round < max(1, len(free)):
            return following, 0.0
        self.failures_in_round = 0
        return following, self._pause(failure)

    def _pause(self, failure: RpcFailure) -> float:
        """The back-off after a round without an answer (exponential, with jitter; short
        while a leader is being elected), never past the deadline."""
        pause = min(self.backoff, max(0.0, self.deadline - time.monotonic()))
        if failure.reason in ELECTING:
            pause = min(pause, self.client.election_backoff_s)
        self.backoff = min(self.backoff * 2, self.client.max_backoff_s)
        return self.client.rng.uniform(pause / 2, pause)

    def hopeless(self, busy: Collection[str]) -> bool:
        """Every replica's latest attempt failed to connect (:attr:`causes`) and none is
        in flight: no answer can come before the deadline."""
        return not busy and all(a in self.causes for a in self.client.addresses)

    def unavailable(self, busy: Collection[str], *, fast: bool = False) -> ClusterUnavailable:
        """The error once the deadline has passed (or, ``fast``, once :meth:`hopeless`):
        every address tried and what it answered (an attempt still unanswered says so),
        and why those that could not be reached could not."""
        silent_to_the_end = [(a, "no answer before the deadline") for a in sorted(busy)]
        return ClusterUnavailable(
            self.method,
            [*self.attempts, *silent_to_the_end],
            causes={a: self.causes[a] for a in self.client.addresses if a in self.causes},
            fast=fast,
            secure=self.client.secure,
        )


def retriable(failure: RpcFailure, idempotent: bool) -> bool:
    """Whether the call may be sent again: a replica that could not take it (no leader,
    not committed, a barrier pending, or no answer at all), or, for an idempotent call, an
    unknown outcome."""
    if failure.reason in MOVE_ON or failure.reason in WAIT_HERE:
        return True
    if failure.reason is Reason.OUTCOME_UNKNOWN:
        return idempotent
    if failure.reason is not Reason.UNKNOWN:
        return False
    # No ErrorInfo: the transport answered (replica down, or the per-try deadline passed).
    if failure.code is grpc.StatusCode.UNAVAILABLE:
        return True
    return failure.code is grpc.StatusCode.DEADLINE_EXCEEDED and idempotent
