"""Mutual TLS between real gRPC processes on 127.0.0.1: who gets in, who the handler
sees, which TLS version is spoken, and certificate/CA replacement without a restart."""

from __future__ import annotations

import itertools
import os
import shutil
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from synapse_ha.core.identity.access import Role, replica, user, worker
from synapse_ha.security import tls
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.pki import CertFiles
from synapse_ha.security.tls import TlsError, TlsFiles, Transport, tls_settings
from tests.security.conftest import (
    SERVER_HOSTS,
    Authority,
    ask,
    ask_with,
    server_handshake,
    who_server,
)


def test_a_client_with_a_cluster_certificate_is_seen_as_its_identity(
    server_files: CertFiles, alice: CertFiles, node_n1: CertFiles
) -> None:
    with who_server(Transport(TlsFiles.from_cert_files(server_files))) as (address, who):
        assert ask_with(Transport(TlsFiles.from_cert_files(alice)), address) == "user:alice"
        assert ask_with(Transport(TlsFiles.from_cert_files(node_n1)), address) == "worker:n1"
    assert who.seen == [user("alice", Role.OPERATOR), worker("n1")]


def test_a_plaintext_caller_has_no_identity() -> None:
    with who_server(Transport.insecure()) as (address, who):
        assert ask_with(Transport.insecure(), address) == "None"
    assert who.seen == [None]


def _refused(channel: grpc.Channel) -> grpc.StatusCode:
    with channel, pytest.raises(grpc.RpcError) as err:
        ask(channel)
    code: grpc.StatusCode = err.value.code()
    return code


def test_a_client_without_a_certificate_fails_the_handshake(
    server_files: CertFiles, cluster_ca: Authority
) -> None:
    with who_server(Transport(TlsFiles.from_cert_files(server_files))) as (address, who):
        only_trust = grpc.ssl_channel_credentials(root_certificates=cluster_ca.ca_pem)
        assert _refused(grpc.secure_channel(address, only_trust)) is grpc.StatusCode.UNAVAILABLE
    assert who.seen == []


def test_a_client_certificate_from_another_ca_fails_the_handshake(
    server_files: CertFiles, cluster_ca: Authority, other_ca: Authority
) -> None:
    stranger = other_ca.issue(user("alice", Role.ADMIN))
    # The stranger even trusts the cluster CA: only its own certificate is wrong.
    credentials = grpc.ssl_channel_credentials(
        root_certificates=cluster_ca.ca_pem,
        private_key=stranger.key.read_bytes(),
        certificate_chain=stranger.cert.read_bytes(),
    )
    with who_server(Transport(TlsFiles.from_cert_files(server_files))) as (address, who):
        assert _refused(grpc.secure_channel(address, credentials)) is grpc.StatusCode.UNAVAILABLE
    assert who.seen == []


def test_an_expired_client_certificate_fails_the_handshake(
    server_files: CertFiles, cluster_ca: Authority
) -> None:
    now = datetime.now(UTC)
    expired = cluster_ca.issue(
        worker("n9"), not_before=now - timedelta(days=10), not_after=now - timedelta(days=1)
    )
    with who_server(Transport(TlsFiles.from_cert_files(server_files))) as (address, who):
        channel = Transport(TlsFiles.from_cert_files(expired)).channel(address)
        assert _refused(channel) is grpc.StatusCode.UNAVAILABLE
    assert who.seen == []


def test_a_client_refuses_a_server_certificate_from_another_ca(
    other_ca: Authority, alice: CertFiles
) -> None:
    impostor = other_ca.transport(replica("r1"), hosts=SERVER_HOSTS)
    with who_server(impostor) as (address, who):
        channel = Transport(TlsFiles.from_cert_files(alice)).channel(address)
        assert _refused(channel) is grpc.StatusCode.UNAVAILABLE
    assert who.seen == []


def test_a_client_checks_the_servers_role_not_the_host_it_dialled(
    cluster_ca: Authority, alice: CertFiles
) -> None:
    """A replica's certificate is accepted wherever it answers (every replica is trusted
    alike); what a client demands is the replica's role name, or the worker's it dials."""
    elsewhere = cluster_ca.transport(replica("r1"), hosts=("10.9.9.9", "elsewhere.example"))
    as_alice = Transport(TlsFiles.from_cert_files(alice))
    with who_server(elsewhere) as (address, who):
        assert ask_with(as_alice, address) == "user:alice"
        assert _refused(as_alice.channel(address, worker="n1")) is grpc.StatusCode.UNAVAILABLE
    assert who.seen == [user("alice", Role.OPERATOR)]


