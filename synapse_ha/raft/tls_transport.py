"""The Raft channel over mutual TLS: pysyncobj's transport interface (``transportClass``)
with replica certificates and the schema encoding of :mod:`synapse_ha.raft.wire`.

**Who may talk.** Each replica listens on its Raft address and presents the
certificate it serves gRPC with; both sides require the peer's certificate to be issued
by a CA of the bundle, and the listener's to carry the replicas' role name
(:data:`~synapse_ha.security.pki.REPLICA_SERVER_NAME`), checked in the handshake. After
the handshake each side reads the identity the peer's certificate names
(:func:`~synapse_ha.security.pki.identity_of_cert`) and closes the connection unless it
is a replica: a worker's or a user's certificate of the same CA, a certificate of
another CA, and a plaintext client never deliver a message. The replica a certificate
names must also be the member at the Raft address the connection speaks for (the address
dialled, or the one an incoming connection announces), whenever the members' replica ids
are known: a replica's certificate cannot speak for another member. The replica names each
refused peer and why in the log, at most once per peer and reason every
:data:`~synapse_ha.raft.password_transport.PEER_NOTICE_INTERVAL_S` (:class:`RefusalLog`).

**What is sent.** A frame of :mod:`synapse_ha.raft.wire`: never pickle. A frame that
does not decode, or a message whose log entries hold a command that imports or calls
(:func:`~synapse_ha.raft.safe_pickle.message_problem`), closes that connection only.

**Connections** follow pysyncobj's TCP transport: of two members, the one with the
greater address connects, retries ``connectionRetryTime`` after its last attempt, and
its first frame is its Raft address; a connection on which this replica sends while
nothing arrived for ``connectionTimeout`` is closed. pysyncobj hears ``onNodeConnected`` once a
connection is established (outgoing) or has named a member (incoming), and
``onNodeDisconnected`` when it closes (the peer's process ended, a bad frame, a full
queue). Utility messages (pysyncobj's admin tool) and read-only nodes are not served.

The TLS files are read again for a new connection after they change, as the gRPC
ports do.

**Threads.** All socket work runs on one thread of this transport with an asyncio loop;
pysyncobj's callbacks run on its Raft thread: received messages wait in a queue, and a
pipe registered with pysyncobj's poller wakes the Raft thread. :meth:`TlsTransport.send`
never blocks: each connection queues at most :data:`MAX_QUEUED_BYTES` not yet written,
and a connection whose peer does not read that much is closed (Raft tolerates lost
messages; the leader sends again after the reconnect).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import ssl
import threading
from collections.abc import Callable
from typing import Any

from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import TransportNotReadyError

from synapse_ha.core.identity.access import Kind
from synapse_ha.raft import wire
from synapse_ha.raft.adapter import TransportBase
from synapse_ha.raft.password_transport import PeerThrottle
from synapse_ha.raft.safe_pickle import message_problem
from synapse_ha.security.pki import REPLICA_SERVER_NAME, PkiError, identity_of_cert
from synapse_ha.security.tls import TlsError, TlsFiles, read_material
from synapse_ha.security.tls import Transport as GrpcTransport

log_ = logging.getLogger(__name__)

# Bytes queued for one peer and not yet written before its connection is closed. A
# snapshot sent to a follower is queued whole in one tick (pysyncobj sends every chunk at
# once), so the bound is that of a whole state (the gRPC answers' too); a peer that reads
# nothing loses its connection well before, after connectionTimeout.
MAX_QUEUED_BYTES = 512 << 20
# How long the loop thread gets to close its connections when the transport is destroyed.
_STOP_WAIT_S = 5.0


class RefusalLog(PeerThrottle):
    """Says, at most once per peer and reason per ``interval_s``, that a Raft peer was
    refused. ``reports`` counts every refusal (logged or not)."""

    def refused(self, peer: str, why: str) -> None:
        if not self.due(peer, why):
            return
        log_.warning(
            "Raft peer %s refused: %s. This replica talks Raft over mutual TLS with "
            "replica certificates of the cluster's CA (raft.transport = tls); a replica on "
            "the password channel (raft.transport = password, --insecure, or an earlier "
            "release) cannot reach it",
            peer,
            why,
        )


def tls_contexts(files: TlsFiles) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The listener's and the dialer's TLS contexts: this replica's certificate, the CA
    bundle, a certificate required from the peer; the dialer also checks the replicas'
    role name. Raises :class:`~synapse_ha.security.tls.TlsError` when the files do not
    fit."""
    material = read_material(files)
    contexts = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(purpose)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(files.cert), str(files.key))
        context.load_verify_locations(cadata=material.ca.decode())
        context.verify_mode = ssl.CERT_REQUIRED
        contexts.append(context)
    return contexts[0], contexts[1]


