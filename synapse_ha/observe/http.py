"""One HTTP(S) server per process: ``/metrics`` and, on replicas, the web dashboard.

Secure by default. With TLS files (the process's own certificate, key and the cluster
CA bundle) the server speaks HTTPS only and:

* ``/metrics`` answers only a client that presented a certificate issued by the cluster
  CA (Prometheus' ``tls_config`` ``cert_file``/``key_file``/``ca_file``); any other
  caller gets 401. The certificate is verified during the handshake.
* the dashboard (when one is mounted) needs no client certificate (browsers seldom have
  one): it authenticates each request with the user's bearer token (see
  :mod:`synapse_ha.observe.dashboard`).

A process that serves metrics only (a worker) requires the client certificate at the
handshake itself. Without TLS files (``--insecure`` processes) it serves plain HTTP to
anyone.

The TLS handshake runs in the request's own thread, never in the accepting loop, so a
slow or silent client cannot hold up the others. Certificates are read when the server
starts; a rotation takes effect at the next start.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from synapse_ha.security.tls import TlsFiles

log = logging.getLogger("synapse.observe")

HANDSHAKE_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0


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


# Serves every path other than /metrics (the dashboard); None: 404 for them.
App = Callable[[Request], Response]


def _server_context(files: TlsFiles, require_client_cert: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(files.cert), str(files.key))
    context.load_verify_locations(cafile=str(files.ca))
    context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    tls: ssl.SSLContext | None = None

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            try:
                request.settimeout(HANDSHAKE_TIMEOUT_S)
                request = self.tls.wrap_socket(request, server_side=True)
                request.settimeout(REQUEST_TIMEOUT_S)
            except (OSError, ssl.SSLError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address, exc)
                self.shutdown_request(request)
                return
        super().process_request_thread(request, client_address)


class ObserveServer:
    """Serves ``registry`` at ``/metrics`` and ``app`` at every other path, on
    ``host:port`` (port 0 picks a free one; :attr:`port` says which)."""

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        tls: TlsFiles | None,
        app: App | None = None,
    ) -> None:
        host, port = parse_address(address)
        self.registry = registry
        self.app = app
        self.secure = tls is not None
        self._server = _Server((host, port), self._handler_class())
        if tls is not None:
            # The dashboard needs no client certificate; metrics alone require one.
            self._server.tls = _server_context(tls, require_client_cert=app is None)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="observe-http", daemon=True
        )

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

    def stop(self) -> None:
        """Stop serving and close the socket; also for a server that was never started."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=2.0)
        self._server.server_close()

    def handle(self, request: Request) -> Response:
        """Route one request (also called directly by tests and the benchmark)."""
        if request.path.split("?", 1)[0] == "/metrics":
            if request.method != "GET":
                return Response(405, b"GET only\n", "text/plain; charset=utf-8")
            if self.secure and not request.client_verified:
                return Response(
                    401,
                    b"/metrics needs a client certificate issued by the cluster CA\n",
                    "text/plain; charset=utf-8",
                )
            encoder, content_type = choose_encoder(request.headers.get("accept", ""))
            return Response(200, encoder(self.registry), content_type)
        if self.app is None:
            return Response(404, b"only /metrics is served here\n", "text/plain; charset=utf-8")
        return self.app(request)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "synapse-observe"
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(min(length, 1 << 16)) if length else b""
                peer = getattr(self.connection, "getpeercert", None)
                verified = bool(peer()) if peer is not None else False
                request = Request(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                    client_verified=verified,
                )
                try:
                    response = outer.handle(request)
                except Exception:
                    log.exception("serving %s failed", self.path)
                    response = Response(500, b"internal error\n", "text/plain; charset=utf-8")
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                self.send_header("Cache-Control", "no-store")
                for name, value in response.headers:
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(response.body)

            do_GET = _serve
            do_POST = _serve
            do_HEAD = _serve

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        return Handler