def test_a_replica_or_worker_certificate_issued_before_role_names_is_refused_with_the_fix(
    cluster_ca: Authority, tmp_path: Path
) -> None:
    old = cluster_ca.forge(replica("r1"), ips=("10.0.0.1",), dns=("r1.lan",))
    with pytest.raises(TlsError) as refused:
        Transport(TlsFiles.from_cert_files(old)).material()
    message = str(refused.value)
    assert str(old.cert) in message
    assert "does not carry the name replica.synapse.invalid" in message
    assert "synctl ca issue replica r1 --ca-dir CA_DIR --host r1.lan --host 10.0.0.1" in message
    with pytest.raises(TlsError, match="issued before certificates named their role"):
        tls_settings(str(old.ca), str(old.cert), str(old.key), insecure=False)
    old_worker = cluster_ca.forge(worker("gpu-7"))
    with pytest.raises(TlsError, match=r"gpu-7\.worker\.synapse\.invalid"):
        Transport(TlsFiles.from_cert_files(old_worker)).channel("127.0.0.1:1")
    # A user's certificate of that time never serves: it keeps working as a client's.
    old_user = cluster_ca.forge(user("bob"))
    assert Transport(TlsFiles.from_cert_files(old_user)).material() is not None


def test_a_server_keeps_its_material_when_an_outdated_certificate_is_installed(
    tmp_path: Path, cluster_ca: Authority, alice: CertFiles, caplog: pytest.LogCaptureFixture
) -> None:
    first = cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS)
    live = TlsFiles(
        ca=tmp_path / "ca.pem", cert=tmp_path / "server.pem", key=tmp_path / "server.key"
    )
    _install(first, cluster_ca.ca_pem, live)
    with who_server(Transport(live)) as (address, _):
        _install(cluster_ca.forge(replica("r2"), ips=("127.0.0.1",)), cluster_ca.ca_pem, live)
        assert server_handshake(address, alice) == ("TLSv1.3", replica("r1"))
        assert server_handshake(address, alice) == ("TLSv1.3", replica("r1"))
    said = [r.getMessage() for r in caplog.records if "kept the previous TLS" in r.getMessage()]
    assert len(said) == 1
    assert "synctl ca issue replica r2" in said[0]


def test_the_server_negotiates_tls_13_and_still_accepts_tls_12(
    server_files: CertFiles, alice: CertFiles
) -> None:
    with who_server(Transport(TlsFiles.from_cert_files(server_files))) as (address, _):
        assert server_handshake(address, alice) == ("TLSv1.3", replica("r1"))
        assert server_handshake(address, alice, ssl.TLSVersion.TLSv1_2) == (
            "TLSv1.2",
            replica("r1"),
        )


def _install(source: CertFiles, ca_pem: bytes, target: TlsFiles) -> None:
    """Replace the files a server reads, each by an atomic rename: key, then
    certificate, then CA bundle."""
    for data, path in (
        (source.key.read_bytes(), target.key),
        (source.cert.read_bytes(), target.cert),
        (ca_pem, target.ca),
    ):
        staged = path.with_name(path.name + ".new")
        staged.write_bytes(data)
        os.replace(staged, path)


def test_replaced_certificate_and_ca_files_apply_to_new_connections_without_a_restart(
    tmp_path: Path, cluster_ca: Authority, other_ca: Authority, alice: CertFiles
) -> None:
    first = cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS)
    live = TlsFiles(
        ca=tmp_path / "ca.pem", cert=tmp_path / "server.pem", key=tmp_path / "server.key"
    )
    _install(first, cluster_ca.ca_pem, live)
    server_transport = Transport(live)
    version = server_transport.version()
    alice_transport = Transport(TlsFiles.from_cert_files(alice))
    with who_server(server_transport) as (address, who):
        assert server_handshake(address, alice) == ("TLSv1.3", replica("r1"))
        long_lived = alice_transport.channel(address)
        assert ask(long_lived) == "user:alice"

        # A re-issued certificate for another identity: the next handshake presents it.
        _install(cluster_ca.issue(replica("r2"), hosts=SERVER_HOSTS), cluster_ca.ca_pem, live)
        assert server_transport.version() != version
        assert server_handshake(address, alice) == ("TLSv1.3", replica("r2"))
        assert ask_with(alice_transport, address) == "user:alice"

        # A new CA bundle that drops the old CA: old clients are refused, new ones accepted.
        _install(other_ca.issue(replica("r3"), hosts=SERVER_HOSTS), other_ca.ca_pem, live)
        assert _refused(alice_transport.channel(address)) is grpc.StatusCode.UNAVAILABLE
        bob = other_ca.issue(user("bob"))
        assert server_handshake(address, bob) == ("TLSv1.3", replica("r3"))
        assert ask_with(Transport(TlsFiles.from_cert_files(bob)), address) == "user:bob"
        # The connection made before the rotation keeps working.
        assert ask(long_lived) == "user:alice"
        long_lived.close()
    assert who.seen.count(user("bob")) == 1


