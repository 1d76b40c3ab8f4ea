"""One node that two tenants share, for the attack tests on real processes: a replica, a
worker agent the test starts, and (as root) two temporary local accounts, ``mallory`` and
``victim``, made with useradd and removed at teardown (:func:`tenant_node`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from synapse_ha.client.cluster import ClusterClient
from tests.integration.cluster import LocalCluster

AS_ROOT = os.geteuid() == 0 and shutil.which("useradd") is not None


def run_account_command(*argv: str) -> None:
    """Run an account command; another one holding the account database's lock (tests
    running beside these) is waited out, within a bound."""
    deadline = time.monotonic() + 30
    while True:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            return
        if "lock" not in done.stderr or time.monotonic() > deadline:
            raise AssertionError(f"{' '.join(argv)}: {done.stderr.strip()}")
        time.sleep(0.2)


@dataclass
class TenantNode:
    """The shared node: ``accounts`` are mallory's and victim's (as root), ``data_dir``
    the worker's."""

    root: Path
    cluster: LocalCluster
    admin: ClusterClient
    clients: dict[str, ClusterClient] = field(default_factory=dict)
    accounts: list[str] = field(default_factory=list)
    group: str = ""

    @property
    def data_dir(self) -> Path:
        return self.root / "w1"

    def user(self, name: str) -> ClusterClient:
        """A client holding a user token for ``name`` (made once)."""
        if name not in self.clients:
            token = self.admin.create_token(name).token
            self.clients[name] = self.cluster.client(timeout_s=30.0, token=token)
        return self.clients[name]

    def make_accounts(self) -> None:
        """mallory and victim, sharing one primary group (as users of a group ``users``)."""
        suffix = secrets.token_hex(3)
        self.group = f"synapse-s-{suffix}"
        run_account_command("groupadd", "--system", self.group)
        for role in ("mallory", "victim"):
            name = f"syn-{role}-{suffix}"
            run_account_command(
                "useradd", "--system", "--no-create-home", "--gid", self.group, name
            )
            self.accounts.append(name)


N = TypeVar("N", bound=TenantNode)


@contextlib.contextmanager
def tenant_node(
    prefix: str, make: Callable[[Path, LocalCluster, ClusterClient], N], start: Callable[[N], None]
) -> Iterator[N]:
    """A one-replica cluster in a directory every account can reach (not pytest's
    root-only temporary directories), the node ``make`` gives, its accounts (as root),
    then ``start`` (the worker); everything ended and removed at exit."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    cluster = LocalCluster(root / "cluster", size=1)
    node: N | None = None
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        node = make(root, cluster, cluster.client(timeout_s=30.0))
        if AS_ROOT:
            node.make_accounts()
        start(node)
        yield node
    finally:
        if node is not None:
            for client in [*node.clients.values(), node.admin]:
                client.close()
        cluster.close()
        if node is not None:
            for name in node.accounts:
                subprocess.run(["userdel", name], capture_output=True, timeout=30, check=False)
            if node.group:
                subprocess.run(
                    ["groupdel", node.group], capture_output=True, timeout=30, check=False
                )
        shutil.rmtree(root, ignore_errors=True)
