"""One HTTP(S) server per process: ``/metrics`` and, on replicas, the web dashboard.

Secure by default. With TLS files (the process's own certificate, key and the cluster
CA bundle) the server speaks HTTPS only and:

* ``/metrics`` answers only a client that presented a certificate issued by the cluster
  CA (Prometheus' ``tls_config`` ``cert_file``/``key_file``/``ca_file``); any other
  caller gets 401. The certificate is verified during the handshake.
* the dashboard (when one is mounted) needs no client certificate (browsers seldom have
  one): it authenticates each request with a session or the user's bearer token (see
  :mod:`synapse_ha.observe.dashboard`).

A process that serves metrics only (a worker) requires the client certificate at the
handshake itself. Without TLS files (``--insecure`` processes) it serves plain HTTP to
anyone.

**Bounded.** Reachable by anyone who can open a TCP connection, so no client may hold
more than a fixed share of it (:class:`ServerLimits`):

* One event-loop thread owns every connection: the TLS handshake, reading the request
  head and body, writing the answer. A connection that is waiting for its client costs a
  socket and a few kilobytes, never a thread, so slow or silent clients (slowloris)
  cannot take the threads that serve the others.
* Each phase has a deadline (handshake, request head, body, keep-alive idle, write);
  a connection that misses one is closed. Heads and bodies have size limits (431, 413).
* At most ``connections`` are open. A new one beyond that closes the connection that has
  waited longest for its client (never one whose answer is being made), so a flood of
  idle connections pushes out its own oldest members rather than the next real viewer.
* Complete requests that need work (an API call, a scrape) run on a fixed pool of
  ``workers`` threads with at most ``queue`` more waiting; beyond that the answer is 503.
  Requests that need no work — no credential, a form, a refusal — are answered on the
  event loop by the app's :meth:`App.triage` without entering the pool, so unauthenticated
  load is refused cheaply.

Every answer, errors and redirects included, carries :data:`SECURITY_HEADERS`: no
framing, no inline script or style, no MIME sniffing, no referrer to other sites, no
caching.
Certificates are read when the server starts; a rotation takes effect at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from synapse_ha.security.tls import TlsFiles

log = logging.getLogger("synapse.observe")

TEXT = "text/plain; charset=utf-8"
# How long a finished connection may take to close cleanly (TLS close_notify) before it
# is cut.
CLOSE_TIMEOUT_S = 2.0

# On every answer. The dashboard's pages use one stylesheet and one script from this
# origin (no inline ones), and the script fetches only this origin's pages; nothing may
# frame them (clickjacking) or read them from another origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    # same-origin, not no-referrer: under no-referrer browsers send "Origin: null" even
    # with the dashboard's own form posts, and the Origin check needs the real one.
    ("Referrer-Policy", "same-origin"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How much of the server any set of clients may hold (see the module docstring)."""

    workers: int = 8  # threads that run app requests and scrapes
    queue: int = 32  # complete requests waiting for a worker; beyond: 503
    connections: int = 256  # open connections; beyond: the longest-waiting one is closed
    backlog: int = 256  # the listening socket's accept queue
    handshake_timeout_s: float = 5.0
    head_timeout_s: float = 10.0  # the first request's head, from the end of the handshake
    idle_timeout_s: float = 15.0  # keep-alive: the whole next head
    body_timeout_s: float = 10.0
    write_timeout_s: float = 30.0
    max_head_bytes: int = 16 * 1024
    max_body_bytes: int = 64 * 1024
    max_requests_per_connection: int = 100


class AddressError(ValueError):
    """A metrics address that is not ``HOST:PORT``."""


def parse_address(value: str, what: str = "metrics address") -> tuple[str, int]:
    """``HOST:PORT`` (port 0: any free port) as a pair; :class:`AddressError` otherwise."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise AddressError(f"{what}: {value!r} is not HOST:PORT")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # lower-case names
    body: bytes
    client_verified: bool  # a client certificate from the cluster CA was presented


class App(Protocol):
    """Serves every path other than /metrics (the dashboard)."""

    def triage(self, request: Request) -> Response | None:
        """The answer when it needs no blocking work (a refusal, a redirect, a form, a
        static file), else None. Runs on the server's event loop: must not block."""
        ...

    def __call__(self, request: Request) -> Response:
        """The full answer; may block (API calls). Runs on the worker pool."""
        ...


