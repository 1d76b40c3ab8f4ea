"""Log-access grants: short-lived, signed permission to read one job's member logs.

A user asks a replica for a job's logs; the replica decides (the user owns the job, or
is an operator or admin) and signs a grant with its own certificate's key. The user hands
the grant to the workers running the job's members (gRPC metadata
:data:`GRANT_METADATA_KEY`), and each worker checks it offline against the cluster CA:
no replica call and no token cache on the worker, so reading logs keeps working while
the control plane elects a leader, and a worker never learns user credentials. This is
the model of Nomad's workload identities.

Format (compact, URL-safe, no padding)::

    b64url(payload JSON) "." b64url(ECDSA-SHA256 signature) "." b64url(signer cert DER)

The signature covers :data:`SIGNING_CONTEXT` followed by the payload JSON bytes, so a
grant signature can never be mistaken for any other signature a replica key makes. The
payload is ``{"v": 1, "job_id", "subject", "exp", "node_id"}``.

A grant is accepted by :func:`verify_grant` only when all of these hold:

1. it parses (three parts, base64url, a JSON object of the right shape, a DER certificate);
2. the signer certificate was issued by a CA in the cluster's bundle, is valid at ``now``
   and names a **replica** (a worker or user certificate cannot sign grants);
3. the signature verifies with the signer certificate's key;
4. ``now < exp``;
5. the grant names the requested job, and the node asked (or any node, ``node_id ""``).

Refusals are :class:`GrantError` with a :class:`GrantRefusal` code. A grant cannot be
revoked; keep its lifetime short (minutes).
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from synapse_ha.core.identity.access import Kind
from synapse_ha.security.pki import identity_of, key_matches_certificate

GRANT_METADATA_KEY = "synapse-grant"
GRANT_VERSION = 1
SIGNING_CONTEXT = b"synapse log-access grant v1\n"
# Grants are short; anything far longer than this is not one of ours.
MAX_GRANT_CHARS = 8192


class GrantRefusal(enum.StrEnum):
    """Why a grant was refused. The first four mean the grant proves nothing (the caller
    is not authenticated by it); the last two mean it is valid but for something else."""

    MALFORMED = "MALFORMED"
    UNTRUSTED_SIGNER = "UNTRUSTED_SIGNER"
    BAD_SIGNATURE = "BAD_SIGNATURE"
    EXPIRED = "EXPIRED"
    WRONG_JOB = "WRONG_JOB"
    WRONG_NODE = "WRONG_NODE"

    @property
    def authenticates(self) -> bool:
        """Whether a grant refused for this reason was still a genuine, current grant."""
        return self in (GrantRefusal.WRONG_JOB, GrantRefusal.WRONG_NODE)


class GrantError(Exception):
    """A grant that does not allow the request; ``reason`` says which rule it broke."""

    def __init__(self, reason: GrantRefusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GrantClaims:
    """What a grant allows: ``subject`` (``str(identity)`` of the user the replica
    authorised) may read the logs of ``job_id``'s members on ``node_id`` (``""``: on any
    node) until ``expires_at_s`` (seconds since the epoch)."""

    job_id: str
    subject: str
    expires_at_s: float
    node_id: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or not text.isascii():
        raise ValueError("empty or non-ASCII part")
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _payload(claims: GrantClaims) -> bytes:
    document = {
        "v": GRANT_VERSION,
        "job_id": claims.job_id,
        "subject": claims.subject,
        "exp": claims.expires_at_s,
        "node_id": claims.node_id,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def sign_grant(claims: GrantClaims, *, key_pem: bytes, cert_pem: bytes) -> str:
    """The grant text for ``claims``, signed with a replica's key and carrying its
    certificate. Raises :class:`ValueError` when the claims are unusable (empty job,
    a non-finite expiry) or the key is not the certificate's ECDSA key."""
    if not claims.job_id:
        raise ValueError("a grant names a job")
    if not math.isfinite(claims.expires_at_s):
        raise ValueError("a grant expires at a finite time")
    if not key_matches_certificate(key_pem, cert_pem):
        raise ValueError("the signing key is not the key of the signer certificate")
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("grants are signed with an ECDSA key")
    cert = x509.load_pem_x509_certificate(cert_pem)
    payload = _payload(claims)
    signature = key.sign(SIGNING_CONTEXT + payload, ec.ECDSA(hashes.SHA256()))
    return ".".join(
        (_b64(payload), _b64(signature), _b64(cert.public_bytes(serialization.Encoding.DER)))
    )


