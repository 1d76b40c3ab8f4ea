"""Attacks on the clients' side of mutual TLS: a certificate of the cluster's own CA that
is not a replica's (or not the expected worker's) answers at the address a client dials,
to collect the bearer token or the log grant the client sends with its calls.

Each attack runs a real gRPC server holding the attacker's certificate on 127.0.0.1 and
the real client code against it: :class:`~synapse_ha.client.cluster.ClusterClient` over
``Transport.channel`` as synctl builds it, the replicas' nudger, and the worker channel
``synctl logs`` reads through. The trap records every call and its metadata; each test
asserts the client's refusal and that the trap saw nothing at all. A control test shows
the trap does record a token when a genuine replica certificate holds it, so an empty
record means the client refused, not that the trap was deaf.

What BoringSSL enforces on its own is measured too: the server certificate's extended key
usage (a certificate without serverAuth cannot serve) and the client certificate's (one
without clientAuth cannot call).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.identity.access import Identity, Role, replica, user, worker
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.rpc.nudge import WorkerNudger
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.pki import (
    REPLICA_SERVER_NAME,
    CertFiles,
    issue_client,
    worker_server_name,
)
from synapse_ha.security.tls import TlsFiles, Transport
from tests.integration.cluster import wait_for
from tests.security.conftest import SERVER_HOSTS, Authority

ADMIN_TOKEN = "syn_0123456789ab_the-admin-secret-the-attacker-wants"
GRANT = "a-signed-log-grant-for-job-7"
SECRETS = ("authorization", GRANT_METADATA_KEY)


@dataclass
class Trap:
    """What reached the attacker's server: one (method, metadata) per call."""

    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def secrets_seen(self) -> list[str]:
        with self.lock:
            return [
                f"{key}={meta[key]}" for _, meta in self.calls for key in SECRETS if key in meta
            ]


class _Everything(grpc.GenericRpcHandler):
    """Answers every method (unary or streaming) after recording it."""

    def __init__(self, trap: Trap) -> None:
        self.trap = trap

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        metadata = {
            k: v if isinstance(v, str) else v.decode()
            for k, v in handler_call_details.invocation_metadata  # type: ignore[attr-defined]
        }
        with self.trap.lock:
            self.trap.calls.append((method, metadata))

        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            return b""

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            return iter(())

        if method.endswith("/ReadLog"):
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(answer)


@contextmanager
def attacker_server(files: CertFiles) -> Iterator[tuple[str, Trap]]:
    """A gRPC server on 127.0.0.1 presenting ``files`` (requiring a client certificate of
    the CA, as the cluster's servers do, so the client's own certificate is no obstacle)."""
    trap = Trap()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((_Everything(trap),))
    credentials = grpc.ssl_server_credentials(
        [(files.key.read_bytes(), files.cert.read_bytes())],
        root_certificates=files.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield f"127.0.0.1:{port}", trap
    finally:
        server.stop(grace=None).wait(5)


def synctl_client(transport: Transport, address: str) -> ClusterClient:
    """A client as synctl builds it: a bearer token over the transport's channels."""
    return ClusterClient(
        [address],
        timeout_s=1.5,
        per_try_timeout_s=0.5,
        token=ADMIN_TOKEN,
        channel_factory=transport.channel,
    )


@pytest.fixture
def token_holder(cluster_ca: Authority) -> Transport:
    """The transport-only client certificate a token holder's synctl presents."""
    out = cluster_ca.ca_dir.parent / "token-holder"
    if not (out / "client-cli.pem").exists():
        issue_client(cluster_ca.ca_dir, "cli", out)
    return Transport(
        TlsFiles(
            ca=cluster_ca.ca_dir / "ca.pem", cert=out / "client-cli.pem", key=out / "client-cli.key"
        )
    )


def test_control_a_genuine_replica_receives_the_token(
    cluster_ca: Authority, token_holder: Transport
) -> None:
    """Not an attack: the trap with a replica's certificate records what a client sends,
    so an empty record in the attacks below means the client refused."""
    genuine = cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS)
    with attacker_server(genuine) as (address, trap), synctl_client(token_holder, address) as c:
        c.list_nodes()
    assert trap.secrets_seen() == [f"authorization=Bearer {ADMIN_TOKEN}"]


@pytest.mark.parametrize(
    "attacker",
    [
        # A worker certificate, issued today, whose hosts cover the replica's address.
        pytest.param(lambda ca: ca.issue(worker("rogue"), hosts=SERVER_HOSTS), id="worker"),
        # A user certificate whose SANs cover the address: an older issuer gave every
        # leaf serverAuth and any hosts (today's refuses both for users).
        pytest.param(
            lambda ca: ca.forge(user("mallory", Role.USER), ips=("127.0.0.1",)),
            id="user-issued-before-role-names",
        ),
        # The same, for a worker certificate of that time.
        pytest.param(
            lambda ca: ca.forge(worker("gpu-7"), ips=("127.0.0.1",), dns=("localhost",)),
            id="worker-issued-before-role-names",
        ),
        # A worker certificate that carries the name of another role's domain it may
        # legitimately have: the worker name of a node called "replica".
        pytest.param(
            lambda ca: ca.issue(worker("replica"), hosts=SERVER_HOSTS), id="worker-named-replica"
        ),
    ],
)
def test_a_certificate_that_is_not_a_replicas_never_receives_the_token(
    cluster_ca: Authority, token_holder: Transport, attacker: Callable[[Authority], CertFiles]
) -> None:
    """The attack: a certificate of the cluster's CA that is not a replica's serves at the
    address synctl dials for a replica, hoping for the admin's bearer token."""
    files = attacker(cluster_ca)
    with attacker_server(files) as (address, trap), synctl_client(token_holder, address) as c:
        with pytest.raises(ClusterUnavailable) as refused:
            c.list_nodes()
        assert "UNAVAILABLE" in str(refused.value)
        with pytest.raises(ClusterUnavailable):
            c.create_token("mallory", role="admin")
    assert trap.calls == []
    assert trap.secrets_seen() == []


