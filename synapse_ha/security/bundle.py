"""A cluster's credentials in one directory: what ``synctl dev up``, the demo, the test
clusters, the chaos suite and the benchmarks run with (secure by default).

Layout of ``root``::

    ca/ca.pem, ca/ca.key             the cluster CA
    certs/replica-<id>.pem|.key      one per replica (SANs: the loopback hosts)
    certs/worker-<node>.pem|.key     one per worker, issued when it is first started
    certs/user-admin-admin.pem|.key  the admin user's certificate
    certs/client-cli.pem|.key        transport only: a token says who the caller is
    admin.token                      the bootstrap admin token (0600)

Every replica starts with ``--bootstrap-token-file admin.token``: the first leader
replicates the token's hash, so the admin can create the other users' tokens.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from synapse_ha.core.identity.access import TOKEN_PREFIX, Identity, Role, replica, user, worker
from synapse_ha.security.pki import ca_files, init_ca, issue, issue_client, outdated
from synapse_ha.security.tls import TlsFiles

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
ADMIN_USER = "admin"
CLI_CLIENT = "cli"


def new_token_text() -> str:
    """A fresh token: ``syn_<12 hex id>_<32 random bytes, url-safe>``."""
    return f"{TOKEN_PREFIX}{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


def new_raft_password() -> str:
    """A fresh Raft password: 32 random bytes, URL-safe base64 (what
    ``openssl rand -base64 32`` makes, in the other alphabet), which passes the replicas'
    password rule."""
    return secrets.token_urlsafe(32)


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to a new file readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text + "\n")


class ClusterCredentials:
    """The CA, certificates and admin token of one cluster, under ``root``."""

    def __init__(self, root: Path, hosts: Sequence[str] = LOOPBACK_HOSTS) -> None:
        self.root = root
        self.hosts = tuple(hosts)
        self.ca_dir = root / "ca"
        self.certs_dir = root / "certs"
        self.admin_token_file = root / "admin.token"

    @classmethod
    def ensure(cls, root: Path, hosts: Sequence[str] = LOOPBACK_HOSTS) -> ClusterCredentials:
        """Open the credentials under ``root``, creating the CA, the admin's certificate,
        the CLI client certificate and the admin token the first time."""
        creds = cls(root, hosts)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not ca_files(creds.ca_dir).cert.exists():
            init_ca(creds.ca_dir)
        if not creds.admin_token_file.exists():
            write_secret(creds.admin_token_file, new_token_text())
        creds.admin_tls()
        creds.client_tls()
        return creds

    @property
    def ca(self) -> Path:
        return ca_files(self.ca_dir).cert

    @property
    def admin_token(self) -> str:
        return self.admin_token_file.read_text(encoding="utf-8").strip()

    def _tls(self, identity: Identity, hosts: Sequence[str] = ()) -> TlsFiles:
        """The identity's certificate, issued the first time, and issued again when the
        one there was made before certificates named their role (a kept dev cluster)."""
        stem = f"{identity.kind}-{identity.name}"
        cert, key = self.certs_dir / f"{stem}.pem", self.certs_dir / f"{stem}.key"
        if not cert.exists():
            issue(self.ca_dir, identity, self.certs_dir, hosts=hosts)
        elif outdated(cert.read_bytes()) is not None:
            issue(self.ca_dir, identity, self.certs_dir, hosts=hosts, overwrite=True)
        return TlsFiles(ca=self.ca, cert=cert, key=key)

    def replica_tls(self, replica_id: str) -> TlsFiles:
        return self._tls(replica(replica_id), self.hosts)

    def worker_tls(self, node_id: str) -> TlsFiles:
        return self._tls(worker(node_id), self.hosts)

    def user_tls(self, name: str, role: Role = Role.USER) -> TlsFiles:
        """A user's certificate (an alternative to a token)."""
        return self._tls(user(name, role))

    def admin_tls(self) -> TlsFiles:
        return self.user_tls(ADMIN_USER, Role.ADMIN)

    def client_tls(self) -> TlsFiles:
        """The transport-only certificate token holders use."""
        cert = self.certs_dir / f"client-{CLI_CLIENT}.pem"
        key = self.certs_dir / f"client-{CLI_CLIENT}.key"
        if not cert.exists():
            issue_client(self.ca_dir, CLI_CLIENT, self.certs_dir)
        return TlsFiles(ca=self.ca, cert=cert, key=key)

    def tls_args(self, files: TlsFiles) -> list[str]:
        """The ``--tls-*`` flags of synapse-scheduler and synapse-worker for ``files``."""
        return [
            "--tls-ca",
            str(files.ca),
            "--tls-cert",
            str(files.cert),
            "--tls-key",
            str(files.key),
        ]

    def exports(self) -> list[str]:
        """Shell lines that point synctl at this cluster as its admin."""
        client = self.client_tls()
        return [
            f"export SYNAPSE_CA={client.ca}",
            f"export SYNAPSE_CERT={client.cert}",
            f"export SYNAPSE_KEY={client.key}",
            f"export SYNAPSE_TOKEN_FILE={self.admin_token_file}",
        ]