def peer_replica(writer: asyncio.StreamWriter) -> tuple[str, str | None]:
    """The replica the peer's certificate names, or why the peer of a TLS connection is
    not a replica: ``(name, None)`` or ``("", why)``."""
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return "", "no certificate"
    try:
        identity = identity_of_cert(der)
    except PkiError:
        return "", "an unreadable certificate"
    if identity is None:
        return "", "a certificate that names no identity of this cluster"
    if identity.kind is not Kind.REPLICA:
        return "", f"the certificate of {identity}, not of a replica"
    return identity.name, None


def impersonation(node: Any, replica: str) -> str | None:
    """Why a connection whose certificate names ``replica`` may not speak for ``node``
    (None: it may). A member whose replica id is not known (its id is its address: a
    member of an earlier release, or one configured without ids) is not checked."""
    expected = str(getattr(node, "replica_id", "") or "")
    if not expected or expected == str(node.address) or expected == replica:
        return None
    return (
        f"the certificate of replica {replica!r}, but the member at {node.address} "
        f"is replica {expected!r}"
    )


class _Link:
    """One connection, established or being established. Its socket is the loop
    thread's; the Raft thread queues frames with :meth:`queue_frame`."""

    def __init__(self, transport: TlsTransport, outgoing_node: Any = None) -> None:
        self._transport = transport
        self.node: Any = outgoing_node  # for an incoming link, set by the Raft thread on hello
        self.outgoing = outgoing_node is not None
        self.writer: asyncio.StreamWriter | None = None
        self._outbox: collections.deque[bytes] = collections.deque()
        self.queued = 0  # bytes queued: written by the Raft thread only
        self.written = 0  # bytes written: by the loop thread only
        self._wake = asyncio.Event()
        self._signalled = False
        self.closed = False
        self.last_read = raft_clock()  # when a frame last arrived: by the loop thread only
        self.replica = ""  # the replica the peer's certificate names, once checked

    def queue_frame(self, data: bytes) -> bool:
        """Queue a frame (Raft thread); False when the peer has not read enough."""
        if self.closed:
            return False
        if self.queued - self.written + len(data) > MAX_QUEUED_BYTES:
            peer = getattr(self.node, "address", "?")
            log_.warning("Raft peer %s does not read its messages: closing", peer)
            self.close_soon()
            return False
        self.queued += len(data)
        self._outbox.append(data)
        if not self._signalled:
            self._signalled = True
            self._transport.loop.call_soon_threadsafe(self._signal)
        return True

    def close_soon(self) -> None:
        """Close from any thread."""
        self._transport.loop.call_soon_threadsafe(self.close)

    def close(self) -> None:
        """Close at once, unsent data dropped (loop thread): a peer that does not read
        would hold a graceful close forever."""
        self.closed = True
        self._wake.set()
        if self.writer is not None:
            self.writer.transport.abort()

    def _signal(self) -> None:
        self._signalled = False
        self._wake.set()

    async def write_loop(self, writer: asyncio.StreamWriter) -> None:
        while not writer.is_closing():
            await self._wake.wait()
            self._wake.clear()
            batch = []
            while self._outbox:
                batch.append(self._outbox.popleft())
            if batch:
                data = b"".join(batch)
                writer.write(data)
                await writer.drain()
                self.written += len(data)


