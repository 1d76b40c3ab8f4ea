"""The observe HTTP server's bounds, over real sockets on 127.0.0.1: sizes, deadlines,
the connection limit, the worker pool, cheap answers off the pool, and the security
headers on every answer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import CollectorRegistry, Counter

from synapse_ha.observe.http import (
    SECURITY_HEADERS,
    BadRequest,
    ObserveServer,
    Request,
    Response,
    ServerLimits,
    parse_head,
)

WAIT_S = 10.0  # bound on every socket read here; none should come near it


class App:
    """``/quick`` is answered by triage; ``/block`` waits for :attr:`release`; anything
    else echoes the body from the pool."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def triage(self, request: Request) -> Response | None:
        return Response(200, b"quick") if request.path == "/quick" else None

    def __call__(self, request: Request) -> Response:
        if request.path == "/block":
            self.entered.release()
            self.release.wait(WAIT_S)
        return Response(200, b"echo:" + request.body)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("probe", "a probe", registry=registry).inc()
    return registry


@contextmanager
def serving(limits: ServerLimits) -> Iterator[tuple[ObserveServer, App]]:
    app = App()
    server = ObserveServer("127.0.0.1:0", _registry(), None, app=app, limits=limits)
    server.start()
    try:
        yield server, app
    finally:
        app.release.set()
        server.stop()


def connect(server: ObserveServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def exchange(server: ObserveServer, raw: bytes) -> bytes:
    """Send ``raw`` on a new connection and read until the server closes it."""
    with connect(server) as sock:
        sock.sendall(raw)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer.split(b" ", 2)[1])


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{extra}\r\n".encode()


def test_every_answer_carries_the_security_headers() -> None:
    with serving(ServerLimits(head_timeout_s=0.5, max_body_bytes=8)) as (server, _):
        answers = {
            "pool": exchange(server, get("/x")),
            "triage": exchange(server, get("/quick")),
            "metrics": exchange(server, get("/metrics")),
            "method": exchange(server, b"PUT /metrics HTTP/1.0\r\nHost: t\r\n\r\n"),
            "too large": exchange(server, b"POST /x HTTP/1.1\r\nContent-Length: 9\r\n\r\n"),
            "malformed": exchange(server, b"GET nowhere\r\n\r\n"),
            "slow": exchange(server, b"GET / HTTP/1.1\r\n"),
        }
    statuses = {what: status_of(answer) for what, answer in answers.items()}
    assert statuses == {
        "pool": 200,
        "triage": 200,
        "metrics": 200,
        "method": 405,
        "too large": 413,
        "malformed": 400,
        "slow": 408,
    }
    for what, answer in answers.items():
        head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        for name, value in SECURITY_HEADERS:
            assert f"\r\n{name}: {value}\r" in head + "\r", (what, name)


def test_heads_and_bodies_are_bounded() -> None:
    with serving(ServerLimits(max_head_bytes=1024, max_body_bytes=16)) as (server, _):
        huge = b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 4096 + b"\r\n\r\n"
        assert status_of(exchange(server, huge)) == 431
        body = b"POST /x HTTP/1.1\r\nConnection: close\r\nContent-Length: 17\r\n\r\n"
        assert status_of(exchange(server, body + b"x" * 17)) == 413
        chunked = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        assert status_of(exchange(server, chunked)) == 501
        fits = b"POST /x HTTP/1.1\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello"
        assert exchange(server, fits).endswith(b"echo:hello")


def test_a_connection_serves_several_requests_and_closes_when_idle() -> None:
    with serving(ServerLimits(idle_timeout_s=0.3)) as (server, _), connect(server) as sock:
        for _ in range(3):
            sock.sendall(b"GET /quick HTTP/1.1\r\nHost: t\r\n\r\n")
            answer = b""
            while not answer.endswith(b"quick"):
                answer += sock.recv(65536)
            assert status_of(answer) == 200 and b"Connection: keep-alive" in answer
        assert read_all(sock) == b""  # idle past the limit: closed without a word


def test_slow_clients_hold_no_worker_and_the_oldest_waiter_makes_room() -> None:
    """Twice as many silent and half-sent connections as the server allows, on a pool of
    one worker: a complete request is still answered, from the pool."""
    limits = ServerLimits(workers=1, queue=1, connections=20, head_timeout_s=WAIT_S)
    with serving(limits) as (server, _):
        slow = []
        try:
            for i in range(40):
                sock = connect(server)
                if i % 2:
                    sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
                slow.append(sock)
            assert exchange(server, get("/x")).endswith(b"echo:")
            # The first ones were closed to make room (read returns end of file).
            assert read_all(slow[0]) == b""
        finally:
            for sock in slow:
                sock.close()


def test_the_pool_is_bounded_and_cheap_answers_do_not_need_it() -> None:
    limits = ServerLimits(workers=1, queue=1)
    with serving(limits) as (server, app):
        blocked = [connect(server) for _ in range(2)]
        try:
            for sock in blocked:
                sock.sendall(get("/block"))
            assert app.entered.acquire(timeout=WAIT_S)  # the worker is taken, one queued
            busy = exchange(server, get("/x"))
            assert status_of(busy) == 503 and b"Retry-After: 1" in busy
            assert exchange(server, get("/quick")).endswith(b"quick")  # triage: no worker
            app.release.set()
            for sock in blocked:
                assert read_all(sock).endswith(b"echo:")
        finally:
            for sock in blocked:
                sock.close()


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n Folded: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nName : x\r\n\r\n", 400),
    ],
)
def test_malformed_heads_are_refused(head: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_head(head)
    assert refused.value.status == status


def test_heads_are_parsed_with_repeated_headers_joined() -> None:
    method, target, version, headers = parse_head(
        b"POST /a?b=1 HTTP/1.1\r\nHost: h\r\nCookie: a=1\r\ncookie: b=2\r\n\r\n"
    )
    assert (method, target, version) == ("POST", "/a?b=1", "HTTP/1.1")
    assert headers == {"host": "h", "cookie": "a=1; b=2"}


def test_a_server_never_started_closes_its_socket() -> None:
    server = ObserveServer("127.0.0.1:0", _registry(), None)
    port = server.port
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0)
