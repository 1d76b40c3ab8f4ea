"""A worker's end of a heartbeat stream for in-process tests: one stream, its messages
read into a queue by a thread. The ``clients`` fixture (conftest.py) closes every one a
test made."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc

from synapse_ha.core.identity import access
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.stream import StreamServer
from tests.rpc.authed import PEER_KEY

WAIT_S = 20.0


class Client:
    """One stream, with messages read into a queue by a thread."""

    def __init__(self, address: str, peer: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outbox: queue.SimpleQueue[pb.WorkerMessage | None] = queue.SimpleQueue()
        self.inbox: queue.SimpleQueue[pb.LeaderMessage | grpc.RpcError | None] = queue.SimpleQueue()
        stub = pb_grpc.NodeStreamServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.call = stub.Connect(self._requests(), metadata=[(PEER_KEY, peer)])
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[pb.WorkerMessage]:
        while (message := self.outbox.get()) is not None:
            yield message

    def _read(self) -> None:
        try:
            for message in self.call:
                self.inbox.put(message)
            self.inbox.put(None)
        except grpc.RpcError as exc:
            self.inbox.put(exc)

    def send(self, seq: int, node_id: str) -> None:
        self.outbox.put(pb.WorkerMessage(seq=seq, node_id=node_id))

    def receive(self) -> pb.LeaderMessage:
        got = self.inbox.get(timeout=WAIT_S)
        assert isinstance(got, pb.LeaderMessage), got
        return got

    def ended(self) -> grpc.RpcError:
        got = self.inbox.get(timeout=WAIT_S)
        assert isinstance(got, grpc.RpcError), got
        return got

    def close(self) -> None:
        self.outbox.put(None)
        self.call.cancel()
        self.channel.close()


def connect(server: StreamServer, node_id: str, clients: list[Client], as_node: str = "") -> Client:
    c = Client(f"127.0.0.1:{server.port}", access.worker(as_node or node_id).spiffe_id)
    clients.append(c)
    return c
