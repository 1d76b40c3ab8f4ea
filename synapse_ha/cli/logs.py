"""Members' output, read straight from the workers that run them.

The scheduler says where each member runs (``GetJob``) and at which address each node
serves ``WorkerService`` (``ListNodes``); log bytes then come from that worker's
``ReadLog`` and never pass through the control plane.

Several members are followed at once, one thread per member; complete lines are written
with a ``[rank N]`` prefix so that the interleaved output stays readable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc

from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc

# How long a follower waits before asking again when a member has no log yet (it is
# bound but not started) or its worker does not answer.
RETRY_S = 0.3


class WorkerUnreachable(Exception):
    def __init__(self, node_id: str, address: str, detail: str) -> None:
        super().__init__(f"cannot read logs from node {node_id} at {address}: {detail}")
        self.node_id = node_id
        self.address = address


@dataclass(frozen=True, slots=True)
class MemberLog:
    """Where one member's log lives."""

    job_id: str
    attempt: int
    rank: int
    node_id: str
    address: str  # the node's WorkerService address


class LinePrinter:
    """Writes whole lines, prefixed, from several threads; keeps each member's partial
    last line until it is completed or flushed."""

    def __init__(self, write: Callable[[str], None], prefixed: bool) -> None:
        self._write = write
        self._prefixed = prefixed
        self._lock = threading.Lock()
        self._partial: dict[int, str] = {}

    def feed(self, rank: int, data: bytes) -> None:
        text = self._partial.pop(rank, "") + data.decode("utf-8", errors="replace")
        *lines, rest = text.split("\n")
        if rest:
            self._partial[rank] = rest
        self._emit(rank, lines)

    def flush(self, rank: int) -> None:
        rest = self._partial.pop(rank, "")
        if rest:
            self._emit(rank, [rest])

    def _emit(self, rank: int, lines: Sequence[str]) -> None:
        if not lines:
            return
        prefix = f"[rank {rank}] " if self._prefixed else ""
        with self._lock:
            for line in lines:
                self._write(prefix + line)


def _stub(channel: grpc.Channel) -> wpb_grpc.WorkerServiceStub:
    return wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]


def read_log(member: MemberLog, timeout_s: float) -> Iterator[bytes]:
    """The member's output written so far. Raises :class:`LookupError` when the worker
    has no log for it (not started yet) and :class:`WorkerUnreachable`."""
    request = wpb.ReadLogRequest(
        job_id=member.job_id, attempt=member.attempt, rank=member.rank, follow=False
    )
    with grpc.insecure_channel(member.address) as channel:
        try:
            for chunk in _stub(channel).ReadLog(request, timeout=timeout_s):
                if chunk.data:
                    yield chunk.data
        except grpc.RpcError as exc:
            code = exc.code()
            if code is grpc.StatusCode.NOT_FOUND:
                raise LookupError(exc.details()) from exc
            name = code.name if code else "UNKNOWN"
            detail = f"{name}: {exc.details()}"
            raise WorkerUnreachable(member.node_id, member.address, detail) from exc


class MemberFollower(threading.Thread):
    """Follows one member's log until it has exited and everything was sent (``done``),
    or until :meth:`stop`. Waits for the log to appear and reconnects, from the last
    offset, when the worker's stream breaks."""

    def __init__(self, member: MemberLog, printer: LinePrinter) -> None:
        super().__init__(name=f"log-rank-{member.rank}", daemon=True)
        self.member = member
        self.printer = printer
        self.done = False
        self.last_error = ""
        self._stopping = threading.Event()
        self._call_lock = threading.Lock()
        self._call: grpc.Call | None = None

    def stop(self) -> None:
        self._stopping.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()  # type: ignore[no-untyped-call]

    def run(self) -> None:
        offset = 0
        with grpc.insecure_channel(self.member.address) as channel:
            stub = _stub(channel)
            while not self._stopping.is_set():
                request = wpb.ReadLogRequest(
                    job_id=self.member.job_id,
                    attempt=self.member.attempt,
                    rank=self.member.rank,
                    offset=offset,
                    follow=True,
                )
                stream = stub.ReadLog(request)
                with self._call_lock:
                    self._call = stream
                if self._stopping.is_set():
                    stream.cancel()
                try:
                    for chunk in stream:
                        if chunk.data:
                            self.printer.feed(self.member.rank, chunk.data)
                            offset = chunk.offset + len(chunk.data)
                        if chunk.eof:
                            self.done = True
                            return
                except grpc.RpcError as exc:
                    code = exc.code()
                    self.last_error = f"{code.name if code else 'UNKNOWN'}: {exc.details()}"
                finally:
                    with self._call_lock:
                        self._call = None
                    if self.done or self._stopping.is_set():
                        self.printer.flush(self.member.rank)
                self._stopping.wait(RETRY_S)
        self.printer.flush(self.member.rank)
