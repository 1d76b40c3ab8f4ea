"""Members' output, read straight from the workers that run them.

The scheduler says where each member runs (``GetJob``) and at which address each node
serves ``WorkerService`` (``ListNodes``); log bytes then come from that worker's
``ReadLog`` and never pass through the control plane.

Authority (DESIGN §8). A worker serves a member's log only to a caller holding a
**grant**: a short-lived permission for one job on one node, signed by a replica, which
the leader hands out (``GrantLogAccess``) to whoever may manage the job (its owner, an
operator or an admin) and the worker checks offline against the cluster CA. The client
asks for one grant per member (:class:`GrantCache`), sends it as the
:data:`~synapse_ha.security.grants.GRANT_METADATA_KEY` metadata over the same TLS
transport it uses for the replicas, and asks again when it is about to expire or a
worker refuses it. An insecure cluster signs no grants (``NEEDS_TLS``): its logs are read
without one, over plaintext.

:func:`read_log` reads what a member wrote so far; a :class:`MemberFollower` thread
follows one member's log until it has exited, handing the bytes to a :class:`LogSink`
(synctl's sink prints ``[rank N]`` lines; the Python client's yields them).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import grpc

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import Transport

# How long a follower waits before asking again when a member has no log yet (it is
# bound but not started) or its worker does not answer.
RETRY_S = 0.3
# A grant this close to its expiry is replaced before it is used.
GRANT_MARGIN_S = 10.0
# Worker answers that mean "this grant does not (or no longer) let you read".
REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


class LogSink(Protocol):
    """Where a :class:`MemberFollower` hands a member's output: ``feed`` gets each chunk
    of bytes as it arrives (from several followers' threads at once), ``flush`` is called
    when a member's log ends or its following stops."""

    def feed(self, rank: int, data: bytes) -> None: ...

    def flush(self, rank: int) -> None: ...


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


@dataclass(frozen=True, slots=True)
class LogGrant:
    """A replica-signed grant to read one member's log, as ``GrantLogAccess`` returns it;
    ``expires_at_s`` is wall-clock seconds since the epoch (the replica's clock)."""

    text: str
    expires_at_s: float


class GrantCache:
    """The grant for each member, fetched with ``fetch`` the first time and again once it
    is within ``margin_s`` of its expiry (by ``clock``, wall-clock seconds) or after
    :meth:`forget`. ``fetch`` returns None when the cluster signs no grants (an insecure
    cluster); that answer is kept. Errors of ``fetch`` (a refusal) reach the caller of
    :meth:`get`. Thread-safe: followers of several members share one cache."""

    def __init__(
        self,
        fetch: Callable[[MemberLog], LogGrant | None],
        clock: Callable[[], float] = time.time,
        margin_s: float = GRANT_MARGIN_S,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._margin_s = margin_s
        self._lock = threading.Lock()
        self._grants: dict[tuple[str, int, int], LogGrant | None] = {}

    @staticmethod
    def _key(member: MemberLog) -> tuple[str, int, int]:
        return (member.job_id, member.attempt, member.rank)

    def get(self, member: MemberLog) -> str | None:
        """The grant text to send for ``member``, or None to send none."""
        key = self._key(member)
        with self._lock:
            if key in self._grants:
                grant = self._grants[key]
                if grant is None or self._clock() < grant.expires_at_s - self._margin_s:
                    return None if grant is None else grant.text
        grant = self._fetch(member)  # outside the lock: an RPC
        with self._lock:
            self._grants[key] = grant
        return None if grant is None else grant.text

    def forget(self, member: MemberLog) -> None:
        """Drop ``member``'s grant (a worker refused it): the next :meth:`get` fetches."""
        with self._lock:
            self._grants.pop(self._key(member), None)


def fetch_grant(client: ClusterClient, member: MemberLog) -> LogGrant | None:
    """A grant to read ``member``'s log, from the leader; None from a cluster that signs
    none (insecure, ``NEEDS_TLS``). A refusal (not the job's owner, no credential) is
    raised as the ``grpc.RpcError`` it is."""
    request = pb.GrantLogAccessRequest(
        job_id=member.job_id, attempt=member.attempt, rank=member.rank
    )
    try:
        answer: pb.GrantLogAccessResponse = client.ask("GrantLogAccess", request)
    except grpc.RpcError as exc:
        if failure_of(exc).reason is Reason.NEEDS_TLS:
            return None
        raise
    return LogGrant(answer.grant, answer.expires_at_ms / 1000)


def grant_metadata(grant: str | None) -> tuple[tuple[str, str], ...]:
    return () if grant is None else ((GRANT_METADATA_KEY, grant),)


def _stub(channel: grpc.Channel) -> wpb_grpc.WorkerServiceStub:
    return wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]


def read_log(
    member: MemberLog, timeout_s: float, transport: Transport, grant: str | None
) -> Iterator[bytes]:
    """The member's output written so far, read over ``transport`` with ``grant``.
    Raises :class:`LookupError` when the worker has no log for it (not started yet),
    the worker's ``grpc.RpcError`` when it refuses the grant (``UNAUTHENTICATED``,
    ``PERMISSION_DENIED``), and :class:`WorkerUnreachable` otherwise."""
    request = wpb.ReadLogRequest(
        job_id=member.job_id, attempt=member.attempt, rank=member.rank, follow=False
    )
    with transport.channel(member.address, worker=member.node_id) as channel:
        try:
            for chunk in _stub(channel).ReadLog(
                request, timeout=timeout_s, metadata=grant_metadata(grant)
            ):
                if chunk.data:
                    yield chunk.data
        except grpc.RpcError as exc:
            code = exc.code()
            if code is grpc.StatusCode.NOT_FOUND:
                raise LookupError(exc.details()) from exc
            if code in REFUSED:
                raise
            name = code.name if code else "UNKNOWN"
            detail = f"{name}: {exc.details()}"
            raise WorkerUnreachable(member.node_id, member.address, detail) from exc


class MemberFollower(threading.Thread):
    """Follows one member's log until it has exited and everything was sent (``done``),
    or until :meth:`stop`. Waits for the log to appear and reconnects, from the last
    offset, when the worker's stream breaks; every (re)connection sends the member's
    current grant from ``grants``, and a refused grant is fetched anew before the next
    one."""

    def __init__(
        self, member: MemberLog, printer: LogSink, transport: Transport, grants: GrantCache
    ) -> None:
        super().__init__(name=f"log-rank-{member.rank}", daemon=True)
        self.member = member
        self.printer = printer
        self.transport = transport
        self.grants = grants
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
        with self.transport.channel(self.member.address, worker=self.member.node_id) as channel:
            stub = _stub(channel)
            while not self._stopping.is_set():
                request = wpb.ReadLogRequest(
                    job_id=self.member.job_id,
                    attempt=self.member.attempt,
                    rank=self.member.rank,
                    offset=offset,
                    follow=True,
                )
                try:
                    grant = self.grants.get(self.member)
                except grpc.RpcError as exc:
                    code = exc.code()
                    self.last_error = (
                        f"no grant: {code.name if code else 'UNKNOWN'}: {exc.details()}"
                    )
                    self._stopping.wait(RETRY_S)
                    continue
                except ClusterUnavailable as exc:
                    self.last_error = f"no grant: {exc}"
                    self._stopping.wait(RETRY_S)
                    continue
                stream = stub.ReadLog(request, metadata=grant_metadata(grant))
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
                    if code in REFUSED:
                        self.grants.forget(self.member)  # expired, most likely: ask again
                finally:
                    with self._call_lock:
                        self._call = None
                    if self.done or self._stopping.is_set():
                        self.printer.flush(self.member.rank)
                self._stopping.wait(RETRY_S)
        self.printer.flush(self.member.rank)


def stop_followers(followers: list[MemberFollower], drain_s: float) -> list[MemberFollower]:
    """Give ``followers`` up to ``drain_s`` to deliver the rest of their members' output,
    then stop them all and empty the list; those that stopped with output perhaps missing
    (not done, after an error), for the caller to say so."""
    deadline = time.monotonic() + drain_s
    for follower in followers:
        follower.join(max(0.0, deadline - time.monotonic()))
    for follower in followers:
        follower.stop()
    for follower in followers:
        follower.join(2.0)
    incomplete = [f for f in followers if not f.done and f.last_error]
    followers.clear()
    return incomplete


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line a member wrote (without its newline), decoded as UTF-8 (invalid bytes
    become U+FFFD). ``str(line)`` is ``[rank N] text``."""

    rank: int
    attempt: int
    text: str

    def __str__(self) -> str:
        return f"[rank {self.rank}] {self.text}"


class LogLines:
    """A :class:`~synapse_ha.client.logs.LogSink` that cuts members' bytes into lines and
    queues them for the caller's thread."""

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.out: queue.SimpleQueue[LogLine] = queue.SimpleQueue()
        self._partial: dict[int, bytes] = {}

    def feed(self, rank: int, data: bytes) -> None:
        *lines, rest = (self._partial.pop(rank, b"") + data).split(b"\n")
        if rest:
            self._partial[rank] = rest
        for line in lines:
            self.out.put(LogLine(rank, self.attempt, line.decode("utf-8", errors="replace")))

    def flush(self, rank: int) -> None:
        rest = self._partial.pop(rank, b"")
        if rest:
            self.out.put(LogLine(rank, self.attempt, rest.decode("utf-8", errors="replace")))

    def drain(self) -> Iterator[LogLine]:
        while True:
            try:
                yield self.out.get_nowait()
            except queue.Empty:
                return
