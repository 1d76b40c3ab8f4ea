"""Heartbeat streams: ``NodeStreamService.Connect``, one long-lived stream per worker.

Why: a unary heartbeat costs the leader a TLS record exchange, the interceptor and a
thread hand-off per call, plus the node's whole desired list every time. A stream served
by a ``grpc.aio`` server (coroutines on one event loop thread, not a thread per stream)
pays the authentication once per stream, answers each heartbeat with a small
acknowledgement, and sends the desired list only when it changed for that node since the
previous message on the stream (compared by a per-node digest). After a command commits
that changes a node's desired members, the leader pushes the new list on the node's
stream at once (:meth:`StreamServer.push`), instead of nudging the worker to heartbeat.

Fencing is unchanged (DESIGN §4, and the contract above ``WorkerMessage`` in
``control.proto``):

* Only an acknowledgement of one of the worker's own heartbeats renews its lease, from
  the moment that heartbeat was sent, exactly as a unary reply does: the
  acknowledgement proves that a serving leader heard the node after that moment. A push
  renews nothing.
* Each heartbeat is answered only while this replica is the serving leader (checked per
  message, as the unary handler does), and every stream is ended as soon as this replica
  no longer leads, its term changes, or it has not served for longer than a heartbeat
  interval (a watcher checks every ``watch_period_s``), so a worker never keeps talking
  to a deposed leader: its stream ends, it registers again (leader discovery), and until
  a new leader acknowledges it, ``lease_ttl`` runs out and it fences itself, as with
  unary heartbeats. A lapse shorter than that (a leader so busy that its last majority
  contact looks older than the serving window for a moment) ends nothing: a heartbeat
  that arrives during it waits for the leader to serve again in the same term, at most
  that interval (which the worker waits for an acknowledgement anyway), and is answered
  then; every stream dropped at once would cost each worker a registration and the
  leader a storm of them just when it is busiest.
* A pushed list comes from the same serving leader in the same term as the stream's
  acknowledgements and is built from a state in which the command is committed; the
  worker applies it only while it holds its lease, as it would apply a reply.
* Liveness (``ctx.liveness.heard``) is recorded for every heartbeat message, as for
  every unary heartbeat, so dead-node detection is unchanged.

Who may connect is checked with the same functions as the unary path
(:class:`~synapse_ha.rpc.auth.AuthInterceptor`'s ``identify``,
:func:`~synapse_ha.core.identity.access.authorize`,
:func:`~synapse_ha.core.identity.access.may_speak_for_node`) on the stream's first message;
later messages must name the same node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from grpc import aio

from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.identity import access
from synapse_ha.core.model import ClusterState
from synapse_ha.rpc.auth import AuthInterceptor
from synapse_ha.rpc.errors import ErrorReason, refusal_status
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.heartbeat import (
    answer_fields,
    desired_message,
    heartbeat_in,
    heartbeat_message,
)
from synapse_ha.rpc.relay import RelayClient, RelayFailed
from synapse_ha.rpc.server import ReplicaContext
from synapse_ha.rpc.server.context import ReplicaPort
from synapse_ha.service.commit import settled
from synapse_ha.service.heartbeat import DesiredMembers, heartbeat
from synapse_ha.service.refusal import Refusal, denied, node_not_found, required

log = logging.getLogger("synapse.rpc.stream")

_EOF: Any = getattr(aio, "EOF")  # noqa: B009  (not in grpc's stubs)
CONNECT_METHOD = f"/{access.NODE_STREAM_SERVICE}/Connect"

Digest = tuple[tuple[str, int, int, int, int, int], ...]


class _Refused(Exception):
    """End the stream with this refusal's wire error."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.words)
        self.refusal = refusal


def _digest(members: Iterable[DesiredMember]) -> Digest:
    """What identifies a node's desired list: a member's launch data never changes for a
    given (job, token, rank, generation); only its preemption deadline can, and the
    gang's membership (hosts and master address), whose count grows at each change."""
    return tuple(
        (d.job_id, d.fencing_token, d.rank, d.generation, d.membership, d.preempt_deadline_ms)
        for d in members
    )


class _Stream:
    __slots__ = ("context", "lock", "node_id", "relayed", "sent", "term", "version")

    def __init__(self, node_id: str, context: Any, term: int, relayed: bool = False) -> None:
        self.node_id = node_id
        self.context = context
        self.term = term
        # Opened on a follower that relays (rpc/relay.py): it lives across leader changes,
        # and term is that of the leader that confirmed its last acknowledgement.
        self.relayed = relayed
        self.lock = asyncio.Lock()
        self.sent: Digest | None = None  # the digest of the last list sent on this stream
        self.version = -1  # the state version of the last message sent on it


