"""The leader's nudges to workers: ``WorkerService.Nudge``, fire and forget.

After a bind commits, the leader asks the workers it placed members on to heartbeat now,
so members start within a round trip of the decision instead of up to a heartbeat
interval later. A nudge carries no state: the heartbeat reply stays the only source of
what should run, and a nudge that is lost, late or refused costs one interval at most.
Calls never block the caller; channels are kept per worker (node id and address), at
most ``max_channels`` of them (least recently used closed first).

Each channel is opened for one node: with TLS, the worker's certificate must name that
node (``Transport.channel(address, worker=node_id)``), so a nudge reaches the worker the
leader placed members on, or nothing, whoever answers at the address.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc

log = logging.getLogger("synapse.rpc.nudge")


class WorkerChannels(Protocol):
    """Opens a channel to the worker of node ``worker`` at ``address``
    (``Transport.channel`` is one)."""

    def __call__(self, address: str, *, worker: str) -> grpc.Channel: ...


def plaintext_worker_channel(address: str, *, worker: str) -> grpc.Channel:
    """A plaintext channel (``--insecure``): nothing to check the worker by."""
    return grpc.insecure_channel(address)


class WorkerNudger:
    def __init__(
        self,
        timeout_s: float = 1.0,
        max_channels: int = 4096,
        channel_factory: WorkerChannels = plaintext_worker_channel,
        credentials_version: Callable[[], object] = lambda: None,
    ) -> None:
        """``channel_factory`` opens a channel to one node's worker (with TLS, one that
        presents this replica's certificate, since workers take nudges from replicas
        only, and demands that node's certificate)."""
        if max_channels < 1:
            raise ValueError("max_channels must be at least 1")
        self._channel_factory = channel_factory
        # Rotated certificates: the cached channels are dropped when this changes.
        self._credentials_version = credentials_version
        self._version = credentials_version()
        self.timeout_s = timeout_s
        self.max_channels = max_channels
        self._lock = threading.Lock()
        self._channels: OrderedDict[
            tuple[str, str], tuple[grpc.Channel, wpb_grpc.WorkerServiceStub]
        ] = OrderedDict()
        self._closed = False

    def nudge(self, targets: Sequence[tuple[str, str]]) -> None:
        version = self._credentials_version()
        if version != self._version:
            self._drop_channels(version, closing=False)
        for node_id, address in targets:
            stub = self._stub(node_id, address)
            if stub is None:
                return
            try:
                call = stub.Nudge.future(wpb.NudgeRequest(node_id=node_id), timeout=self.timeout_s)
            except Exception as exc:  # a hint: never let it reach the leader loop
                log.debug("could not nudge %s at %s: %s", node_id, address, exc)
                continue
            call.add_done_callback(lambda f, n=node_id, a=address: _settled(f, n, a))

    def close(self) -> None:
        self._drop_channels(None, closing=True)

    def _drop_channels(self, version: object, *, closing: bool) -> None:
        """Close every cached channel: the credentials are now ``version``, or the nudger
        is ``closing`` (it opens none again)."""
        with self._lock:
            if closing:
                self._closed = True
            else:
                self._version = version
            stale = [channel for channel, _ in self._channels.values()]
            self._channels.clear()
        for channel in stale:
            channel.close()

    def _stub(self, node_id: str, address: str) -> wpb_grpc.WorkerServiceStub | None:
        evicted: list[grpc.Channel] = []
        key = (node_id, address)
        with self._lock:
            if self._closed:
                return None
            entry = self._channels.get(key)
            if entry is not None:
                self._channels.move_to_end(key)
                return entry[1]
            channel = self._channel_factory(address, worker=node_id)
            stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            self._channels[key] = (channel, stub)
            while len(self._channels) > self.max_channels:
                _, (old, _) = self._channels.popitem(last=False)
                evicted.append(old)
        for old in evicted:
            old.close()
        return stub


def _settled(call: grpc.Future[wpb.NudgeResponse], node_id: str, address: str) -> None:
    exc = call.exception()
    if exc is not None:
        log.debug("nudge to %s at %s failed: %s", node_id, address, exc)
    elif not call.result().accepted:
        log.info("the worker at %s is not node %s; nudge ignored", address, node_id)
