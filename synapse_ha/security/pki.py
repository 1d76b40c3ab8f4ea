"""The cluster CA and the certificates it issues (DESIGN §8).

One self-signed CA per cluster signs a certificate for every replica, worker and user.
A certificate names its holder in a URI subject alternative name,
``Identity.spiffe_id`` (``spiffe://synapse/worker/<node-id>`` ...); the subject common
name repeats it as ``str(identity)`` for people reading ``openssl x509`` output.
Replicas and workers serve gRPC, so their certificates also carry the host names and IP
addresses clients dial (as DNS and IP SANs).

**Role names and key usage.** A client must know that the server it dials is a replica
(or, for a worker's log service, the worker it meant) before it sends a bearer token or a
grant. gRPC Python offers no hook to inspect the server's certificate before the first
call, so the role is checked by the one thing gRPC core verifies in the handshake: a
name. Every replica certificate carries the DNS SAN :data:`REPLICA_SERVER_NAME`
(``replica.synapse.invalid``) and every worker certificate the DNS SAN
:func:`worker_server_name` of its node id (``gpu-7.worker.synapse.invalid``); clients
demand that name (:meth:`synapse_ha.security.tls.Transport.channel`). The names live
under ``synapse.invalid`` (a top-level domain reserved never to resolve, RFC 2606), which
no host given to :func:`issue` may use, and wildcard host names are not issued, so no
other certificate of the CA can carry them. The extended key usage says what a
certificate may do, and BoringSSL enforces it in both directions: replicas and workers
serve and call (serverAuth + clientAuth); users and transport-only clients only call
(clientAuth), so their certificates cannot serve at all.

Certificates issued before role names existed name no role: :func:`outdated` says so
with the ``synctl ca issue`` command that replaces one, and a replica or worker refuses
to start with such a certificate.

Keys are ECDSA P-256; signatures are ECDSA with SHA-256. Private keys are written
unencrypted in PKCS#8 PEM with mode 0600 into files that did not exist before (unless
``overwrite``); a file is written completely under a temporary name and renamed into
place, so a process reloading it never reads half a file.

File layout: ``init_ca(DIR)`` writes ``DIR/ca.pem`` and ``DIR/ca.key``;
``issue(DIR, identity, OUT)`` writes ``OUT/<kind>-<name>.pem`` and ``OUT/<kind>-<name>.key``
(``replica-r1``, ``worker-gpu-7``, ``user-alice``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from synapse_ha.core.identity.access import NAME_PATTERN, Identity, Kind, parse_spiffe_id

CA_CERT_NAME = "ca.pem"
CA_KEY_NAME = "ca.key"
# Transport-only client certificates: no identity of ours (parse_spiffe_id gives None).
CLIENT_SPIFFE_PREFIX = "spiffe://synapse/client/"
# Issued certificates start this long before "now" so that peers whose clocks run a
# little behind accept them at once.
BACKDATE = timedelta(minutes=5)

# The names clients demand of a server by its role (module docstring). The domain is
# reserved: no host of an issued certificate may lie in it.
ROLE_DOMAIN = "synapse.invalid"
REPLICA_SERVER_NAME = f"replica.{ROLE_DOMAIN}"
WORKER_SERVER_DOMAIN = f"worker.{ROLE_DOMAIN}"
# A node id that is one lowercase DNS label names its worker as it is; any other (capital
# letters, dots, underscores) by a digest, in a second label no plain id can have: gRPC
# compares names without regard to case, and "GPU1" must not answer for "gpu1".
_PLAIN_NODE_LABEL = re.compile(r"^[a-z0-9-]{1,63}$")
_DIGEST_HEX = 40

_SERVES_AND_CALLS = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
_CALLS_ONLY = (ExtendedKeyUsageOID.CLIENT_AUTH,)


class PkiError(Exception):
    """A CA or certificate operation that cannot be done; the message says why and what
    to do."""


@dataclass(frozen=True, slots=True)
class CaFiles:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class CertFiles:
    """An issued certificate, its private key, and the CA certificate that verifies it."""

    cert: Path
    key: Path
    ca: Path


def ca_files(directory: Path) -> CaFiles:
    """Where ``init_ca(directory)`` puts (or put) the CA."""
    return CaFiles(cert=directory / CA_CERT_NAME, key=directory / CA_KEY_NAME)


def cert_file_stem(identity: Identity) -> str:
    """``<kind>-<name>``: the file name (without suffix) of an identity's certificate."""
    return f"{identity.kind}-{identity.name}"


