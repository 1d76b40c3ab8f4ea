"""How a process speaks gRPC: mutual TLS against the cluster CA, or (only when asked
for explicitly) plaintext. DESIGN §8.

A :class:`Transport` is built from three PEM files (:class:`TlsFiles`: the CA bundle,
this process's certificate and its key) and makes client channels and server ports.

* Servers **require** a client certificate issued by a CA in the bundle; a client
  without one, with one from another CA, or with an expired one fails the handshake (the
  caller sees ``UNAVAILABLE``).
* Clients verify the server's certificate against the bundle and **its role**: a
  channel demands the role name of a replica (:data:`~synapse_ha.security.pki.REPLICA_SERVER_NAME`),
  or, for a worker's log service, the name of the worker it means to reach
  (:func:`~synapse_ha.security.pki.worker_server_name`), through gRPC's
  ``grpc.ssl_target_name_override``. gRPC core checks that name against the server
  certificate's SANs during the handshake, so a server without it (a worker, a user or a
  transport-only certificate of the same CA whose SANs cover the address dialled, or
  another worker) fails the handshake and no call, hence no bearer token and no grant,
  is ever sent to it. BoringSSL also checks the key usage: a certificate without
  serverAuth (users', clients') cannot serve at all. The host dialled is not compared
  with the certificate's host SANs any more: a replica certificate is accepted at any
  address, which is the trust a client gives every replica anyway.
* **Certificates issued before role names** (a replica or worker certificate without
  its role name) are refused when the files are read (:class:`TlsError` naming the file
  and the ``synctl ca issue`` command that replaces it): a process never starts with a
  certificate its clients would refuse.
* **Reload without restart.** The server side re-reads the three files for the next
  handshake whenever one of them changed (inode, size, mtime or ctime): replacing the
  certificate, the key or the CA bundle on disk takes effect for new connections;
  established connections keep the material they were made with. A half-rotated state
  (a certificate whose key is not yet in place, a file that does not parse) keeps the
  previous material until the files agree again. Client channels are built from the files
  as they are when :meth:`Transport.channel` is called; a client holding long-lived
  channels compares :meth:`Transport.version` and rebuilds them when it changes.
* **Caller identity.** :func:`peer_identity` reads the verified client certificate of
  the current call and returns the :class:`~synapse_ha.core.identity.access.Identity` it names.

TLS versions (grpcio 1.85): the Python API builds gRPC core's SSL credentials, which
offer TLS 1.2 and TLS 1.3 (BoringSSL) and negotiate TLS 1.3 whenever the peer offers it;
between two grpcio processes every connection is TLS 1.3 (``tests/security`` checks what
a server negotiates). grpcio exposes no minimum-version setting: neither
``ssl_channel_credentials`` / ``dynamic_ssl_server_credentials`` nor a channel argument
nor an environment variable can refuse TLS 1.2 (``GRPC_SSL_CIPHER_SUITES`` selects TLS
1.2 cipher suites only). TLS 1.2 is therefore accepted from other clients, with gRPC
core's default ECDHE-AES-GCM suites.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from synapse_ha.core.identity.access import Identity
from synapse_ha.security.pki import (
    REPLICA_SERVER_NAME,
    CertFiles,
    PkiError,
    identity_of_cert,
    key_matches_certificate,
    outdated,
    worker_server_name,
)

log = logging.getLogger(__name__)

# auth_context() key of the peer's verified leaf certificate (PEM).
PEER_CERT_KEY = "x509_pem_cert"
# Distinct client certificates whose identity is remembered; a cluster has a few
# replicas and workers plus the users currently connected.
PEER_CACHE_SIZE = 1024


# The largest answer a client accepts. gRPC's default (4 MiB) is smaller than a whole
# replica state (GetReplicaState) once a cluster holds a few thousand jobs; the answers
# come from servers the client authenticated.
MAX_RECEIVE_BYTES = 512 << 20
_MAX_RECEIVE = "grpc.max_receive_message_length"
# The name gRPC core checks the server certificate against, instead of the host dialled.
_SERVER_NAME = "grpc.ssl_target_name_override"


class TlsError(Exception):
    """The TLS files cannot be read or do not fit together; the message names the file."""


class OutdatedCertificate(TlsError):
    """A replica or worker certificate issued before role names; the message says how
    to replace it."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files a process needs for mutual TLS: the CA bundle it trusts (one or
    more CA certificates; during a CA rotation, the old and the new), its certificate and
    the certificate's private key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_cert_files(cls, files: CertFiles) -> TlsFiles:
        return cls(ca=files.ca, cert=files.cert, key=files.key)


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """The contents of :class:`TlsFiles`, read together and checked to fit."""

    ca: bytes
    cert: bytes
    key: bytes