class StreamServer:
    """The heartbeat stream service of one replica, on its own address and event-loop
    thread. ``add_port`` binds the address (``Transport.add_port``: mutual TLS);
    ``auth`` identifies callers (the replica's interceptor)."""

    def __init__(
        self,
        ctx: ReplicaContext,
        address: str,
        auth: AuthInterceptor,
        add_port: Callable[[Any, str], int],
        *,
        watch_period_s: float = 0.1,
    ) -> None:
        self.ctx = ctx
        self.address = address
        self._auth = auth
        self._add_port = add_port
        self.watch_period_s = watch_period_s
        self.port = 0
        self.heartbeats = 0  # heartbeats answered (read by metrics and benchmarks)
        self.pushes = 0
        self._streams: dict[str, _Stream] = {}
        self._desired = DesiredMembers()
        self.replica = ReplicaPort(ctx)
        self.relay = RelayClient(ctx)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: aio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stopped: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._serves: asyncio.Event | None = None  # set while the watcher saw it serve
        self._lapse_since: float | None = None  # loop time the current lapse began

    # ------------------------------------------------------------- lifecycle

    @property
    def bound_address(self) -> str:
        host = self.address.rpartition(":")[0]
        return f"{host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeat-streams", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise OSError(f"the heartbeat stream server at {self.address} did not start")
        if self._error is not None:
            raise OSError(f"cannot serve heartbeat streams at {self.address}: {self._error}")

    def stop(self, timeout_s: float = 3.0) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def connected(self) -> int:
        return len(self._streams)

    def stream_counts(self) -> tuple[int, int]:
        """Streams open here: (to this replica as leader, relayed)."""
        relayed = sum(1 for s in list(self._streams.values()) if s.relayed)
        return len(self._streams) - relayed, relayed

    def relay_counts(self) -> tuple[int, int, int]:
        """The relay's (batches answered, heartbeats confirmed, heartbeats failed)."""
        return self.relay.batches, self.relay.relayed, self.relay.failed

    def push(self, node_ids: Iterable[str]) -> list[str]:
        """Push the current desired list to each node that has a stream here (if it
        changed); thread-safe, never blocks. Returns the nodes that have no stream here
        (the caller nudges those the old way)."""
        wanted = list(node_ids)
        streamed = [n for n in wanted if n in self._streams]
        loop = self._loop
        if streamed and loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._push_now, streamed)
            except RuntimeError:
                return wanted
        else:
            streamed = []
        return [n for n in wanted if n not in set(streamed)]

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); a stopped loop is normal
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._serves = asyncio.Event()
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_NodeStreamServiceServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        self.port = self._add_port(server, self.address)
        if self.port == 0:
            raise OSError(f"cannot bind {self.address}")
        await server.start()
        self._server = server
        self._ready.set()
        watcher = asyncio.ensure_future(self._watch())
        relay = asyncio.ensure_future(self.relay.run())
        await self._stopped.wait()
        watcher.cancel()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        await server.stop(grace=0.5)

    async def _watch(self) -> None:
        """End every stream to the leader when this replica no longer leads, its term
        changed or it has not served for longer than a heartbeat interval; end relayed
        streams when this replica neither serves nor relays. On a follower, push a
        relayed stream's new desired list once its state changed it."""
        pushed_at = -1
        while True:
            await asyncio.sleep(self.watch_period_s)
            if not self._streams:
                continue
            serving = self.ctx.serving()
            lapsed = self._lapsed(serving)
            term = self.ctx.backend.term() if not lapsed else -1
            relaying = not serving and self.relay.may_relay()
            for stream in list(self._streams.values()):
                if stream.relayed:
                    if not serving and not relaying:
                        self._spawn(self._end(stream, "this replica stopped relaying heartbeats"))
                elif lapsed or stream.term != term:
                    self._spawn(self._end(stream, "this replica stopped serving as leader"))
            if relaying:
                state = self.ctx.backend.snapshot()
                if state.applied_commands != pushed_at:
                    pushed_at = state.applied_commands
                    self._push_now(self._changed_lists(state))

    def _lapsed(self, serving: bool) -> bool:
        """Whether this replica stopped serving as leader for good (it no longer leads)
        or for longer than the grace (:meth:`_grace_s`); keeps the lapse's start and
        wakes the heartbeats waiting for it to end."""
        assert self._serves is not None and self._loop is not None
        if serving:
            self._lapse_since = None
            self._serves.set()
            return False
        self._serves.clear()
        if not self.ctx.backend.is_leader():
            self._lapse_since = None
            return True
        now = self._loop.time()
        if self._lapse_since is None:
            self._lapse_since = now
        return now - self._lapse_since > self._grace_s()

    def _grace_s(self) -> float:
        """How long a leader may not serve, in the same term, before its streams end: a
        heartbeat interval (a worker waits that long for an acknowledgement)."""
        return self.ctx.backend.cluster_config().timeouts.heartbeat_interval_ms / 1000

    async def _serving_again(self, stream: _Stream) -> bool:
        """Wait, at most the grace, for this replica to serve again as the leader of the
        term ``stream`` was acknowledged in; whether it does."""
        assert self._serves is not None and self._loop is not None
        deadline = self._loop.time() + self._grace_s()
        while not self.ctx.serving():
            left = deadline - self._loop.time()
            if left <= 0 or not self.ctx.backend.is_leader():
                return False
            self._serves.clear()  # set again by the watcher once it serves
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._serves.wait(), left)
        return self.ctx.backend.term() == stream.term

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end(self, stream: _Stream, why: str) -> None:
        """End ``stream`` from outside its handler: the worker registers again."""
        if self._streams.get(stream.node_id) is stream:
            del self._streams[stream.node_id]
        status = refusal_status(
            Refusal(ErrorReason.NOT_LEADER, f"{why}; register again to find the leader")
        )
        with contextlib.suppress(Exception):  # ending a call that ends anyway
            await stream.context.abort(status.code, status.details, status.trailing_metadata)

    # ------------------------------------------------------------- desired

    def _message(
        self, stream: _Stream, state: ClusterState, now_ms: int, ack_seq: int, acked: int
    ) -> pb.LeaderMessage | None:
        desired = self._desired.of(state, stream.node_id)
        digest = _digest(desired)
        changed = digest != stream.sent
        stream.version = max(stream.version, state.applied_commands)
        if ack_seq == 0 and not changed:
            return None
        msg = pb.LeaderMessage(
            ack_seq=ack_seq,
            acked_reports=acked,
            leader_term=stream.term,
            has_desired=changed,
            **answer_fields(state, stream.node_id),
        )
        if changed:
            msg.desired.extend(desired_message(state, d, now_ms) for d in desired)
            stream.sent = digest
        return msg

    # ------------------------------------------------------------- pushes

    def _changed_lists(self, state: ClusterState) -> list[str]:
        """The nodes of the relayed streams acknowledged on whose desired list in
        ``state`` differs from the one last sent (one task each is then spawned)."""
        changed = []
        for stream in list(self._streams.values()):
            if not stream.relayed or stream.version < 0:
                continue
            desired = self._desired.of(state, stream.node_id)
            if (desired or stream.sent) and _digest(desired) != stream.sent:
                changed.append(stream.node_id)
        return changed

    def _push_now(self, node_ids: list[str]) -> None:
        for node_id in node_ids:
            stream = self._streams.get(node_id)
            if stream is not None:
                self._spawn(self._push_one(stream))

    async def _push_one(self, stream: _Stream) -> None:
        # A follower pushes only on a relayed stream it has acknowledged on: from then on
        # its states are at or past the one the leader confirmed.
        if not self.ctx.serving() and not (stream.relayed and stream.version >= 0):
            return
        async with stream.lock:
            state = self.ctx.backend.snapshot()
            msg = self._message(stream, state, self.ctx.clock_ms(), 0, 0)
            if msg is None:
                return
            self.pushes += 1
            try:
                await stream.context.write(msg)
            except Exception as exc:  # the stream is ending; its handler cleans up
                log.debug("push to %s failed: %s", stream.node_id, exc)

    # ------------------------------------------------------------- one stream

    def _admit(self, context: Any, node_id: str) -> None:
        identity, refusal = self._auth.identify(context)
        if refusal is None:
            refusal = access.authorize(identity, CONNECT_METHOD)
        if refusal is None and identity is not None:
            refusal = access.may_speak_for_node(identity, node_id)
        if refusal is not None:
            self._auth.refused(refusal, identity, CONNECT_METHOD)
            raise _Refused(denied(refusal, identity))

    def _not_serving(self) -> _Refused:
        return _Refused(
            Refusal(
                ErrorReason.NOT_LEADER,
                "this replica does not serve as leader now; register again to find the leader",
                metadata={"leader_id": ""},
            )
        )

    async def connect(self, context: Any) -> None:
        first = await context.read()
        if first is _EOF:
            return
        node_id = heartbeat_message(first).node_id
        stream: _Stream | None = None
        try:
            if not node_id:
                raise _Refused(required("node_id"))
            self._admit(context, node_id)
            serving = self.ctx.serving()
            if not serving and not self.relay.may_relay():
                raise self._not_serving()
            stream = _Stream(node_id, context, self.ctx.backend.term(), relayed=not serving)
            older = self._streams.get(node_id)
            self._streams[node_id] = stream
            if older is not None:  # a reconnected worker: its old stream is dead
                self._spawn(self._end(older, "a newer stream speaks for this node"))
            message = first
            while message is not _EOF:
                named = heartbeat_message(message).node_id
                if named and named != node_id:
                    raise _Refused(
                        Refusal(
                            ErrorReason.INVALID_FIELD,
                            f"this stream speaks for node {node_id!r}, not {named!r}",
                            "node_id",
                        )
                    )
                await self._answer(stream, message)
                message = await context.read()
        except _Refused as refused:
            # The one place a refusal on a stream becomes its wire error.
            extra = None
            if refused.refusal.denied is not None:
                extra = {"method": access.short_method(CONNECT_METHOD)}
            status = refusal_status(refused.refusal, extra)
            await context.abort(status.code, status.details, status.trailing_metadata)
        finally:
            if stream is not None and self._streams.get(node_id) is stream:
                del self._streams[node_id]

    async def _answer(self, stream: _Stream, request: pb.WorkerMessage) -> None:
        """Take one heartbeat (:func:`synapse_ha.service.heartbeat.heartbeat`) and
        acknowledge it once its commands committed; on a follower, relay it."""
        ctx = self.ctx
        message = heartbeat_message(request)
        beat = heartbeat_in(message, stream.node_id)
        if isinstance(beat, Refusal):
            raise _Refused(beat)
        if not ctx.serving():
            if stream.relayed:
                await self._answer_relayed(stream, request.seq, message)
                return
            if not await self._serving_again(stream):
                raise self._not_serving()
        now = ctx.clock_ms()
        if stream.relayed:  # opened while this replica followed; it leads now
            stream.term = ctx.backend.term()
        taken = heartbeat(self.replica, beat, now)
        if isinstance(taken, Refusal):
            raise _Refused(taken)
        state = taken.state
        if taken.proposed:
            not_found = node_not_found(stream.node_id)
            refused = await settled(taken.proposed, ctx.write_timeout_s, not_found)
            if refused is not None:
                raise _Refused(refused)
        async with stream.lock:
            if taken.proposed or state.applied_commands < stream.version:
                # Never answer from a state older than one already sent on this stream.
                state = ctx.backend.snapshot()
            msg = self._message(stream, state, now, request.seq, taken.acked_reports)
            assert msg is not None
            self.heartbeats += 1
            await stream.context.write(msg)

    async def _answer_relayed(self, stream: _Stream, seq: int, message: Any) -> None:
        """Acknowledge heartbeat ``seq`` once the leader confirmed it, from this replica's
        state at or past the one the leader named (rpc/relay.py states why that is a
        lease)."""
        relayed = pb.RelayedHeartbeat(
            heartbeat=pb.Heartbeat(
                node_id=stream.node_id,
                reports=message.reports,
                gpu_faults=message.gpu_faults,
                checks=message.checks,
                paces=message.paces if isinstance(message, pb.Heartbeat) else (),
            )
        )
        try:
            confirmed = await self.relay.relay(relayed)
            state = await self.relay.caught_up(confirmed.applied_commands)
        except RelayFailed as failed:
            raise _Refused(failed.refusal) from None
        async with stream.lock:
            stream.term = confirmed.term
            msg = self._message(stream, state, self.ctx.clock_ms(), seq, confirmed.acked_reports)
            assert msg is not None
            self.heartbeats += 1
            await stream.context.write(msg)


class _Servicer(pb_grpc.NodeStreamServiceServicer):
    def __init__(self, server: StreamServer) -> None:
        self._server = server

    async def Connect(self, request_iterator: Any, context: Any) -> None:
        await self._server.connect(context)


class StreamFirstNudger:
    """The leader loop's nudger: nodes with a heartbeat stream here get their new desired
    list pushed on it; the others are nudged through ``fallback`` (unary workers)."""

    def __init__(self, streams: StreamServer | None, fallback: Any) -> None:
        self.streams = streams
        self.fallback = fallback

    def nudge(self, targets: Sequence[tuple[str, str]]) -> None:
        if self.streams is None:
            self.fallback.nudge(targets)
            return
        rest = set(self.streams.push(n for n, _ in targets))
        left = [(n, a) for n, a in targets if n in rest]
        if left:
            self.fallback.nudge(left)