def worker_server_name(node_id: str) -> str:
    """The DNS name a worker's certificate carries and its log service is dialled by:
    ``<node-id>.worker.synapse.invalid`` when the node id is one lowercase DNS label,
    else ``<40 hex digits of its SHA-256>.id.worker.synapse.invalid``. Distinct node ids
    give distinct names, also where they differ only in case."""
    if _PLAIN_NODE_LABEL.match(node_id):
        return f"{node_id}.{WORKER_SERVER_DOMAIN}"
    digest = hashlib.sha256(node_id.encode()).hexdigest()[:_DIGEST_HEX]
    return f"{digest}.id.{WORKER_SERVER_DOMAIN}"


def server_name(identity: Identity) -> str | None:
    """The role name a server with this identity carries (None for users, who never
    serve): :data:`REPLICA_SERVER_NAME` for every replica, :func:`worker_server_name`
    for a worker."""
    if identity.kind is Kind.REPLICA:
        return REPLICA_SERVER_NAME
    if identity.kind is Kind.WORKER:
        return worker_server_name(identity.name)
    return None


def init_ca(
    directory: Path, *, common_name: str = "synapse cluster CA", days: int = 3650
) -> CaFiles:
    """Create a new self-signed CA in ``directory`` (created with mode 0700 if missing).

    Raises :class:`PkiError` when ``ca.pem`` or ``ca.key`` already exists there: a
    cluster's CA is never replaced by accident. The CA may sign leaf certificates only
    (path length 0)."""
    if days <= 0:
        raise PkiError(f"a CA must be valid for at least one day, not {days}")
    files = ca_files(directory)
    existing = [p for p in (files.cert, files.key) if p.exists()]
    if existing:
        raise PkiError(
            f"{_already(existing)}: a CA is there already; "
            "choose another directory or remove the old CA deliberately"
        )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage("key_cert_sign", "crl_sign"),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_new(files.key, _key_pem(key), mode=0o600, overwrite=False)
    _write_new(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644, False)
    return files


def issue_client(
    ca_dir: Path, name: str, out_dir: Path, *, days: int = 365, overwrite: bool = False
) -> CertFiles:
    """A transport-only client certificate (``spiffe://synapse/client/<name>``, files
    ``client-<name>``): it lets a program complete the mutual-TLS handshake but names no
    identity, so every call made with it alone is UNAUTHENTICATED; the caller proves who
    it is with a bearer token. This is what ``synctl`` users holding tokens use."""
    if not NAME_PATTERN.match(name):
        raise PkiError(f"{name!r} is not a valid client name")
    return _issue(
        ca_dir,
        f"{CLIENT_SPIFFE_PREFIX}{name}",
        f"client:{name}",
        f"client-{name}",
        out_dir,
        hosts=(),
        role_name=None,
        days=days,
        not_before=None,
        not_after=None,
        overwrite=overwrite,
    )


