"""Certificates for the security tests: two CAs (the cluster's and a stranger's) made
once per session, and a small gRPC server whose one method answers with the caller's
identity. Servers listen on 127.0.0.1 only and are stopped at teardown."""

from __future__ import annotations

import ipaddress
import itertools
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from synapse_ha.core.identity.access import Identity, Role, replica, user, worker
from synapse_ha.security.pki import CertFiles, identity_of_cert, init_ca, issue
from synapse_ha.security.tls import TlsFiles, Transport, peer_identity

SERVER_HOSTS = ("127.0.0.1", "localhost")
WHO_METHOD = "/synapse.test.Who/Ask"


@dataclass
class Authority:
    """A CA under a directory, issuing each certificate into a fresh directory so that
    tests never collide on file names."""

    ca_dir: Path
    _counter: itertools.count[int]

    @property
    def ca_pem(self) -> bytes:
        return (self.ca_dir / "ca.pem").read_bytes()

    def issue(
        self,
        identity: Identity,
        *,
        hosts: tuple[str, ...] = (),
        not_before: datetime | None = None,
        not_after: datetime | None = None,
    ) -> CertFiles:
        out = self.ca_dir.parent / f"issued-{next(self._counter)}"
        return issue(
            self.ca_dir, identity, out, hosts=hosts, not_before=not_before, not_after=not_after
        )

    def transport(self, identity: Identity, *, hosts: tuple[str, ...] = ()) -> Transport:
        return Transport(TlsFiles.from_cert_files(self.issue(identity, hosts=hosts)))

    def forge(
        self,
        identity: Identity | None,
        *,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        usages: tuple[x509.ObjectIdentifier, ...] = (
            ExtendedKeyUsageOID.SERVER_AUTH,
            ExtendedKeyUsageOID.CLIENT_AUTH,
        ),
    ) -> CertFiles:
        """A certificate signed with this CA's key directly, bypassing ``issue`` and its
        rules: what an older ``synctl ca issue`` made (serverAuth + clientAuth for every
        kind, any hosts, no role name) by default, or whatever SANs and key usages a test
        needs. ``identity`` None: no SPIFFE name."""
        ca_cert = x509.load_pem_x509_certificate(self.ca_pem)
        ca_key = serialization.load_pem_private_key(
            (self.ca_dir / "ca.key").read_bytes(), password=None
        )
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        if identity is not None:
            names.append(x509.UniformResourceIdentifier(identity.spiffe_id))
        names += [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        now = datetime.now(UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "forged")]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        out = self.ca_dir.parent / f"forged-{next(self._counter)}"
        out.mkdir()
        files = CertFiles(cert=out / "cert.pem", key=out / "cert.key", ca=self.ca_dir / "ca.pem")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return files


def make_authority(root: Path) -> Authority:
    init_ca(root / "ca")
    return Authority(root / "ca", itertools.count())


@pytest.fixture(scope="session")
def cluster_ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_authority(tmp_path_factory.mktemp("cluster-ca"))


@pytest.fixture(scope="session")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_authority(tmp_path_factory.mktemp("other-ca"))


@pytest.fixture(scope="session")
def server_files(cluster_ca: Authority) -> CertFiles:
    return cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS)


@pytest.fixture(scope="session")
def alice(cluster_ca: Authority) -> CertFiles:
    return cluster_ca.issue(user("alice", Role.OPERATOR))


@pytest.fixture(scope="session")
def node_n1(cluster_ca: Authority) -> CertFiles:
    return cluster_ca.issue(worker("n1"))


class WhoServer:
    """Records the identity each call's handler saw and answers with it."""

    def __init__(self) -> None:
        self.seen: list[Identity | None] = []
        self._lock = threading.Lock()

    def ask(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        identity = peer_identity(context)
        with self._lock:
            self.seen.append(identity)
        return str(identity).encode()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != WHO_METHOD:  # type: ignore[attr-defined]
            return None
        return grpc.unary_unary_rpc_method_handler(self.ask)


class _Generic(grpc.GenericRpcHandler):
    def __init__(self, who: WhoServer) -> None:
        self.who = who

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        return self.who.service(handler_call_details)


@contextmanager
def who_server(transport: Transport) -> Iterator[tuple[str, WhoServer]]:
    """A server on 127.0.0.1 speaking ``transport``; yields its address and recorder."""
    who = WhoServer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((_Generic(who),))
    port = transport.add_port(server, "127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", who
    finally:
        server.stop(grace=None).wait(5)


def ask(channel: grpc.Channel) -> str:
    """Call the server's one method; raises grpc.RpcError when it fails."""
    call: Callable[..., bytes] = channel.unary_unary(WHO_METHOD)
    return call(b"", timeout=10).decode()


def ask_with(transport: Transport, address: str) -> str:
    with transport.channel(address) as channel:
        return ask(channel)


def server_handshake(
    address: str, client: CertFiles, maximum: ssl.TLSVersion | None = None
) -> tuple[str, Identity | None]:
    """Handshake with the server using Python's ssl module: the negotiated TLS version
    and the identity the server's certificate names."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(client.ca)
    context.load_cert_chain(client.cert, client.key)
    context.set_alpn_protocols(["h2"])
    if maximum is not None:
        context.maximum_version = maximum
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        version = tls.version()
        assert version is not None
        return version, identity_of_cert(der)