def test_a_user_certificate_cannot_serve_even_with_the_replica_name(
    cluster_ca: Authority, token_holder: Transport
) -> None:
    """BoringSSL enforces the server certificate's key usage: a certificate with the key
    usage `synctl ca issue user` gives (clientAuth only) fails the handshake as a server
    even when it carries the exact name the client demands."""
    issued = x509.load_pem_x509_certificate(cluster_ca.issue(user("mallory")).cert.read_bytes())
    usages = tuple(issued.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    files = cluster_ca.forge(
        user("mallory"), dns=(REPLICA_SERVER_NAME,), ips=("127.0.0.1",), usages=usages
    )
    with (
        attacker_server(files) as (address, trap),
        synctl_client(token_holder, address) as c,
        pytest.raises(ClusterUnavailable),
    ):
        c.list_nodes()
    assert trap.calls == []


def test_a_server_only_certificate_cannot_call(cluster_ca: Authority) -> None:
    """And the other way round: the cluster's servers refuse a client certificate without
    clientAuth in the handshake."""
    genuine = cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS)
    server_only = cluster_ca.forge(user("mallory"), usages=(ExtendedKeyUsageOID.SERVER_AUTH,))
    as_mallory = Transport(TlsFiles.from_cert_files(server_only))
    with (
        attacker_server(genuine) as (address, trap),
        as_mallory.channel(address) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        channel.unary_unary("/synapse.v1.SchedulerService/ListNodes")(b"", timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert trap.calls == []


def _read_log_with_grant(transport: Transport, address: str, node_id: str) -> None:
    """What ``synctl logs`` sends a worker: ReadLog with the grant as metadata."""
    with transport.channel(address, worker=node_id) as channel:
        stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        chunks = stub.ReadLog(
            wpb.ReadLogRequest(job_id="job-7"), timeout=2, metadata=[(GRANT_METADATA_KEY, GRANT)]
        )
        list(chunks)


@pytest.mark.parametrize(
    "attacker",
    [
        pytest.param(worker("n2"), id="another-worker"),
        pytest.param(worker("N1"), id="a-worker-named-alike-but-for-case"),
        pytest.param(replica("r1"), id="a-replica"),
    ],
)
def test_a_worker_that_is_not_the_expected_one_never_receives_the_grant(
    cluster_ca: Authority, token_holder: Transport, attacker: Identity
) -> None:
    """The attack: a rogue worker (n2) answers at the address synctl was given for node
    n1, to take the grant for n1's job and replay it against n1."""
    files = cluster_ca.issue(attacker, hosts=SERVER_HOSTS)
    with attacker_server(files) as (address, trap), pytest.raises(grpc.RpcError) as refused:
        _read_log_with_grant(token_holder, address, "n1")
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert trap.calls == []


def test_control_the_expected_worker_receives_the_grant(
    cluster_ca: Authority, token_holder: Transport
) -> None:
    files = cluster_ca.issue(worker("n1"), hosts=SERVER_HOSTS)
    with attacker_server(files) as (address, trap):
        _read_log_with_grant(token_holder, address, "n1")
    assert trap.secrets_seen() == [f"{GRANT_METADATA_KEY}={GRANT}"]


def test_the_leaders_nudge_reaches_only_the_node_it_names(
    cluster_ca: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    """A rogue worker (n2) at the address the leader holds for node n1 gets no call from
    the replica's nudger: its channel demands n1's certificate."""
    as_replica = Transport(
        TlsFiles.from_cert_files(cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS))
    )
    rogue = cluster_ca.issue(worker("n2"), hosts=SERVER_HOSTS)
    genuine = cluster_ca.issue(worker("n1"), hosts=SERVER_HOSTS)
    caplog.set_level(logging.DEBUG, logger="synapse.rpc.nudge")
    nudger = WorkerNudger(timeout_s=2.0, channel_factory=as_replica.channel)
    try:
        with attacker_server(rogue) as (rogue_at, rogue_trap):
            nudger.nudge([("n1", rogue_at)])
            # The nudge settled one way or the other: refused, or answered by the rogue.
            wait_for("the nudge to settle", lambda: rogue_at in caplog.text, timeout_s=10.0)
        with attacker_server(genuine) as (genuine_at, genuine_trap):
            nudger.nudge([("n1", genuine_at)])
            wait_for(
                "the genuine worker's nudge", lambda: len(genuine_trap.calls) > 0, timeout_s=10.0
            )
    finally:
        nudger.close()
    assert rogue_trap.calls == []
    assert f"nudge to n1 at {rogue_at} failed" in caplog.text
    assert [method for method, _ in genuine_trap.calls] == ["/synapse.v1.WorkerService/Nudge"]


def test_worker_names_of_nodes_differing_only_in_case_are_distinct() -> None:
    """gRPC compares server names without regard to case; the names it compares must not."""
    names = {worker_server_name(n) for n in ("n1", "N1", "n1.lan", "n1_lan", "n1-lan")}
    assert len(names) == 5
    assert worker_server_name("gpu-7") == "gpu-7.worker.synapse.invalid"
    assert worker_server_name("N1").endswith(".id.worker.synapse.invalid")