def _server_context(files: TlsFiles, require_client_cert: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(files.cert), str(files.key))
    context.load_verify_locations(cafile=str(files.ca))
    context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class BadRequest(Exception):
    """A request the server answers with ``status`` and closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """``(method, target, version, headers)`` of an HTTP/1.x request head (ending with
    the blank line); header names lower-cased, repeated headers joined with ``, `` (with
    ``; `` for ``Cookie``).
    Raises :class:`BadRequest` (400, or 505 for another protocol version)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(505, "HTTP/1.0 or HTTP/1.1 only")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise BadRequest(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        if key in headers:  # one value, as RFC 9110 joins them (cookies: RFC 6265)
            value = headers[key] + ("; " if key == "cookie" else ", ") + value
        headers[key] = value
    return method, target, version, headers


def _encode(response: Response, head_only: bool, keep_alive: bool) -> bytes:
    try:
        phrase = http.HTTPStatus(response.status).phrase
    except ValueError:
        phrase = ""
    lines = [
        f"HTTP/1.1 {response.status} {phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
        "Server: synapse-observe",
    ]
    lines += [f"{name}: {value}" for name, value in SECURITY_HEADERS]
    lines += [f"{name}: {value}" for name, value in response.headers]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


@dataclass(slots=True)
class _Connection:
    task: asyncio.Task[None]
    waiting_since: float | None  # monotonic; None while its answer is being made


class ObserveServer:
    """Serves ``registry`` at ``/metrics`` and ``app`` at every other path, on
    ``host:port`` (port 0 picks a free one; :attr:`port` says which). The socket is bound
    here; :meth:`start` serves it and :meth:`stop` closes it (started or not)."""

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        tls: TlsFiles | None,
        app: App | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        host, port = parse_address(address)
        self.registry = registry
        self.app = app
        self.secure = tls is not None
        self.limits = limits or ServerLimits()
        # The dashboard needs no client certificate; metrics alone require one.
        self._tls = (
            _server_context(tls, require_client_cert=app is None) if tls is not None else None
        )
        self._socket = _listen(host, port, self.limits.backlog)
        self.host = host
        self.port = int(self._socket.getsockname()[1])
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="observe-http")
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="observe-http", daemon=True)
        # Loop-thread state only.
        self._connections: dict[int, _Connection] = {}
        self._in_pool = 0

    @property
    def url(self) -> str:
        """The base URL (``https://host:port``), as clients should use it."""
        scheme = "https" if self.secure else "http"
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        return f"{scheme}://{host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(5.0)

    def stop(self) -> None:
        """Stop serving, close every connection and the socket, and end the pool's
        threads (waiting for requests being answered); also for a server never started."""
        if self._thread.is_alive():
            stopping = self._stopping
            if stopping is not None:
                self._loop.call_soon_threadsafe(stopping.set)
            self._thread.join(timeout=10.0)
        else:
            self._loop.close()
        self._socket.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- routing

    def triage(self, request: Request) -> Response | None:
        """The answer when it needs no blocking work; None when it must go to the pool."""
        if request.path.split("?", 1)[0] == "/metrics":
            if request.method not in ("GET", "HEAD"):
                return Response(405, b"GET only\n", TEXT, (("Allow", "GET, HEAD"),))
            if self.secure and not request.client_verified:
                return Response(
                    401, b"/metrics needs a client certificate issued by the cluster CA\n", TEXT
                )
            return None
        if self.app is None:
            return Response(404, b"only /metrics is served here\n", TEXT)
        return self.app.triage(request)

    def handle(self, request: Request) -> Response:
        """Route one request (also called directly by tests and the benchmark)."""
        quick = self.triage(request)
        if quick is not None:
            return quick
        if request.path.split("?", 1)[0] == "/metrics":
            encoder, content_type = choose_encoder(request.headers.get("accept", ""))
            return Response(200, encoder(self.registry), content_type)
        assert self.app is not None  # triage answers every path when there is no app
        return self.app(request)

    def _triage_safely(self, request: Request) -> Response | None:
        try:
            return self.triage(request)
        except Exception:
            log.exception("triage of %s failed", request.path.split("?", 1)[0])
            return Response(500, b"internal error\n", TEXT)

    def _handle_safely(self, request: Request) -> Response:
        try:
            return self.handle(request)
        except Exception:
            log.exception("serving %s failed", request.path.split("?", 1)[0])
            return Response(500, b"internal error\n", TEXT)

    # -- the event loop

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=self._socket, limit=self.limits.max_head_bytes
        )
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            tasks = [c.task for c in self._connections.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _admit(self, task: asyncio.Task[None]) -> bool:
        """Count a new connection; at the limit, close the one that has waited longest
        for its client, or refuse this one when every other is being answered."""
        if len(self._connections) >= self.limits.connections:
            waiting = [c for c in self._connections.values() if c.waiting_since is not None]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
            self._connections.pop(id(oldest.task), None)
            oldest.task.cancel()
        self._connections[id(task)] = _Connection(task, time.monotonic())
        return True

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if not self._admit(task):
            writer.transport.abort()
            return
        me = self._connections[id(task)]
        limits = self.limits
        graceful = False
        try:
            if self._tls is not None:
                await writer.start_tls(self._tls, ssl_handshake_timeout=limits.handshake_timeout_s)
            verified = bool(writer.get_extra_info("peercert"))
            for served in range(limits.max_requests_per_connection):
                me.waiting_since = time.monotonic()
                request, version = await self._read_request(reader, writer, served, verified)
                if request is None:
                    break
                me.waiting_since = None
                response = self._triage_safely(request)
                if response is None:
                    response = await self._in_worker(request)
                keep_alive = (
                    version == "HTTP/1.1"
                    and request.headers.get("connection", "").lower() != "close"
                    and served + 1 < limits.max_requests_per_connection
                )
                await self._write(writer, response, request.method == "HEAD", keep_alive)
                if not keep_alive:
                    break
            graceful = True
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.debug("connection closed: %s", exc)
        except asyncio.CancelledError:
            # Closed to make room, or the server stops. This task is the connection's
            # own and nothing awaits it: ending it quietly is the whole of the answer.
            pass
        finally:
            self._connections.pop(id(task), None)
            if graceful:
                writer.close()
                try:
                    await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
                except (OSError, TimeoutError):
                    writer.transport.abort()
            else:
                writer.transport.abort()

    async def _read_request(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        served: int,
        verified: bool,
    ) -> tuple[Request | None, str]:
        """The next request (``served`` were answered on this connection before), or
        (None, "") when the connection is to be closed: the client left, was too slow,
        or sent something refused (answered here)."""
        limits = self.limits
        timeout_s = limits.idle_timeout_s if served else limits.head_timeout_s
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        except asyncio.IncompleteReadError:
            return None, ""  # the client closed
        except asyncio.LimitOverrunError:
            await self._refuse(writer, 431, "request head too large")
            return None, ""
        except TimeoutError:
            if not served:  # an idle keep-alive connection is closed without a word
                await self._refuse(writer, 408, "request head not received in time")
            return None, ""
        try:
            method, target, version, headers = parse_head(head)
        except BadRequest as exc:
            await self._refuse(writer, exc.status, str(exc))
            return None, ""
        if "transfer-encoding" in headers:
            await self._refuse(writer, 501, "send a Content-Length, not a Transfer-Encoding")
            return None, ""
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            await self._refuse(writer, 400, "bad Content-Length")
            return None, ""
        length = int(length_text)
        if length > limits.max_body_bytes:
            await self._refuse(writer, 413, f"request body over {limits.max_body_bytes} bytes")
            return None, ""
        body = b""
        if length:
            if headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await asyncio.wait_for(reader.readexactly(length), limits.body_timeout_s)
        request = Request(
            method=method, path=target, headers=headers, body=body, client_verified=verified
        )
        return request, version

    async def _in_worker(self, request: Request) -> Response:
        if self._in_pool >= self.limits.workers + self.limits.queue:
            return Response(503, b"busy; try again shortly\n", TEXT, (("Retry-After", "1"),))
        self._in_pool += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, self._handle_safely, request
            )
        finally:
            self._in_pool -= 1

    async def _write(
        self, writer: asyncio.StreamWriter, response: Response, head_only: bool, keep_alive: bool
    ) -> None:
        writer.write(_encode(response, head_only, keep_alive))
        await asyncio.wait_for(writer.drain(), self.limits.write_timeout_s)

    async def _refuse(self, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        response = Response(status, (message + "\n").encode(), TEXT)
        with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
            await self._write(writer, response, head_only=False, keep_alive=False)
