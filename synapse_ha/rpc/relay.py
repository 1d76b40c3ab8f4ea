"""Relayed heartbeats (``ClusterConfig.relay_heartbeats``): followers terminate workers'
heartbeat streams and forward what they hear to the leader, one request per batch.

Why: a heartbeat on a stream costs the leader about 200 µs of CPU, almost all of it
grpc.aio's per-message read and write; one core saturates near 5,000 nodes while the
followers sit idle. With relaying, each follower holds a share of the streams (the
leader names one to each registering worker, spread by node id over the followers that
relayed lately: :class:`RelayTable`) and sends the leader one ``RelayHeartbeats``
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
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState
from synapse_ha.core.spec import SpecError
from synapse_ha.core.validation import describe
from synapse_ha.leader.ports import ProposalError
from synapse_ha.rpc import convert
from synapse_ha.rpc.errors import Reason, build_status
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.heartbeat import (
    check_problems,
    gpu_fault_problems,
    heartbeat_commands,
)
from synapse_ha.rpc.relay_table import RelayTable

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


@dataclass(frozen=True, slots=True)
class Refused:
    """Why the leader did not take one relayed heartbeat."""

    reason: Reason
    message: str
    metadata: Mapping[str, str] = field(default_factory=dict)


def _not_registered(node_id: str) -> Refused:
    return Refused(
        Reason.NODE_NOT_FOUND,
        f"node {node_id!r} is not registered; call RegisterNode",
        {"node_id": node_id},
    )


def _commands(
    state: ClusterState, heartbeat: pb.RelayedHeartbeat, now_ms: int
) -> tuple[Refused | None, list[cmd.Command], int]:
    """The refusal of one relayed heartbeat, or the commands it needs (health, checks,
    then member reports, as a direct heartbeat) and how many reports it carries."""
    node_id = heartbeat.node_id
    if not node_id:
        return Refused(Reason.INVALID_FIELD, "node_id is required", {"field": "node_id"}), [], 0
    try:
        events = convert.member_events_from_proto(list(heartbeat.reports))
    except SpecError as exc:
        return Refused(Reason.INVALID_FIELD, str(exc), {"field": "reports"}), [], 0
    if node_id not in state.nodes:
        return _not_registered(node_id), [], 0
    faults = convert.gpu_faults_from_proto(heartbeat.gpu_faults)
    violations = gpu_fault_problems(state, node_id, faults)
    if violations:
        return Refused(Reason.INVALID_FIELD, describe(violations), {"field": "gpu_faults"}), [], 0
    checks = convert.checks_from_proto(heartbeat.checks)
    violations = check_problems(checks)
    if violations:
        return Refused(Reason.INVALID_FIELD, describe(violations), {"field": "checks"}), [], 0
    return None, heartbeat_commands(state, node_id, faults, checks, events, now_ms), len(events)


def _outcome(future: futures.Future[cmd.Result], deadline: float, node_id: str) -> Refused | None:
    try:
        result = future.result(timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return Refused(Reason.OUTCOME_UNKNOWN, "the reports were not committed in time")
    except ProposalError as exc:
        reason = Reason.OUTCOME_UNKNOWN if exc.committed_unknown else Reason.NOT_COMMITTED
        return Refused(reason, f"reports not committed: {exc}")
    if result.code is cmd.ResultCode.NOT_FOUND:
        return _not_registered(node_id)
    if not result.ok:
        return Refused(Reason.INTERNAL, result.message)
    return None


def _refusal(index: int, refused: Refused) -> pb.RelayedRefusal:
    return pb.RelayedRefusal(
        index=index,
        reason=str(refused.reason),
        message=refused.message,
        metadata=dict(refused.metadata),
    )


def _idle(state: ClusterState, heartbeat: pb.RelayedHeartbeat) -> bool:
    """A heartbeat that says nothing but "alive" from a registered node whose conditions
    are clear: it needs no command (the common case, decided without converting it)."""
    if heartbeat.reports or heartbeat.gpu_faults or heartbeat.checks:
        return False
    node = state.nodes.get(heartbeat.node_id)
    return node is not None and not node.conditions


def relay_heartbeats(
    ctx: ReplicaContext, table: RelayTable, request: pb.RelayHeartbeatsRequest
) -> pb.RelayHeartbeatsResponse:
    """The serving leader's handling of one batch: every heartbeat is checked as a direct
    one would be; each accepted node is heard now and its commands are proposed, all at
    once (group commit), then waited for. The answer names a state that holds them."""
    state = ctx.backend.snapshot()
    term = ctx.backend.term()
    if not state.config.relay_heartbeats:
        return pb.RelayHeartbeatsResponse(
            leader_term=term, applied_commands=state.applied_commands, relay=False
        )
    table.heard(request.replica_id, request.stream_address)
    now = ctx.clock_ms()
    heard = ctx.liveness.heard
    acked: list[int] = []
    refusals: list[pb.RelayedRefusal] = []
    waits: list[tuple[int, str, list[futures.Future[cmd.Result]]]] = []
    for index, heartbeat in enumerate(request.heartbeats):
        acked.append(0)
        # When the follower received it: after it was sent, as the lease rule needs.
        received = now - min(max(heartbeat.waited_ms, 0), MAX_WAITED_MS)
        if _idle(state, heartbeat):
            heard(heartbeat.node_id, received)
            continue
        refused, commands, count = _commands(state, heartbeat, now)
        if refused is not None:
            refusals.append(_refusal(index, refused))
            continue
        heard(heartbeat.node_id, received)
        acked[index] = count
        if commands:
            waits.append((index, heartbeat.node_id, [ctx.backend.propose(c) for c in commands]))
    deadline = time.monotonic() + ctx.write_timeout_s
    for index, node_id, proposed in waits:
        for future in proposed:
            refused = _outcome(future, deadline, node_id)
            if refused is not None:
                refusals.append(_refusal(index, refused))
                break
    return pb.RelayHeartbeatsResponse(
        leader_term=term,
        applied_commands=ctx.backend.snapshot().applied_commands,
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
    """A relayed heartbeat was not confirmed: end its stream with ``status``."""

    def __init__(self, status: grpc.Status) -> None:
        super().__init__(status.details)
        self.status = status


def _failed(refusal: pb.RelayedRefusal) -> RelayFailed:
    try:
        reason = Reason(refusal.reason)
    except ValueError:  # a newer leader's reason: register again to learn more
        reason = Reason.NOT_LEADER
    return RelayFailed(build_status(reason, refusal.message, dict(refusal.metadata)))


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
        return bool(self.ctx.stream_address and self.ctx.backend.snapshot().config.relay_heartbeats)

    def may_relay(self) -> bool:
        """Whether this replica should hold relayed streams now: switched on, and the
        leader's last answer did not say otherwise."""
        return self.leader_relays and self.switched_on()

    async def relay(self, heartbeat: pb.RelayedHeartbeat) -> Confirmed:
        """Queue ``heartbeat`` for the next batch; its confirmation (or RelayFailed)."""
        future: asyncio.Future[Confirmed] = asyncio.get_running_loop().create_future()
        self._pending.append(_Entry(heartbeat, future, time.monotonic()))
        if heartbeat.reports and self._wake is not None:
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
                    build_status(
                        Reason.NOT_LEADER,
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
        status = build_status(
            Reason.NOT_LEADER,
            f"replica {self.ctx.self_id} could not relay this heartbeat: {why}; register again",
        )
        for entry in entries:
            if not entry.future.done():
                self.failed += 1
                entry.future.set_exception(RelayFailed(status))
