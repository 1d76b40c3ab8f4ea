"""Real synapse-worker processes on 127.0.0.1 for integration tests.

Agents are started by :mod:`synapse_ha.local.launcher`; :meth:`LocalWorkers.close` stops
them, the member supervisors and members they left behind (via the member pid records,
then the launcher's marker sweep), so a failing test never leaks processes. Given the
cluster's credentials, every agent gets a worker certificate of the cluster's CA (the
replicas of a TLS cluster refuse anything else); without, the agents run ``--insecure``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from synapse_ha.local.launcher import Launcher
from synapse_ha.local.process import Worker
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.worker.procgroup import kill_recorded_process
from synapse_ha.worker.records import read_json

if TYPE_CHECKING:
    from synapse_ha.local.replicas import LocalReplicas

__all__ = ["LocalWorkers", "Worker", "workers_of"]


@contextmanager
def workers_of(cluster: LocalReplicas, root: Path) -> Iterator[LocalWorkers]:
    """Workers of ``cluster`` (its addresses and credentials) under ``root``, a new
    directory; every one of them stopped on the way out."""
    w = LocalWorkers(root, cluster.grpc_addresses, cluster.credentials)
    w.root.mkdir()
    try:
        yield w
    finally:
        w.close()


class LocalWorkers:
    """Agents ``node_id`` with data in ``root/node_id`` and logs ``root/node_id.log``."""

    def __init__(
        self,
        root: Path,
        schedulers: list[str],
        credentials: ClusterCredentials | None = None,
    ) -> None:
        self.root = root
        self.schedulers = schedulers
        self.launcher = Launcher(root, credentials=credentials)
        self.workers: list[Worker] = []

    def start(self, node_id: str, *extra: str) -> Worker:
        worker = self.launcher.worker(
            self.schedulers,
            node_id,
            self.root / node_id,
            extra=["--no-cgroups", "--stop-grace", "1s", "--fence-grace", "200ms", *extra],
        )
        self.workers.append(worker)
        self.launcher.start(worker)
        return worker

    def kill(self, worker: Worker, sig: int = signal.SIGKILL) -> None:
        """Signal the agent process only (not its members' supervisors); wait for it to
        exit on SIGKILL or SIGTERM."""
        worker.signal_process(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            worker.expect_running = False
            worker.wait(30)

    def close(self) -> None:
        for w in self.workers:
            w.kill(signal.SIGKILL)
            members = w.data_dir / "members"
            for record in members.glob("*/*/shim.json") if members.exists() else ():
                kill_recorded_process(read_json(record))
                kill_recorded_process(read_json(record.with_name("member.json")))
        self.launcher.close()

    def logs(self) -> str:
        return "\n".join(f"----- {w.node_id} -----\n{w.log_tail(3000)}" for w in self.workers)
