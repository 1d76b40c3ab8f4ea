"""The CA and the certificates it issues: names, SANs, files and refusals."""

from __future__ import annotations

import ipaddress
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from synapse_ha.core.identity.access import Identity, Kind, Role, replica, user, worker
from synapse_ha.security.pki import (
    PkiError,
    identity_of_cert,
    init_ca,
    issue,
    issue_client,
    outdated,
    server_name,
)
from tests.security.conftest import Authority


def test_a_server_certificate_names_its_identity_and_the_hosts_clients_dial(
    cluster_ca: Authority,
) -> None:
    files = cluster_ca.issue(replica("r1"), hosts=("127.0.0.1", "::1", "r1.example"))
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://synapse/replica/r1"
    ]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert san.get_values_for_type(x509.DNSName) == ["replica.synapse.invalid", "r1.example"]
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "replica:r1"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    ca = x509.load_pem_x509_certificate(cluster_ca.ca_pem)
    cert.verify_directly_issued_by(ca)
    assert (files.cert.name, files.key.name) == ("replica-r1.pem", "replica-r1.key")
    assert files.ca == cluster_ca.ca_dir / "ca.pem"
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(cluster_ca.ca_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((cluster_ca.ca_dir / "ca.key").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "identity",
    [
        replica("r-2"),
        worker("gpu-node.7"),
        user("alice"),
        user("bob", Role.OPERATOR),
        user("root_admin", Role.ADMIN),
    ],
)
def test_identity_of_cert_round_trips_every_kind(cluster_ca: Authority, identity: Identity) -> None:
    files = cluster_ca.issue(identity)
    pem = files.cert.read_bytes()
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    assert identity_of_cert(pem) == identity
    assert identity_of_cert(der) == identity
    assert files.cert.name == f"{identity.kind}-{identity.name}.pem"


def test_a_certificate_without_our_name_names_nobody(cluster_ca: Authority) -> None:
    assert identity_of_cert(cluster_ca.ca_pem) is None  # the CA has no SAN
    with pytest.raises(PkiError, match="not a certificate"):
        identity_of_cert(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")


def test_validity_bounds_are_honoured(cluster_ca: Authority) -> None:
    start = datetime(2020, 1, 1, tzinfo=UTC)
    files = cluster_ca.issue(worker("old"), not_before=start, not_after=start + timedelta(days=1))
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert (cert.not_valid_before_utc, cert.not_valid_after_utc) == (
        start,
        start + timedelta(days=1),
    )
    with pytest.raises(PkiError, match="never be valid"):
        cluster_ca.issue(worker("never"), not_before=start, not_after=start)


def test_a_second_ca_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    files = init_ca(tmp_path / "ca")
    before = files.cert.read_bytes()
    with pytest.raises(PkiError, match="already exist"):
        init_ca(tmp_path / "ca")
    assert files.cert.read_bytes() == before


def test_issuing_refuses_to_replace_files_unless_asked(
    cluster_ca: Authority, tmp_path: Path
) -> None:
    first = issue(cluster_ca.ca_dir, worker("w1"), tmp_path)
    old = first.cert.read_bytes()
    with pytest.raises(PkiError, match="already exist"):
        issue(cluster_ca.ca_dir, worker("w1"), tmp_path)
    assert first.cert.read_bytes() == old
    second = issue(cluster_ca.ca_dir, worker("w1"), tmp_path, overwrite=True)
    assert second == first
    assert second.cert.read_bytes() != old
    assert identity_of_cert(second.cert.read_bytes()) == worker("w1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-w1.key", "worker-w1.pem"]
    # Only the certificate left: still refused, and no stray key is written.
    second.key.unlink()
    with pytest.raises(PkiError, match=r"worker-w1\.pem already exists"):
        issue(cluster_ca.ca_dir, worker("w1"), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-w1.pem"]


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        (worker("a/b"), "not a valid worker name"),
        (replica(""), "not a valid replica name"),
        (Identity(Kind.WORKER, "w", Role.ADMIN), "only a user has a role"),
    ],
)
def test_bad_identities_are_refused(
    cluster_ca: Authority, tmp_path: Path, identity: Identity, message: str
) -> None:
    with pytest.raises(PkiError, match=message):
        issue(cluster_ca.ca_dir, identity, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_bad_hosts_and_a_missing_ca_are_refused(cluster_ca: Authority, tmp_path: Path) -> None:
    with pytest.raises(PkiError, match="neither an IP address nor a DNS name"):
        issue(cluster_ca.ca_dir, worker("w"), tmp_path, hosts=("two words",))
    with pytest.raises(PkiError, match="synctl ca init"):
        issue(tmp_path / "no-ca", worker("w"), tmp_path)


@pytest.mark.parametrize(
    ("identity", "role_name", "usages"),
    [
        (replica("r1"), "replica.synapse.invalid", {"serverAuth", "clientAuth"}),
        (worker("gpu-7"), "gpu-7.worker.synapse.invalid", {"serverAuth", "clientAuth"}),
        (user("alice"), None, {"clientAuth"}),
        (user("root", Role.ADMIN), None, {"clientAuth"}),
    ],
)
def test_servers_carry_their_role_name_and_only_servers_may_serve(
    cluster_ca: Authority, identity: Identity, role_name: str | None, usages: set[str]
) -> None:
    files = cluster_ca.issue(identity)
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ([role_name] if role_name else [])
    assert server_name(identity) == role_name
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    names = {
        ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
        ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
    }
    assert {names[u] for u in eku} == usages
    assert outdated(files.cert.read_bytes()) is None


def test_a_transport_only_client_certificate_only_calls(cluster_ca: Authority) -> None:
    files = issue_client(cluster_ca.ca_dir, "cli", cluster_ca.ca_dir.parent / "clients")
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == []


@pytest.mark.parametrize(
    ("identity", "host", "message"),
    [
        (worker("w"), "replica.synapse.invalid", "reserved for the role names"),
        (worker("w"), "n1.worker.synapse.invalid", "reserved for the role names"),
        (replica("r"), "Synapse.Invalid.", "reserved for the role names"),
        (worker("w"), "*.synapse.invalid", "wildcard host names are not issued"),
        (replica("r"), "*.lan", "wildcard host names are not issued"),
        (user("alice"), "127.0.0.1", "a user certificate names no hosts"),
    ],
)
def test_no_certificate_can_be_issued_with_a_name_of_another_role(
    cluster_ca: Authority, tmp_path: Path, identity: Identity, host: str, message: str
) -> None:
    with pytest.raises(PkiError, match=message):
        issue(cluster_ca.ca_dir, identity, tmp_path, hosts=(host,))
    assert list(tmp_path.iterdir()) == []