def issue(
    ca_dir: Path,
    identity: Identity,
    out_dir: Path,
    *,
    hosts: Sequence[str] = (),
    days: int = 365,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    overwrite: bool = False,
) -> CertFiles:
    """Issue a certificate for ``identity`` signed by the CA in ``ca_dir``.

    SANs: ``identity.spiffe_id`` always; for a replica or a worker its role name
    (:func:`server_name`) and each of ``hosts``, as an IP SAN when it parses as an IP
    address, else as a DNS SAN. Key usage: a replica or worker serves and calls, a user
    only calls. Validity: from ``not_before`` (default: now minus five minutes) to
    ``not_after`` (default: ``days`` after now); the explicit bounds let tests make
    expired or not-yet-valid certificates. ``out_dir`` is created (0700) if missing.
    Raises :class:`PkiError` when the CA is missing or unreadable, the identity's name is
    not a valid name, a host is a wildcard or lies in the reserved role domain, a user is
    given hosts, or the files exist and ``overwrite`` is false."""
    if not NAME_PATTERN.match(identity.name):
        raise PkiError(
            f"{identity.name!r} is not a valid {identity.kind} name: use letters, digits, "
            "'.', '_' and '-', starting with a letter or digit, at most 63 characters"
        )
    if (identity.role is not None) != (identity.kind is Kind.USER):
        raise PkiError(f"{identity}: only a user has a role, and a user needs one")
    role_name = server_name(identity)
    if role_name is None and hosts:
        raise PkiError(
            f"{identity}: a user certificate names no hosts (users call, they never serve)"
        )
    return _issue(
        ca_dir,
        identity.spiffe_id,
        str(identity),
        cert_file_stem(identity),
        out_dir,
        hosts=hosts,
        role_name=role_name,
        days=days,
        not_before=not_before,
        not_after=not_after,
        overwrite=overwrite,
    )


def _issue(
    ca_dir: Path,
    uri: str,
    common_name: str,
    stem: str,
    out_dir: Path,
    *,
    hosts: Sequence[str],
    role_name: str | None,
    days: int,
    not_before: datetime | None,
    not_after: datetime | None,
    overwrite: bool,
) -> CertFiles:
    """A leaf certificate: ``role_name`` given, one that serves (role name first among
    the DNS SANs) and calls; without, one that only calls."""
    host_names = [_host_name(host) for host in hosts]
    ca_cert, ca_key = _load_ca(ca_dir)
    now = datetime.now(UTC)
    start = not_before if not_before is not None else now - BACKDATE
    end = not_after if not_after is not None else now + timedelta(days=days)
    if end <= start:
        raise PkiError(f"the certificate would never be valid: it ends ({end}) before it starts")
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
    if role_name is not None:
        names.append(x509.DNSName(role_name))
    names.extend(host_names)
    usages = _SERVES_AND_CALLS if role_name is not None else _CALLS_ONLY
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage("digital_signature"),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(list(usages)),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    out = CertFiles(
        cert=out_dir / f"{stem}.pem", key=out_dir / f"{stem}.key", ca=ca_files(ca_dir).cert
    )
    if not overwrite:
        existing = [p for p in (out.cert, out.key) if p.exists()]
        if existing:
            raise PkiError(
                f"{_already(existing)}; remove them or ask for overwriting to replace them"
            )
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The key first: a reader that sees the new certificate also finds its key.
    _write_new(out.key, _key_pem(key), 0o600, overwrite)
    _write_new(out.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644, overwrite)
    return out


def load_certificate(pem_or_der: bytes) -> x509.Certificate:
    """The (first) certificate in PEM or DER bytes; :class:`PkiError` when there is none."""
    try:
        if pem_or_der.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(pem_or_der)
        return x509.load_der_x509_certificate(pem_or_der)
    except ValueError as exc:
        raise PkiError(f"not a certificate: {exc}") from exc