def _parse(grant: str) -> tuple[bytes, GrantClaims, bytes, x509.Certificate]:
    malformed = GrantRefusal.MALFORMED
    if len(grant) > MAX_GRANT_CHARS:
        raise GrantError(malformed, "the grant is too long to be one")
    parts = grant.split(".")
    if len(parts) != 3:
        raise GrantError(malformed, "a grant has three dot-separated parts")
    try:
        payload, signature, cert_der = (_unb64(p) for p in parts)
    except (ValueError, binascii.Error) as exc:
        raise GrantError(malformed, f"a grant part is not base64url: {exc}") from exc
    try:
        document = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GrantError(malformed, "the grant's payload is not JSON") from exc
    if not isinstance(document, dict) or document.get("v") != GRANT_VERSION:
        raise GrantError(malformed, f"the grant is not a version {GRANT_VERSION} grant")
    job_id, subject, exp, node_id = (
        document.get(k) for k in ("job_id", "subject", "exp", "node_id")
    )
    if not (
        isinstance(job_id, str)
        and job_id
        and isinstance(subject, str)
        and isinstance(node_id, str)
        and isinstance(exp, int | float)
        and not isinstance(exp, bool)
        and math.isfinite(exp)
    ):
        raise GrantError(malformed, "the grant's payload lacks job_id, subject, exp or node_id")
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError as exc:
        raise GrantError(malformed, "the grant's signer certificate does not parse") from exc
    return payload, GrantClaims(job_id, subject, float(exp), node_id), signature, cert


def _check_signer(cert: x509.Certificate, ca_pem: bytes, now_s: float) -> None:
    untrusted = GrantRefusal.UNTRUSTED_SIGNER
    try:
        authorities = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise GrantError(untrusted, "the cluster CA bundle holds no certificate") from exc
    for ca in authorities:
        try:
            cert.verify_directly_issued_by(ca)
            break
        except (ValueError, TypeError, InvalidSignature):
            continue
    else:
        raise GrantError(untrusted, "the grant's signer was not issued by the cluster CA")
    now = datetime.fromtimestamp(now_s, UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise GrantError(
            untrusted,
            f"the grant's signer certificate is valid from {cert.not_valid_before_utc} "
            f"to {cert.not_valid_after_utc}, not now",
        )
    signer = identity_of(cert)
    if signer is None or signer.kind is not Kind.REPLICA:
        raise GrantError(
            untrusted, f"only replicas sign grants; this one is signed by {signer or 'nobody'}"
        )


def verify_grant(
    grant: str, *, ca_pem: bytes, now_s: float, job_id: str, node_id: str
) -> GrantClaims:
    """The claims of ``grant`` when it lets its bearer read ``job_id``'s logs on
    ``node_id`` at ``now_s``; otherwise :class:`GrantError` (rules in the module
    docstring, checked in that order). ``ca_pem`` may hold several CA certificates."""
    payload, claims, signature, cert = _parse(grant)
    _check_signer(cert, ca_pem, now_s)
    public_key = cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise GrantError(GrantRefusal.UNTRUSTED_SIGNER, "the grant's signer key is not ECDSA")
    try:
        public_key.verify(signature, SIGNING_CONTEXT + payload, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise GrantError(
            GrantRefusal.BAD_SIGNATURE, "the grant's signature does not verify"
        ) from exc
    if now_s >= claims.expires_at_s:
        raise GrantError(
            GrantRefusal.EXPIRED,
            f"the grant expired {now_s - claims.expires_at_s:.0f}s ago; "
            "ask a replica for a new one",
        )
    if claims.job_id != job_id:
        raise GrantError(
            GrantRefusal.WRONG_JOB,
            f"the grant is for job {claims.job_id!r}, not {job_id!r}",
        )
    if claims.node_id and claims.node_id != node_id:
        raise GrantError(
            GrantRefusal.WRONG_NODE,
            f"the grant is for node {claims.node_id!r}, not this node ({node_id!r})",
        )
    return claims
