"""Log-access grants: signed by a replica, verified offline with the cluster CA."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from synapse_ha.core.identity.access import Role, replica, user
from synapse_ha.security.grants import (
    GrantClaims,
    GrantError,
    GrantRefusal,
    sign_grant,
    verify_grant,
)
from synapse_ha.security.pki import CertFiles
from tests.security.conftest import Authority

# The moment grants are verified at: an hour after this module is imported. The fixtures
# issue their certificates later in the session (valid from five minutes before they are
# issued, for a year), so this moment lies inside their validity however long the tests
# collected before them take.
NOW = (datetime.now(UTC) + timedelta(hours=1)).timestamp()
CLAIMS = GrantClaims(job_id="job-7", subject="user:alice", expires_at_s=NOW + 300, node_id="n1")


def signed(files: CertFiles, claims: GrantClaims = CLAIMS) -> str:
    return sign_grant(claims, key_pem=files.key.read_bytes(), cert_pem=files.cert.read_bytes())


def verify(
    grant: str, ca: Authority, *, now_s: float = NOW, job_id: str = "job-7", node_id: str = "n1"
) -> GrantClaims:
    return verify_grant(grant, ca_pem=ca.ca_pem, now_s=now_s, job_id=job_id, node_id=node_id)


def refusal(grant: str, ca: Authority, **kwargs: object) -> GrantRefusal:
    with pytest.raises(GrantError) as err:
        verify(grant, ca, **kwargs)  # type: ignore[arg-type]
    return err.value.reason


def test_a_grant_round_trips(server_files: CertFiles, cluster_ca: Authority) -> None:
    grant = signed(server_files)
    assert verify(grant, cluster_ca) == CLAIMS
    any_node = signed(server_files, GrantClaims("job-7", "user:alice", NOW + 300))
    assert verify(any_node, cluster_ca, node_id="n42").node_id == ""
    assert grant.count(".") == 2 and "=" not in grant


def test_a_ca_bundle_with_several_cas_accepts_grants_from_any(
    server_files: CertFiles, cluster_ca: Authority, other_ca: Authority
) -> None:
    bundle = other_ca.ca_pem + cluster_ca.ca_pem
    claims = verify_grant(
        signed(server_files), ca_pem=bundle, now_s=NOW, job_id="job-7", node_id="n1"
    )
    assert claims == CLAIMS


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_tampered_payload_is_refused(server_files: CertFiles, cluster_ca: Authority) -> None:
    payload, signature, cert = signed(server_files).split(".")
    document = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    document["job_id"] = "job-8"
    forged = ".".join((_b64(json.dumps(document).encode()), signature, cert))
    assert refusal(forged, cluster_ca, job_id="job-8") is GrantRefusal.BAD_SIGNATURE


def test_a_grant_signed_under_another_ca_is_refused(
    other_ca: Authority, cluster_ca: Authority
) -> None:
    stranger = other_ca.issue(replica("r1"))
    assert verify(signed(stranger), other_ca) == CLAIMS  # valid under its own CA
    assert refusal(signed(stranger), cluster_ca) is GrantRefusal.UNTRUSTED_SIGNER


def test_only_a_replica_may_sign(
    node_n1: CertFiles, alice: CertFiles, cluster_ca: Authority
) -> None:
    assert refusal(signed(node_n1), cluster_ca) is GrantRefusal.UNTRUSTED_SIGNER
    assert refusal(signed(alice), cluster_ca) is GrantRefusal.UNTRUSTED_SIGNER


def test_a_signer_certificate_outside_its_validity_is_refused(cluster_ca: Authority) -> None:
    start = datetime(2021, 1, 1, tzinfo=UTC)
    old = cluster_ca.issue(replica("r-old"), not_before=start, not_after=start + timedelta(days=1))
    grant = signed(old)
    assert verify(grant, cluster_ca, now_s=start.timestamp() + 60) == CLAIMS
    assert refusal(grant, cluster_ca) is GrantRefusal.UNTRUSTED_SIGNER


def test_an_expired_grant_is_refused(server_files: CertFiles, cluster_ca: Authority) -> None:
    grant = signed(server_files)
    assert verify(grant, cluster_ca, now_s=CLAIMS.expires_at_s - 1) == CLAIMS
    assert refusal(grant, cluster_ca, now_s=CLAIMS.expires_at_s) is GrantRefusal.EXPIRED


def test_a_grant_for_another_job_or_node_is_refused(
    server_files: CertFiles, cluster_ca: Authority
) -> None:
    grant = signed(server_files)
    assert refusal(grant, cluster_ca, job_id="job-70") is GrantRefusal.WRONG_JOB
    assert refusal(grant, cluster_ca, node_id="n2") is GrantRefusal.WRONG_NODE
    assert GrantRefusal.WRONG_JOB.authenticates
    assert not GrantRefusal.EXPIRED.authenticates


@pytest.mark.parametrize(
    "grant",
    ["", "abc", "a.b", "a.b.c.d", "!!!.b.c", "e30.e30.e30", "x" * 9000],
)
def test_malformed_grants_are_refused(grant: str, cluster_ca: Authority) -> None:
    assert refusal(grant, cluster_ca) is GrantRefusal.MALFORMED


def test_a_payload_of_the_wrong_shape_is_refused(
    server_files: CertFiles, cluster_ca: Authority
) -> None:
    _, signature, cert = signed(server_files).split(".")
    for document in ({"v": 2}, {"v": 1, "job_id": "job-7", "subject": "s", "node_id": ""}, []):
        grant = ".".join((_b64(json.dumps(document).encode()), signature, cert))
        assert refusal(grant, cluster_ca) is GrantRefusal.MALFORMED


def test_signing_needs_the_certificates_own_key(server_files: CertFiles, alice: CertFiles) -> None:
    with pytest.raises(ValueError, match="not the key"):
        sign_grant(CLAIMS, key_pem=alice.key.read_bytes(), cert_pem=server_files.cert.read_bytes())
    with pytest.raises(ValueError, match="names a job"):
        signed(server_files, GrantClaims("", "user:alice", NOW))


def test_the_subject_is_carried(server_files: CertFiles, cluster_ca: Authority) -> None:
    subject = str(user("carol", Role.ADMIN))
    grant = signed(server_files, GrantClaims("job-7", subject, NOW + 5, "n1"))
    assert verify(grant, cluster_ca).subject == "user:carol"