FileStamp = tuple[str, int, int, int, int] | tuple[str]


def _stamp(path: Path) -> FileStamp:
    try:
        st = os.stat(path)
    except OSError:
        return (str(path),)
    return (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_material(files: TlsFiles) -> TlsMaterial:
    """Read the three files; :class:`TlsError` when one is missing or unreadable, the
    key is not the certificate's, or the certificate is a replica's or worker's issued
    before role names (:func:`synapse_ha.security.pki.outdated`)."""
    try:
        material = TlsMaterial(
            ca=files.ca.read_bytes(), cert=files.cert.read_bytes(), key=files.key.read_bytes()
        )
    except OSError as exc:
        raise TlsError(f"cannot read TLS file {exc.filename}: {exc.strerror}") from exc
    if b"-----BEGIN CERTIFICATE-----" not in material.ca:
        raise TlsError(f"{files.ca} holds no PEM certificate")
    if not key_matches_certificate(material.key, material.cert):
        raise TlsError(f"{files.key} is not the private key of {files.cert}")
    problem = outdated(material.cert)
    if problem is not None:
        raise OutdatedCertificate(f"{files.cert}: {problem}")
    return material


class _ServerMaterial:
    """The fetcher behind a secure server port: hands gRPC new certificate material
    when the files changed since the last handshake, and None (keep what you have)
    otherwise or while the files do not fit together."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._stamp = self._current_stamp()
        self._refused: tuple[FileStamp, ...] | None = None  # outdated files, said once
        self.initial = _server_config(read_material(files))

    def _current_stamp(self) -> tuple[FileStamp, ...]:
        return tuple(_stamp(p) for p in (self._files.ca, self._files.cert, self._files.key))

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            stamp = self._current_stamp()
            if stamp == self._stamp:
                return None
            try:
                material = read_material(self._files)
            except OutdatedCertificate as exc:
                if stamp != self._refused:
                    self._refused = stamp
                    log.warning("kept the previous TLS material: %s", exc)
                return None
            except TlsError:
                return None  # mid-rotation: try again at the next handshake
            # The stamp read before the files: a change while reading is seen next time.
            self._stamp = stamp
            return _server_config(material)


def _server_config(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.cert)], root_certificates=material.ca
    )


class Transport:
    """How this process makes gRPC channels and server ports.

    ``Transport(files)`` is mutual TLS with those files; ``Transport.insecure()`` (also
    ``Transport(None)``) is plaintext, which a program must only choose behind an explicit
    ``--insecure`` flag. The files are read when a channel or port is made (and, for
    server ports, again after they change); what was read is kept while the files'
    :meth:`version` (inode, size and times) stays the same, so that opening a channel
    costs no key parsing, and never across a change."""

    def __init__(self, files: TlsFiles | None) -> None:
        self.files = files
        self._read: tuple[tuple[FileStamp, ...], TlsMaterial] | None = None  # stamps, contents

    @classmethod
    def insecure(cls) -> Transport:
        return cls(None)

    @property
    def secure(self) -> bool:
        return self.files is not None

    def version(self) -> object:
        """A value that compares equal as long as the TLS files are unchanged (always the
        same value for an insecure transport). Holders of long-lived channels compare it
        and rebuild their channels when it differs."""
        if self.files is None:
            return None
        return self._stamps(self.files)

    @staticmethod
    def _stamps(files: TlsFiles) -> tuple[FileStamp, ...]:
        return tuple(_stamp(p) for p in (files.ca, files.cert, files.key))

    def material(self) -> TlsMaterial | None:
        """The current contents of the files (None when insecure); :class:`TlsError` when
        they cannot be read or do not fit."""
        if self.files is None:
            return None
        stamps = self._stamps(self.files)
        read = self._read
        if read is not None and read[0] == stamps:
            return read[1]
        material = read_material(self.files)
        if all(len(stamp) > 1 for stamp in stamps):  # every file was there when stamped
            self._read = (stamps, material)
        return material

    def channel(
        self,
        address: str,
        options: Sequence[tuple[str, Any]] = (),
        *,
        worker: str | None = None,
    ) -> grpc.Channel:
        """A channel to ``address`` (``HOST:PORT``): TLS presenting this process's
        certificate and trusting the CA bundle, or plaintext when insecure.

        The server must be a replica of the cluster, or, with ``worker`` (a node id), the
        worker of that node: its certificate must carry the role name
        (:data:`~synapse_ha.security.pki.REPLICA_SERVER_NAME`, or
        :func:`~synapse_ha.security.pki.worker_server_name` of ``worker``), which gRPC
        checks in the handshake, before any call (and its metadata) leaves. A server
        without it fails every call with ``UNAVAILABLE``. Answers up to
        :data:`MAX_RECEIVE_BYTES` are accepted unless ``options`` say otherwise.
        ``options`` may not set the server name (``ValueError``): it is this method's."""
        options = [*options]
        if any(name == _SERVER_NAME for name, _ in options):
            raise ValueError(f"{_SERVER_NAME} is set by Transport.channel from the server's role")
        if not any(name == _MAX_RECEIVE for name, _ in options):
            options.append((_MAX_RECEIVE, MAX_RECEIVE_BYTES))
        material = self.material()
        if material is None:
            return grpc.insecure_channel(address, options=options)
        expected = REPLICA_SERVER_NAME if worker is None else worker_server_name(worker)
        options.append((_SERVER_NAME, expected))
        credentials = grpc.ssl_channel_credentials(
            root_certificates=material.ca,
            private_key=material.key,
            certificate_chain=material.cert,
        )
        return grpc.secure_channel(address, credentials, options=options)

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Listen on ``address`` and return the bound port (``HOST:0`` picks a free one).
        A secure port requires every client to present a certificate issued by a CA in
        the bundle, and picks up changed files at the next handshake."""
        if self.files is None:
            return server.add_insecure_port(address)
        fetcher = _ServerMaterial(self.files)
        # grpcio documents None from the fetcher as "no change"; its stub does not.
        credentials = grpc.dynamic_ssl_server_credentials(
            fetcher.initial,
            fetcher,  # type: ignore[arg-type]
            require_client_authentication=True,
        )
        return server.add_secure_port(address, credentials)


def peer_identity(context: grpc.ServicerContext) -> Identity | None:
    """The identity named by the verified client certificate of the current call; None on
    a plaintext connection, or when the certificate names no identity of ours.

    gRPC has verified the certificate against the server's CA bundle before the call
    reaches a handler, so a result here is authenticated."""
    certs = context.auth_context().get(PEER_CERT_KEY)
    if not certs:
        return None
    return _identity_of_pem(certs[0])


# A memo of a pure function of the certificate bytes: sharing it between servers cannot
# change a result, only save the parse (a few tens of microseconds per call).
@functools.lru_cache(maxsize=PEER_CACHE_SIZE)
def _identity_of_pem(pem: bytes) -> Identity | None:
    try:
        return identity_of_cert(pem)
    except PkiError:
        return None


INSECURE_WARNING = (
    "running with --insecure: no TLS and no authentication; anyone who can reach this "
    "process's ports can do anything a cluster admin can"
)


def add_tls_flags(parser: argparse.ArgumentParser, holder: str, insecure_help: str) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key`` and ``--insecure`` for a program whose
    certificate names ``holder`` (e.g. "replica")."""
    parser.add_argument("--tls-ca", help="the cluster CA certificate bundle (PEM)")
    parser.add_argument(
        "--tls-cert", help=f"this {holder}'s certificate (PEM, from synctl ca issue {holder})"
    )
    parser.add_argument("--tls-key", help=f"this {holder}'s private key (PEM)")
    parser.add_argument("--insecure", action="store_true", default=None, help=insecure_help)


def tls_from(args: argparse.Namespace, doc: Mapping[str, Any]) -> TlsFiles | None:
    """:func:`tls_settings` from the flags of :func:`add_tls_flags` and a configuration
    file's ``[tls]`` table and ``insecure`` key (flags win)."""
    table = doc.get("tls", {})
    if not isinstance(table, Mapping):
        raise TlsError("[tls] must be a table with ca, cert and key")
    insecure = args.insecure if args.insecure is not None else doc.get("insecure", False)
    return tls_settings(
        args.tls_ca or table.get("ca", ""),
        args.tls_cert or table.get("cert", ""),
        args.tls_key or table.get("key", ""),
        bool(insecure),
    )


def tls_settings(ca: str, cert: str, key: str, insecure: bool) -> TlsFiles | None:
    """The TLS files a program was configured with, or None with ``insecure``. Raises
    :class:`TlsError` naming what is missing: without TLS material a replica or worker
    refuses to start unless ``--insecure`` is given."""
    given = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key}
    if insecure:
        if any(given.values()):
            raise TlsError("--insecure and --tls-* exclude each other; choose one")
        return None
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise TlsError(
            f"no TLS material ({', '.join(missing)} not given): pass the cluster CA and this "
            "process's certificate and key (synctl ca init / synctl ca issue make them), or "
            "--insecure to run without TLS and authentication"
        )
    files = TlsFiles(ca=Path(ca), cert=Path(cert), key=Path(key))
    read_material(files)  # fail now, naming the file, rather than at the first call
    return files