def test_a_half_replaced_certificate_keeps_the_old_material(
    tmp_path: Path, cluster_ca: Authority, alice: CertFiles
) -> None:
    first = cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS)
    live = TlsFiles(
        ca=tmp_path / "ca.pem", cert=tmp_path / "server.pem", key=tmp_path / "server.key"
    )
    _install(first, cluster_ca.ca_pem, live)
    with who_server(Transport(live)) as (address, _):
        second = cluster_ca.issue(replica("r2"), hosts=SERVER_HOSTS)
        shutil.copyfile(second.cert, live.cert)  # its key is not in place yet
        assert server_handshake(address, alice) == ("TLSv1.3", replica("r1"))
        shutil.copyfile(second.key, live.key)
        assert server_handshake(address, alice) == ("TLSv1.3", replica("r2"))


def test_the_files_are_parsed_once_while_unchanged_and_again_once_replaced(
    tmp_path: Path, cluster_ca: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = TlsFiles(ca=tmp_path / "ca.pem", cert=tmp_path / "me.pem", key=tmp_path / "me.key")
    _install(cluster_ca.issue(replica("r1"), hosts=SERVER_HOSTS), cluster_ca.ca_pem, live)
    transport = Transport(live)
    reads: list[TlsFiles] = []
    real = tls.read_material
    monkeypatch.setattr(tls, "read_material", lambda files: reads.append(files) or real(files))
    first = transport.material()
    for _ in range(5):  # a channel per worker: no key parsing each time
        transport.channel("127.0.0.1:1", worker="n1").close()
    assert transport.material() is first and len(reads) == 1
    _install(cluster_ca.issue(replica("r2"), hosts=SERVER_HOSTS), cluster_ca.ca_pem, live)
    second = transport.material()
    assert second is not None and first is not None and second.cert != first.cert
    assert len(reads) == 2
    shutil.copyfile(cluster_ca.issue(replica("r3"), hosts=SERVER_HOSTS).key, live.key)
    with pytest.raises(TlsError, match="is not the private key of"):
        transport.material()  # a change is read, and refused, not hidden by the kept one


def test_an_insecure_transport_has_one_version_and_no_material() -> None:
    transport = Transport.insecure()
    assert not transport.secure
    assert transport.version() == Transport(None).version()
    assert transport.material() is None


def test_files_that_do_not_fit_together_are_named(
    alice: CertFiles, node_n1: CertFiles, tmp_path: Path
) -> None:
    mixed = Transport(TlsFiles(ca=alice.ca, cert=alice.cert, key=node_n1.key))
    with pytest.raises(TlsError, match="is not the private key of"):
        mixed.channel("127.0.0.1:1")
    missing = Transport(TlsFiles(ca=tmp_path / "nope.pem", cert=alice.cert, key=alice.key))
    with pytest.raises(TlsError, match=r"nope\.pem"):
        missing.material()


def test_a_transport_channel_accepts_answers_larger_than_grpc_default() -> None:
    """A whole replica state (GetReplicaState) outgrows gRPC's default 4 MiB answer once a
    cluster holds a few thousand jobs."""
    from concurrent import futures

    big = b"s" * (6 << 20)
    handler = grpc.method_handlers_generic_handler(
        "t.Big", {"Get": grpc.unary_unary_rpc_method_handler(lambda request, context: big)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        with grpc.insecure_channel(address) as plain:
            with pytest.raises(grpc.RpcError) as refused:
                plain.unary_unary("/t.Big/Get")(b"", timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with Transport.insecure().channel(address) as channel:
            assert channel.unary_unary("/t.Big/Get")(b"", timeout=10) == big
    finally:
        server.stop(None)


def test_a_kept_dev_cluster_reissues_certificates_made_before_role_names(tmp_path: Path) -> None:
    creds = ClusterCredentials.ensure(tmp_path / "creds")
    files = creds.worker_tls("w1")
    old = Authority(creds.ca_dir, itertools.count()).forge(worker("w1"), ips=("127.0.0.1",))
    shutil.copyfile(old.cert, files.cert)
    shutil.copyfile(old.key, files.key)
    with pytest.raises(TlsError, match="issued before certificates named their role"):
        Transport(files).material()
    again = creds.worker_tls("w1")
    assert again == files
    assert Transport(again).material() is not None