def identity_of(cert: x509.Certificate) -> Identity | None:
    """The identity a parsed certificate names in its SPIFFE URI SAN; None when it names
    none of ours, or names more than one."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    found = {
        identity
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier)
        if (identity := parse_spiffe_id(uri)) is not None
    }
    return found.pop() if len(found) == 1 else None


def identity_of_cert(pem_or_der: bytes) -> Identity | None:
    """The identity a certificate (PEM or DER) names in its SPIFFE URI SAN, parsed with
    :func:`synapse_ha.core.identity.access.parse_spiffe_id`; None when it names none of ours (or
    more than one). Raises :class:`PkiError` when the bytes are not a certificate.

    This only reads the certificate: whether the cluster's CA issued it is the TLS
    handshake's job (or :func:`synapse_ha.security.grants.verify_grant`'s)."""
    return identity_of(load_certificate(pem_or_der))


def outdated(pem_or_der: bytes) -> str | None:
    """Why a certificate of ours cannot serve as issued, with the command that replaces
    it; None when it can (or when it is a user's or a transport-only client's, which
    never serve).

    A replica or worker certificate without its role name (:func:`server_name`) was
    issued before role names existed: clients refuse it, so the process holding it must
    not start. The command keeps its hosts; add ``--ca-dir`` and ``--out`` as when it was
    issued. Raises :class:`PkiError` when the bytes are not a certificate."""
    cert = load_certificate(pem_or_der)
    identity = identity_of(cert)
    if identity is None:
        return None
    wanted = server_name(identity)
    if wanted is None:
        return None
    dns, addresses = _host_sans(cert)
    if wanted in dns:
        return None
    hosts = [h for h in dns if not _in_role_domain(h)] + addresses
    command = " ".join(
        ["synctl ca issue", str(identity.kind), identity.name, "--ca-dir CA_DIR"]
        + [f"--host {h}" for h in hosts]
        + ["--out DIR --force"]
    )
    return (
        f"the {identity.kind} certificate of {identity} does not carry the name {wanted} that "
        f"clients demand of a {identity.kind} (it was issued before certificates named their "
        f"role); issue it again: {command}"
    )


def key_matches_certificate(key_pem: bytes, cert_pem: bytes) -> bool:
    """Whether the private key in ``key_pem`` belongs to the certificate in ``cert_pem``
    (False also when either does not parse)."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
        cert = load_certificate(cert_pem)
    except (ValueError, TypeError, PkiError):
        return False
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


# ------------------------------------------------------------------------- helpers


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    files = ca_files(ca_dir)
    try:
        cert_pem = files.cert.read_bytes()
        key_pem = files.key.read_bytes()
    except OSError as exc:
        raise PkiError(
            f"cannot read the CA in {ca_dir} ({exc.strerror}: {exc.filename}); "
            "create one with `synctl ca init DIR`"
        ) from exc
    cert = load_certificate(cert_pem)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise PkiError(f"{files.key} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{files.key} is not an ECDSA key")
    if not key_matches_certificate(key_pem, cert_pem):
        raise PkiError(f"{files.key} is not the key of {files.cert}")
    return cert, key


def _already(paths: Sequence[Path]) -> str:
    verb = "exists" if len(paths) == 1 else "exist"
    return f"{' and '.join(str(p) for p in paths)} already {verb}"


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or any(c.isspace() for c in host) or "/" in host:
        raise PkiError(f"{host!r} is neither an IP address nor a DNS name")
    if "*" in host:
        raise PkiError(f"{host!r}: wildcard host names are not issued; name each host")
    if _in_role_domain(host):
        raise PkiError(
            f"{host!r}: {ROLE_DOMAIN} is reserved for the role names synapse gives replicas "
            "and workers itself"
        )
    return x509.DNSName(host)


def _in_role_domain(host: str) -> bool:
    name = host.lower().rstrip(".")
    return name == ROLE_DOMAIN or name.endswith(f".{ROLE_DOMAIN}")


def _host_sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """The DNS names and IP addresses a certificate names (empty without SANs)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    dns = list(san.get_values_for_type(x509.DNSName))
    return dns, [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


def _key_usage(*allowed: str) -> x509.KeyUsage:
    """The key usage extension that allows ``allowed`` only."""
    return x509.KeyUsage(**{usage: usage in allowed for usage in _KEY_USAGES})


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_new(path: Path, data: bytes, mode: int, overwrite: bool) -> None:
    """Write ``data`` under a temporary name in the same directory and rename it to
    ``path``: readers see the old file or the whole new one. Without ``overwrite``, an
    existing ``path`` is an error (checked again at the rename, which then links)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise PkiError(f"{path} already exists") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
