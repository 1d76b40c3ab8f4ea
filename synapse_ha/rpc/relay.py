"""Relayed heartbeats (``ClusterConfig.relay_heartbeats``): followers terminate workers'
heartbeat streams and forward what they hear to the leader, one request per batch.

Why: a heartbeat on a stream costs the leader about 200 µs of CPU, almost all of it
grpc.aio's per-message read and write; one core saturates near 5,000 nodes while the
followers sit idle. With relaying, each follower holds a share of the streams (the
leader names one to each registering worker, spread by node id over the followers that
relayed lately: ``rpc/relay_table.py``) and sends the leader one ``RelayHeartbeats``
request per ``RELAY_PERIOD_S`` carrying every heartbeat it heard meanwhile
(:class:`RelayClient`).

The lease rule stands (DESIGN §4): a worker's lease is renewed only by the
acknowledgement of its own heartbeat, from when it sent it, and that acknowledgement
must prove that a serving leader heard the node after that moment. On a relayed stream:

1. the follower forwards the heartbeat only after receiving it, so after it was sent;
2. the leader records the node's liveness and commits its reports while it serves
   (``RelayHeartbeats`` is refused by a replica that does not), and answers with its term
   and the applied-command count of a state that holds those reports
   (:func:`relay_heartbeats`). The liveness is stamped when the follower received the
   heartbeat (the batch says how long ago, on the follower's monotonic clock), which is
   still after it was sent;
3. the follower acknowledges the heartbeat only after that answer, and builds the
   acknowledgement (node status, desired members) from its own state at or past that
   count, so never from a state older than the one the leader would have answered from.

Death detection is unchanged: a relayed node is stamped as heard when the follower
received its heartbeat, however long the batch then took to reach the leader. A follower that
cannot reach the leader acknowledges nothing: its workers' leases run out as they would
with a silent leader, unless they register again first (the leader then names another
replica's stream: :attr:`RegisterNodeRequest.unreachable_streams` and the table's
freshness). A follower's streams outlive leader changes; each acknowledgement carries
the term of the leader that confirmed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent import futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState
from synapse_ha.rpc.errors import ErrorReason, refusal_metadata
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.heartbeat import heartbeat_in, heartbeat_message
from synapse_ha.service.commit import settle
from synapse_ha.service.heartbeat import heartbeat
from synapse_ha.service.refusal import Refusal, node_not_found
from synapse_ha.service.replica import Replica

if TYPE_CHECKING:  # the servicers import this module
    from synapse_ha.rpc.server.context import ReplicaContext

RELAY_PERIOD_S = 0.15  # a follower sends what it heard at least this often
# ... and at least four times per heartbeat interval, so that an acknowledgement comes
# well within the interval a worker waits for it.
PERIODS_PER_INTERVAL = 4
RELAY_CALL_TIMEOUT_S = 2.0  # one RelayHeartbeats request
RELAY_WAIT_S = 2.0  # how long a heartbeat waits for a leader to be known, or caught up with
MAX_RELAYED = 20_000  # heartbeats in one request
# The most a relayed heartbeat's waited_ms counts: how long it may wait for a leader, and
# its request's time.
MAX_WAITED_MS = int((RELAY_WAIT_S + RELAY_CALL_TIMEOUT_S) * 1000)


# ------------------------------------------------------------------ the leader's side


def _refusal(index: int, refusal: Refusal) -> pb.RelayedRefusal:
    """A heartbeat's refusal as the follower ends that worker's stream with it."""
    return pb.RelayedRefusal(
        index=index,
        reason=str(refusal.code),
        message=refusal.words,
        metadata=refusal_metadata(refusal),
    )


def relay_heartbeats(
    replica: Replica, ctx: ReplicaContext, request: pb.RelayHeartbeatsRequest
) -> pb.RelayHeartbeatsResponse:
    """The serving leader's handling of one batch: every heartbeat is taken as a direct
    one is (:func:`synapse_ha.service.heartbeat.heartbeat`), heard when the follower
    received it; their commands are all proposed at once (group commit), then waited
    for. The answer names a state that holds them."""
    state = ctx.backend.snapshot()
    term = ctx.backend.term()
    if not state.config.relay_heartbeats:
        return pb.RelayHeartbeatsResponse(
            leader_term=term, applied_commands=state.applied_commands, relay=False
        )
    ctx.relays.heard(request.replica_id, request.stream_address)
    now = ctx.clock_ms()
    acked: list[int] = []
    refusals: list[pb.RelayedRefusal] = []
    waits: list[tuple[int, str, tuple[futures.Future[cmd.Result], ...]]] = []
    for index, relayed in enumerate(request.heartbeats):
        acked.append(0)
        message = heartbeat_message(relayed)
        beat = heartbeat_in(message)
        if isinstance(beat, Refusal):
            refusals.append(_refusal(index, beat))
            continue
        # Heard when the follower received it: after it was sent, as the lease rule needs.
        received = now - min(max(relayed.waited_ms, 0), MAX_WAITED_MS)
        taken = heartbeat(replica, beat, now, received, state)
        if isinstance(taken, Refusal):
            refusals.append(_refusal(index, taken))
            continue
        acked[index] = taken.acked_reports
        if taken.proposed:
            waits.append((index, message.node_id, taken.proposed))
    deadline = time.monotonic() + ctx.write_timeout_s
    for index, node_id, proposed in waits:
        refused = settle(proposed, deadline, node_not_found(node_id))
        if refused is not None:
            refusals.append(_refusal(index, refused))
    with ctx.backend.reading() as now_state:  # the index alone: no snapshot's copy
        applied = now_state.applied_commands
    return pb.RelayHeartbeatsResponse(
        leader_term=term,
        applied_commands=applied,
        acked_reports=acked,
        refusals=refusals,
        relay=True,
    )


# ---------------------------------------------------------------- a follower's side


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The leader's confirmation of one relayed heartbeat."""

    term: int
    applied_commands: int
    acked_reports: int


