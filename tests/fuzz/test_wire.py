"""Raw bytes on the wire: the gRPC ports and the metrics/dashboard HTTPS port.

Each example opens connections to a live 3-replica cluster and sends: garbage, the HTTP/2
preface followed by truncated or random frames, over TLS with the admin's client
certificate, over TLS without one, and over plain TCP; valid gRPC frames whose protobuf
payload is random bytes (any method, as the admin); and garbage HTTP requests to the
metrics/dashboard port. After every batch: every replica runs and answers within a bound,
no call was answered UNKNOWN/INTERNAL, the metrics port still answers, the invariants hold
and, when nothing was accepted, the replicated state did not change.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.fuzz import harness
from tests.fuzz.cluster import FuzzCluster
from tests.fuzz.strategies import Method, request_methods

pytestmark = pytest.mark.integration

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CONNECT_TIMEOUT_S = 10.0
READ_S = 0.3  # how long we listen to the answer to garbage
METHODS = request_methods([pb.DESCRIPTOR])
TALLY = harness.Tally("wire")


def _frame(
    kind: int, flags: int, stream: int, payload: bytes, declared: int | None = None
) -> bytes:
    length = len(payload) if declared is None else declared
    return length.to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


FRAMES = st.builds(
    _frame,
    st.integers(0, 12),
    st.integers(0, 255),
    st.integers(0, 2**31 - 1),
    st.binary(max_size=64),
    st.one_of(st.none(), st.integers(0, 2**24 - 1)),
)
GARBAGE = st.one_of(
    st.binary(min_size=1, max_size=512),
    st.builds(
        lambda fs, cut: (PREFACE + b"".join(fs))[:cut],
        st.lists(FRAMES, max_size=4),
        st.integers(1, 600),
    ),
    st.builds(lambda fs: PREFACE + b"".join(fs), st.lists(FRAMES, min_size=1, max_size=4)),
)
HTTP_GARBAGE = st.one_of(
    st.binary(min_size=1, max_size=512),
    st.builds(
        lambda verb, path, headers: (
            f"{verb} {path} HTTP/1.1\r\n".encode(errors="replace") + headers + b"\r\n\r\n"
        ),
        st.sampled_from(["GET", "POST", "PUT", "DELETE", "BREW", "", "G\x00T"]),
        st.one_of(
            st.sampled_from(["/", "/metrics", "/api/jobs", "/../../etc", "/" + "a" * 5000]),
            st.text(max_size=30),
        ),
        st.one_of(
            st.binary(max_size=200),
            st.sampled_from(
                [
                    b"Authorization: Bearer syn_000000000000_x",
                    b"Content-Length: -1",
                    b"Content-Length: 99999999999",
                    b"Transfer-Encoding: chunked\r\n\r\nzz",
                    b"X: " + b"y" * 20000,
                ]
            ),
        ),
    ),
)
MODES = ["tls-cert", "tls-anonymous", "plain"]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire: int, body: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 2:
        return key + _varint(len(body)) + body
    if wire == 0:
        return key + _varint(int.from_bytes(body[:9] or b"\0", "little"))
    return key + (body + bytes(8))[: 8 if wire == 1 else 4]


# Protobuf that decodes: any field number (known or not) with any wire type and payload,
# so the handlers see wrong types, unknown fields and odd lengths.
WELL_FORMED = st.lists(
    st.builds(
        _field,
        st.one_of(st.integers(1, 20), st.integers(1, 2**29 - 1)),
        st.sampled_from([0, 1, 2, 5]),
        st.binary(max_size=40),
    ),
    max_size=6,
).map(b"".join)
PAYLOADS = st.one_of(st.binary(max_size=256), WELL_FORMED)


def _open(cluster: FuzzCluster, address: str, mode: str, alpn: list[str]) -> socket.socket:
    host, _, port = address.rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    if mode == "plain":
        return raw
    creds = cluster.replicas.credentials
    assert creds is not None
    context = ssl.create_default_context(cafile=str(creds.ca))
    context.check_hostname = False
    context.set_alpn_protocols(alpn)
    if mode == "tls-cert":
        files = creds.admin_tls()
        context.load_cert_chain(str(files.cert), str(files.key))
    return context.wrap_socket(raw, server_hostname=host)


def send_raw(cluster: FuzzCluster, address: str, mode: str, data: bytes, alpn: list[str]) -> None:
    """Connect, send ``data``, read what comes back for a moment, hang up. Any refusal
    (TLS alert, reset, close) is what a server should do with garbage."""
    with contextlib.suppress(OSError, ssl.SSLError), _open(cluster, address, mode, alpn) as s:
        s.sendall(data)
        s.settimeout(READ_S)
        with contextlib.suppress(OSError, ssl.SSLError):
            while s.recv(65536):
                pass
    TALLY.add("raw", mode, harness.Outcome(harness.REJECTED, "RAW"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzCluster]:
    c = FuzzCluster(tmp_path_factory.mktemp("fuzz-wire"))
    try:
        c.start()
        yield c
    finally:
        c.close()
        harness.record(TALLY.summary())


def _metrics_address(cluster: FuzzCluster, replica_id: str) -> str:
    url = cluster.replicas.local_status(cluster.replicas.replica(replica_id)).metrics_url
    parsed = urllib.parse.urlparse(url)
    assert parsed.hostname and parsed.port, f"replica {replica_id} serves no metrics: {url!r}"
    return f"{parsed.hostname}:{parsed.port}"


def _metrics_answer(cluster: FuzzCluster, address: str) -> bytes:
    with _open(cluster, address, "tls-cert", ["http/1.1"]) as s:
        s.settimeout(30.0)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _check(cluster: FuzzCluster, leader: str, before: Any, accepted: bool) -> None:
    cluster.assert_alive()
    assert TALLY.crashes == [], "\n".join(TALLY.crashes)
    for r in cluster.ids:
        answer = _metrics_answer(cluster, _metrics_address(cluster, r))
        assert answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n")[0]
    after = cluster.settled_state(leader)
    cluster.last = after
    cluster.assert_invariants(after)
    if not accepted:
        TALLY.state_checks += 1
        assert cluster.comparable(after) == cluster.comparable(before), (
            "raw bytes changed the replicated state"
        )


SETTINGS = settings(
    max_examples=harness.examples(10),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(
    sends=st.lists(
        st.tuples(st.sampled_from(MODES), st.sampled_from(["r1", "r2", "r3"]), GARBAGE),
        min_size=1,
        max_size=5,
    ),
    http=st.lists(st.tuples(st.sampled_from(MODES), HTTP_GARBAGE), max_size=3),
)
def test_garbage_bytes_on_the_grpc_and_metrics_ports(
    cluster: FuzzCluster, sends: list[tuple[str, str, bytes]], http: list[tuple[str, bytes]]
) -> None:
    TALLY.examples += 1
    TALLY.batches += 1
    leader = cluster.leader_id()
    before = cluster.last or cluster.settled_state(leader)
    for mode, replica_id, data in sends:
        send_raw(cluster, cluster.replicas.replica(replica_id).grpc, mode, data, ["h2"])
    metrics = _metrics_address(cluster, leader)
    for mode, data in http:
        send_raw(cluster, metrics, mode, data, ["http/1.1"])
    _check(cluster, leader, before, accepted=False)


@SETTINGS
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(METHODS),
            PAYLOADS,
            st.sampled_from(["admin", "user", "node"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_valid_grpc_frames_with_garbage_protobuf(
    cluster: FuzzCluster, calls: list[tuple[Method, bytes, str]]
) -> None:
    TALLY.examples += 1
    TALLY.batches += 1
    leader = cluster.leader_id()
    before = cluster.last or cluster.settled_state(leader)
    accepted = False
    for method, payload, identity in calls:
        if identity == "admin" and method.name in ("AddReplica", "RemoveReplica"):
            identity = "user"  # see tests/fuzz/test_api.py
        outcome = harness.call_raw(
            cluster.channels[identity, leader], method, payload, cluster.metadata[identity]
        )
        TALLY.add(method.name, identity, outcome)
        accepted = accepted or outcome.kind != harness.REJECTED
    _check(cluster, leader, before, accepted)
