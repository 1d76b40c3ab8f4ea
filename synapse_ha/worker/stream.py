"""The worker's end of a heartbeat stream (``NodeStreamService.Connect``).

:class:`StreamControlPlane` is the agent's :class:`~synapse_ha.worker.agent.ControlPlane`:
it registers through the unary path (leader discovery, redirects) and, when the leader's
reply names a stream address, sends heartbeats on one long-lived stream to that leader;
otherwise (an older leader) it keeps the unary heartbeat.

Per heartbeat it behaves as a unary call: :meth:`heartbeat` sends one
:class:`WorkerMessage` and waits for the :class:`LeaderMessage` acknowledging it, which it
returns as a ``HeartbeatResponse`` carrying the node's full desired list (the leader sends
the list only when it changed; the last one received is kept per stream). So the agent's
lease rule is the same for both transports: only the acknowledgement of its own
heartbeat renews the lease, from when that heartbeat was sent.

A push (a LeaderMessage acknowledging nothing) is handed to ``on_push`` with the full new
list; the agent applies it only while it holds its lease. When the stream ends, or a
heartbeat gets no acknowledgement in time, the stream is closed and :meth:`heartbeat`
raises :class:`~synapse_ha.worker.agent.StreamEnded`: the agent registers again, which
finds the current leader, and its lease runs out meanwhile as it would with unary calls.
A stream that went silent (no acknowledgement in time: the leader froze or was cut off,
which closes nothing) is reported to ``on_silent`` first, so that the registration asks
the other replicas before the silent leader (:meth:`ClusterClient.suspect
<synapse_ha.client.cluster.ClusterClient.suspect>`).

With relayed heartbeats (:mod:`synapse_ha.rpc.relay`) the leader may name a follower's
stream (``RegisterNodeResponse.relayed``). The acknowledgements on it carry the same
proof, so nothing above changes, except that a relayed stream gone silent does not say
which one was silent, the follower or the leader behind it: the follower's address
is sent back as unreachable with the next registrations (for ``UNREACHABLE_S``), so the
leader names another replica's stream, and the leader is suspected as well.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from synapse_ha.rpc import states
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.worker.agent import (
    ControlPlane,
    ControlPlaneUnreachable,
    NotRegistered,
    StreamEnded,
)

log = logging.getLogger("synapse.worker.stream")

PushHandler = Callable[[list[pb.DesiredMember]], None]

# How a stream to a leader that answers nothing ends (no acknowledgement at all: None).
_SILENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
UNREACHABLE_S = 30.0  # how long a silent relayed stream's address is avoided


class _Connection:
    """One open stream: a sender queue, a reader thread and the acknowledgements seen."""

    def __init__(self, channel: grpc.Channel, on_push: PushHandler) -> None:
        self.channel = channel
        self._on_push = on_push
        self._outbox: queue.SimpleQueue[pb.WorkerMessage | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._acks: dict[int, pb.HeartbeatResponse] = {}
        self._desired: list[pb.DesiredMember] = []
        self.ended: grpc.RpcError | None = None
        self.closed = False
        self.acknowledged = False  # a heartbeat on it was acknowledged
        stub = pb_grpc.NodeStreamServiceStub(channel)  # type: ignore[no-untyped-call]
        self._call = stub.Connect(self._requests())
        self._reader = threading.Thread(target=self._read, name="heartbeat-stream", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[pb.WorkerMessage]:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            yield message

    def _read(self) -> None:
        try:
            for message in self._call:
                self._received(message)
        except grpc.RpcError as exc:
            with self._cond:
                self.ended = exc
        finally:
            with self._cond:
                self.closed = True
                self._cond.notify_all()

    def _received(self, message: pb.LeaderMessage) -> None:
        if message.has_desired:
            self._desired = list(message.desired)
        if message.ack_seq == 0:
            self._on_push(list(self._desired))
            return
        reply = pb.HeartbeatResponse(
            desired=self._desired,
            lease_ttl_ms=message.lease_ttl_ms,
            heartbeat_interval_ms=message.heartbeat_interval_ms,
            acked_reports=message.acked_reports,
            **states.lease_status_fields(states.lease_status(message)),
            leader_term=message.leader_term,
        )
        with self._cond:
            self._acks[message.ack_seq] = reply
            self._cond.notify_all()

    def exchange(self, message: pb.WorkerMessage, timeout_s: float) -> pb.HeartbeatResponse | None:
        """Send ``message``; its acknowledgement, or None (timed out or stream ended)."""
        self._outbox.put(message)
        with self._cond:
            self._cond.wait_for(lambda: message.seq in self._acks or self.closed, timeout_s)
            reply = self._acks.pop(message.seq, None)
            self._acks.clear()
            return reply

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()
        self.channel.close()


def _embedded(request: pb.HeartbeatRequest) -> pb.Heartbeat:
    """The heartbeat ``request`` carries, as the embedded message the unary and stream
    shapes share (replicas read the flat fields of earlier releases' workers too, so the
    replicas are upgraded before the workers)."""
    if request.HasField("heartbeat"):
        return request.heartbeat
    return pb.Heartbeat(
        node_id=request.node_id,
        reports=request.reports,
        running=request.running,
        gpu_faults=request.gpu_faults,
        checks=request.checks,
    )


class StreamControlPlane:
    """Heartbeats on a stream to the leader when it offers one, unary calls otherwise."""

    def __init__(
        self,
        unary: ControlPlane,
        channel_factory: Callable[[str], grpc.Channel],
        on_push: PushHandler = lambda desired: None,
        on_silent: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_silent``: called when the leader stopped acknowledging heartbeats on an
        open stream (before :class:`StreamEnded` is raised)."""
        self.unary = unary
        self._on_silent = on_silent
        self._channel_factory = channel_factory
        self._on_push = on_push
        self.stream_address = ""
        self.relayed = False  # the stream is a follower's (rpc/relay.py)
        self._unreachable: dict[str, float] = {}  # relayed stream address -> when silent
        self._connection: _Connection | None = None
        self._seq = 0
        self.streamed = 0  # heartbeats acknowledged on a stream
        self.unary_heartbeats = 0  # heartbeats sent as unary calls

    def register(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeResponse:
        self.close()
        oldest = time.monotonic() - UNREACHABLE_S
        self._unreachable = {a: at for a, at in self._unreachable.items() if at >= oldest}
        sent = pb.RegisterNodeRequest()
        sent.CopyFrom(request)
        sent.unreachable_streams[:] = sorted(self._unreachable)
        answer = self.unary.register(sent)
        self.stream_address = answer.stream_address
        self.relayed = answer.relayed
        return answer

    def heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        beat = _embedded(request)
        if not self.stream_address:
            self.unary_heartbeats += 1
            return self.unary.heartbeat(pb.HeartbeatRequest(heartbeat=beat), timeout_s)
        connection = self._connection
        if connection is None:
            connection = _Connection(self._channel_factory(self.stream_address), self._on_push)
            self._connection = connection
        self._seq += 1
        message = pb.WorkerMessage(seq=self._seq, heartbeat=beat)
        reply = connection.exchange(message, timeout_s)
        if reply is not None:
            if not connection.acknowledged:
                connection.acknowledged = True
                log.info(
                    "heartbeats on a stream to %s at %s",
                    "a follower that relays them" if self.relayed else "the leader",
                    self.stream_address,
                )
            self.streamed += 1
            return reply
        ended = connection.ended
        self.close()
        if ended is None or ended.code() in _SILENT:
            if self.relayed:  # the follower, or the leader behind it, went silent
                self._unreachable[self.stream_address] = time.monotonic()
            self._on_silent()
        if ended is not None and failure_of(ended).reason is ErrorReason.NODE_NOT_FOUND:
            raise NotRegistered(str(ended.details()))
        if ended is not None and ended.code() is grpc.StatusCode.UNIMPLEMENTED:
            address, self.stream_address = self.stream_address, ""  # unary from now on
            raise ControlPlaneUnreachable(f"no heartbeat stream served at {address}")
        why = f"{ended.code()}: {ended.details()}" if ended is not None else "no acknowledgement"
        whom = "a follower that relays them" if self.relayed else "the leader"
        raise StreamEnded(f"the heartbeat stream to {whom} ended ({why})")

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