class TlsTransport(TransportBase):
    """pysyncobj's transport over mutual TLS between replicas (module docstring).
    ``files``: this replica's CA bundle, certificate and key."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any, *, files: TlsFiles) -> None:
        TransportBase.__init__(self, syncObj, selfNode, otherNodes)
        if selfNode is None:
            raise ValueError("the TLS Raft transport serves members only, not read-only nodes")
        self._sync = syncObj
        self._self = selfNode
        self.refusals = RefusalLog()
        self._files = GrpcTransport(files)
        self._files_version = self._files.version()
        self._server_ctx, self._client_ctx = tls_contexts(files)
        self._nodes: dict[str, Any] = {}  # address -> node (Raft thread)
        self._links: dict[Any, _Link] = {}  # node -> its connected link (Raft thread)
        self._dialers: dict[Any, asyncio.Task[None]] = {}  # loop thread
        self._inbox: queue.SimpleQueue[tuple[str, _Link, Any]] = queue.SimpleQueue()
        self._raft_signalled = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        syncObj.raft_poller().subscribe(self._wake_r, self._on_wake, POLL_EVENT_TYPE.READ)
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._ready = False
        self._bind_done = threading.Event()
        self._last_bind = 0.0
        self._bind_attempts = 0
        self._thread = threading.Thread(
            target=self._run_loop, name=f"raft-tls {selfNode.address}", daemon=True
        )
        self._thread.start()
        syncObj.addOnTickCallback(self._on_tick)
        for node in otherNodes:
            self.addNode(node)

    # ------------------------------------------------------------ Raft thread

    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:
        self._maybe_bind()

    def waitReady(self) -> None:
        self._bind_done.wait()
        if not self._ready:
            raise TransportNotReadyError

    def _maybe_bind(self) -> None:
        conf = self._sync.conf
        if self._ready or raft_clock() < self._last_bind + conf.bindRetryTime:
            return
        self._last_bind = raft_clock()
        host, port = (conf.bindAddress or self._self.address).rsplit(":", 1)
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accepted, host, int(port), reuse_address=True),
            self.loop,
        )
        try:
            self._server = future.result()
        except OSError as exc:
            self._bind_attempts += 1
            log_.warning("cannot listen for Raft peers on %s:%s: %s", host, port, exc)
            if conf.maxBindRetries and self._bind_attempts >= conf.maxBindRetries:
                self._bind_done.set()
                raise TransportNotReadyError from exc
            return
        self._ready = True
        self._bind_done.set()

    def _on_tick(self) -> None:
        with contextlib.suppress(TransportNotReadyError):
            self._maybe_bind()
        self._drain_inbox()

    def _on_wake(self, _descr: int, _event: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        self._drain_inbox()

    def _drain_inbox(self) -> None:
        self._raft_signalled = False
        while True:
            try:
                what, link, value = self._inbox.get_nowait()
            except queue.Empty:
                return
            if what == "message":
                if link.node is not None and self._links.get(link.node) is link:
                    self._deliver(link, value)
            elif what == "connected":
                self._connected(link, value)
            elif what == "closed":
                node = link.node
                if node is not None and self._links.get(node) is link:
                    del self._links[node]
                    self.node_disconnected(node)

    def _deliver(self, link: _Link, message: Any) -> None:
        """Hand ``message`` to pysyncobj; a message its handler cannot take (a field
        missing or of another type) closes the connection it came on."""
        try:
            self.deliver(link.node, message)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            log_.warning(
                "closing the Raft connection with %s: a message pysyncobj cannot handle (%r)",
                getattr(link.node, "address", "?"),
                exc,
            )
            link.close_soon()

    def _connected(self, link: _Link, address: str) -> None:
        """An outgoing link is up, or an incoming one named the member ``address``."""
        node = link.node if link.outgoing else self._nodes.get(address)
        if node is None or self._nodes.get(node.address) is not node:
            if not link.outgoing:
                self.refusals.refused(f"{address!r} (incoming)", "it is not a member")
            link.close_soon()
            return
        claim = impersonation(node, link.replica)
        if claim is not None:
            self.refusals.refused(f"{address!r} (incoming)", f"it presented {claim}")
            link.close_soon()
            return
        link.node = node
        previous = self._links.get(node)
        self._links[node] = link
        if previous is not None:
            previous.close_soon()
        self.node_connected(node)

    def _should_connect(self, node: Any) -> bool:
        return bool(self._self.address > node.address)

    def addNode(self, node: Any) -> None:
        self._nodes[node.address] = node
        if self._should_connect(node):
            self.loop.call_soon_threadsafe(self._start_dialer, node)

    def dropNode(self, node: Any) -> None:
        address = node.address
        if self._nodes.get(address) is node:
            del self._nodes[address]
        link = self._links.pop(node, None)
        self.loop.call_soon_threadsafe(self._stop_dialer, node)
        if link is not None:
            link.close_soon()

    def send(self, node: Any, message: Any) -> bool:
        link = self._links.get(node)
        if link is None or link.closed:
            return False
        if raft_clock() - link.last_read > self._sync.conf.connectionTimeout:
            # As pysyncobj's channel: a peer that sends nothing back while this replica
            # sends (a paused process) loses its connection, reopened when it answers.
            link.close_soon()
            return False
        try:
            data = wire.frame(message)
        except wire.WireError as exc:
            log_.error("a Raft message to %s cannot be encoded: %s", node.address, exc)
            return False
        return link.queue_frame(data)

    def destroy(self) -> None:
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        self._sync.raft_poller().unsubscribe(self._wake_r)
        if self.loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
            with contextlib.suppress(Exception):
                future.result(_STOP_WAIT_S)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_STOP_WAIT_S)
        self._links.clear()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # ------------------------------------------------------------ loop thread

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _post(self, what: str, link: _Link, value: Any = None) -> None:
        self._inbox.put((what, link, value))
        if not self._raft_signalled:
            self._raft_signalled = True
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"x")

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_dialer(self, node: Any) -> None:
        if node not in self._dialers:
            self._dialers[node] = self.loop.create_task(self._dial(node))

    def _stop_dialer(self, node: Any) -> None:
        task = self._dialers.pop(node, None)
        if task is not None:
            task.cancel()

    async def _dial(self, node: Any) -> None:
        """Connect to ``node`` and serve the connection, again and again."""
        conf = self._sync.conf
        while True:
            started = raft_clock()
            link = _Link(self, node)
            with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(node.host, node.port), conf.connectionTimeout
                )
                await self._serve(link, reader, writer)
            wait = conf.connectionRetryTime - (raft_clock() - started)
            await asyncio.sleep(max(wait, 0.0))

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A cancelled task here is logged by asyncio's server as an error: at shutdown
        # the task ends normally.
        with contextlib.suppress(OSError, TimeoutError, ssl.SSLError, asyncio.CancelledError):
            await self._serve(_Link(self), reader, writer)

    def _reload_changed_files(self) -> None:
        """Read the TLS files again when they changed (a rotated certificate or CA
        bundle serves new connections); files that do not fit keep the previous ones."""
        version = self._files.version()
        if version == self._files_version:
            return
        self._files_version = version
        assert self._files.files is not None
        try:
            self._server_ctx, self._client_ctx = tls_contexts(self._files.files)
        except (TlsError, OSError, ssl.SSLError) as exc:
            log_.error(
                "the changed TLS files do not serve the Raft channel (%s): kept the previous ones",
                exc,
            )

    async def _serve(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Secure ``writer``'s connection, check the peer, then exchange frames until the
        connection closes."""
        peer = _peer_name(link, writer)
        timeout = self._sync.conf.connectionTimeout
        self._reload_changed_files()
        try:
            if link.outgoing:
                await writer.start_tls(
                    self._client_ctx,
                    server_hostname=REPLICA_SERVER_NAME,
                    ssl_handshake_timeout=timeout,
                )
            else:
                await writer.start_tls(self._server_ctx, ssl_handshake_timeout=timeout)
        except (TimeoutError, ssl.SSLError, OSError, ConnectionError) as exc:
            self.refusals.refused(peer, f"the TLS handshake failed ({_reason(exc)})")
            writer.close()
            return
        link.replica, refusal = peer_replica(writer)
        if refusal is None and link.outgoing:
            refusal = impersonation(link.node, link.replica)
        if refusal is not None:
            self.refusals.refused(peer, f"it presented {refusal}")
            writer.close()
            return
        await self._exchange(link, reader, writer, peer)

    async def _exchange(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
    ) -> None:
        link.writer = writer
        writing = self.loop.create_task(link.write_loop(writer))
        announced = False
        try:
            if link.outgoing:
                writer.write(wire.frame(self._self.address))
                self._post("connected", link, link.node.address)
                announced = True
            while True:
                message = await _read_message(reader)
                link.last_read = raft_clock()
                if not announced:
                    if not isinstance(message, str):
                        raise wire.WireError("the first frame does not name a member")
                    self._post("connected", link, message)
                    announced = True
                    continue
                problem = message_problem(message)
                if problem is not None:
                    raise wire.WireError(problem)
                self._post("message", link, message)
        except wire.WireError as exc:
            log_.warning("closing the Raft connection with %s: %s", peer, exc)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError):
            pass  # the peer closed the connection, or its process ended
        finally:
            link.closed = True
            writing.cancel()
            writer.transport.abort()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writing
            if announced:
                self._post("closed", link)


async def _read_message(reader: asyncio.StreamReader) -> Any:
    header = await reader.readexactly(wire.LENGTH.size)
    payload = await reader.readexactly(wire.frame_length(header))
    return wire.decode(payload)


def _peer_name(link: _Link, writer: asyncio.StreamWriter) -> str:
    if link.outgoing:
        return str(link.node.address)
    address = writer.get_extra_info("peername")
    host = str(address[0]) if address else "?"
    return f"at {host} (incoming)"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def tls_transport_class(files: TlsFiles) -> Callable[..., TlsTransport]:
    """What ``SyncObj``'s ``transportClass`` takes: a maker of :class:`TlsTransport` with
    ``files``."""

    def make(syncObj: Any, selfNode: Any, otherNodes: Any) -> TlsTransport:
        return TlsTransport(syncObj, selfNode, otherNodes, files=files)

    return make