class RelayFailed(Exception):
    """A relayed heartbeat was not confirmed: end its stream with ``refusal``."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.words)
        self.refusal = refusal


def _failed(refusal: pb.RelayedRefusal) -> RelayFailed:
    """The leader's refusal of one heartbeat, as the follower ends its stream with."""
    try:
        reason = ErrorReason(refusal.reason)
    except ValueError:  # a newer leader's reason: register again to learn more
        reason = ErrorReason.NOT_LEADER
    return RelayFailed(Refusal(reason, refusal.message, metadata=dict(refusal.metadata)))


@dataclass(slots=True)
class _Entry:
    heartbeat: pb.RelayedHeartbeat
    future: asyncio.Future[Confirmed]
    queued_at: float


class RelayClient:
    """A follower's relay, on its heartbeat-stream event loop: heartbeats queued by the
    stream handlers, sent to the leader in one request per batch (a report wakes it at
    once), each handler woken with its confirmation or failure."""

    def __init__(self, ctx: ReplicaContext, *, period_s: float = RELAY_PERIOD_S) -> None:
        self.ctx = ctx
        self.period_s = period_s
        self.batches = 0  # requests the leader answered
        self.relayed = 0  # heartbeats it confirmed
        self.failed = 0  # heartbeats not relayed (their streams end)
        self.leader_relays = True  # the leader's last answer said relaying is on
        self._pending: list[_Entry] = []
        self._wake: asyncio.Event | None = None
        self._channels: dict[str, grpc.Channel] = {}

    def switched_on(self) -> bool:
        """The switch is on in this replica's state, and it serves streams."""
        return bool(self.ctx.stream_address and self.ctx.backend.cluster_config().relay_heartbeats)

    def may_relay(self) -> bool:
        """Whether this replica should hold relayed streams now: switched on, and the
        leader's last answer did not say otherwise."""
        return self.leader_relays and self.switched_on()

    async def relay(self, heartbeat: pb.RelayedHeartbeat) -> Confirmed:
        """Queue ``heartbeat`` for the next batch; its confirmation (or RelayFailed)."""
        future: asyncio.Future[Confirmed] = asyncio.get_running_loop().create_future()
        self._pending.append(_Entry(heartbeat, future, time.monotonic()))
        if heartbeat.heartbeat.reports and self._wake is not None:
            self._wake.set()
        return await future

    async def caught_up(self, applied_commands: int) -> ClusterState:
        """This replica's state once it has applied ``applied_commands`` commands."""
        deadline = time.monotonic() + RELAY_WAIT_S
        while True:
            state = self.ctx.backend.snapshot()
            if state.applied_commands >= applied_commands:
                return state
            if time.monotonic() >= deadline:
                self.failed += 1
                raise RelayFailed(
                    Refusal(
                        ErrorReason.NOT_LEADER,
                        f"replica {self.ctx.self_id} is behind the leader; register again",
                    )
                )
            await asyncio.sleep(0.005)

    async def run(self) -> None:
        """Send a batch every period (or at once when a report waits), until cancelled;
        an empty one while switched on tells the leader this replica relays (and asks
        whether the leader agrees)."""
        self._wake = asyncio.Event()
        try:
            while True:
                interval_s = (
                    self.ctx.backend.snapshot().config.timeouts.heartbeat_interval_ms / 1000
                )
                period_s = min(self.period_s, interval_s / PERIODS_PER_INTERVAL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), period_s)
                self._wake.clear()
                await self._send()
        finally:
            self._fail(self._pending, "this replica is stopping")
            self._pending = []
            for channel in self._channels.values():
                channel.close()

    def _leader_stub(self) -> Any:
        leader = self.ctx.by_raft(self.ctx.backend.leader_address())
        if leader is None or leader.replica_id == self.ctx.self_id:
            return None
        channel = self._channels.get(leader.grpc)
        if channel is None:
            channel = self._channels[leader.grpc] = self.ctx.peer_channel(leader.grpc)
        return pb_grpc.NodeAgentServiceStub(channel)  # type: ignore[no-untyped-call]

    async def _send(self) -> None:
        entries, self._pending = self._pending, []
        if not entries and not self.switched_on():
            return
        stub = self._leader_stub()
        if stub is None:  # no leader known: wait for one, a while
            oldest = time.monotonic() - RELAY_WAIT_S
            self._fail([e for e in entries if e.queued_at < oldest], "no leader is known")
            self._pending = [e for e in entries if e.queued_at >= oldest] + self._pending
            return
        sent_at = time.monotonic()
        for entry in entries:
            entry.heartbeat.waited_ms = int((sent_at - entry.queued_at) * 1000)
        request = pb.RelayHeartbeatsRequest(
            replica_id=self.ctx.self_id,
            stream_address=self.ctx.stream_address,
            heartbeats=[e.heartbeat for e in entries],
        )
        try:
            answer = await asyncio.to_thread(
                stub.RelayHeartbeats, request, timeout=RELAY_CALL_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            self._fail(entries, f"the leader did not confirm them ({exc.code()}: {exc.details()})")
            return
        self.batches += 1
        self.leader_relays = answer.relay
        if not answer.relay or len(answer.acked_reports) != len(entries):
            self._fail(entries, "the leader does not take relayed heartbeats")
            return
        refused = {r.index: r for r in answer.refusals}
        term, applied = answer.leader_term, answer.applied_commands
        for index, (entry, acked) in enumerate(zip(entries, answer.acked_reports, strict=True)):
            if entry.future.done():
                continue
            refusal = refused.get(index)
            if refusal is not None:
                entry.future.set_exception(_failed(refusal))
            else:
                self.relayed += 1
                entry.future.set_result(Confirmed(term, applied, acked))

    def _fail(self, entries: list[_Entry], why: str) -> None:
        refusal = Refusal(
            ErrorReason.NOT_LEADER,
            f"replica {self.ctx.self_id} could not relay this heartbeat: {why}; register again",
        )
        for entry in entries:
            if not entry.future.done():
                self.failed += 1
                entry.future.set_exception(RelayFailed(refusal))
