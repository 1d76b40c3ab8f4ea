"""What a local dev cluster is made of, and where it listens.

By default the replicas listen on fixed loopback ports so that ``synctl`` works without
``--cluster``:

=======================  ====================================
gRPC (clients)           127.0.0.1:7101, 7102, 7103  (``DEFAULT_CLUSTER``)
Raft                     127.0.0.1:7111, 7112, 7113
worker log service       127.0.0.1:7121, 7122, ... (one per worker)
dashboard and /metrics   127.0.0.1:7191, 7192, 7193 (replicas a, b, c)
worker /metrics          127.0.0.1:7201, 7202, ... (one per worker)
=======================  ====================================

Five replicas add 7104, 7105 (gRPC), 7114, 7115 (Raft) and 7194, 7195 (dashboard).
``DevClusterOptions(ephemeral_ports=True)`` picks free ports instead, so tests and the
demo never clash with a running dev cluster. A dashboard or /metrics port that is taken
is replaced by a free one (:func:`preferred_metrics_ports`); the others stay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from synapse_ha.core.spec.document import SpecError, parse_cpu, parse_duration, parse_memory
from synapse_ha.local.ports import HOST

REPLICA_IDS = ("a", "b", "c")
DEFAULT_GRPC_PORTS = (7101, 7102, 7103)
DEFAULT_RAFT_PORTS = (7111, 7112, 7113)
DEFAULT_WORKER_PORT_BASE = 7121
DEFAULT_CLUSTER = ",".join(f"{HOST}:{port}" for port in DEFAULT_GRPC_PORTS)
# Five replicas (`synctl dev up --replicas 5`): the three above and two more.
REPLICA_COUNTS = (3, 5)
FIVE_REPLICA_IDS = (*REPLICA_IDS, "d", "e")
FIVE_GRPC_PORTS = (*DEFAULT_GRPC_PORTS, 7104, 7105)
FIVE_RAFT_PORTS = (*DEFAULT_RAFT_PORTS, 7114, 7115)
MAX_WORKERS = 64
FIVE_DASHBOARD_PORTS = (7191, 7192, 7193, 7194, 7195)  # after the workers' 7121-7184
DEFAULT_WORKER_METRICS_BASE = 7201


@dataclass(frozen=True)
class DevClusterOptions:
    """What to start. ``data_dir=None`` means a temporary directory removed on stop."""

    workers: int = 4
    racks: int = 2
    gpus_per_worker: int = 8
    data_dir: Path | None = None
    ephemeral_ports: bool = False  # free ports chosen by the OS instead of 7101...
    worker_cpu: str = "32"  # capacity each worker offers (mock, like its GPUs)
    worker_memory: str = "256Gi"
    stop_grace: str = "2s"  # members' SIGTERM-to-SIGKILL grace on a graceful stop
    ready_timeout_s: float = 60.0  # bound on every wait for readiness
    keep_data: bool = False  # keep a temporary data directory after stop
    insecure: bool = False  # plaintext, no authentication (programs run with --insecure)
    replicas: int = 3  # scheduler replicas: 3 or 5 (five survive two failures)

    def check(self) -> None:
        """Raise :class:`ValueError` naming the option and the rule it breaks."""
        if self.replicas not in REPLICA_COUNTS:
            raise ValueError(f"replicas: must be 3 or 5, got {self.replicas}")
        if not 0 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers: must be between 0 and {MAX_WORKERS}, got {self.workers}")
        if not 1 <= self.racks <= MAX_WORKERS:
            raise ValueError(f"racks: must be between 1 and {MAX_WORKERS}, got {self.racks}")
        if self.workers and self.racks > self.workers:
            raise ValueError(
                f"racks: {self.racks} racks need at least as many workers, got {self.workers}"
            )
        if not 0 <= self.gpus_per_worker <= 64:
            raise ValueError(
                f"gpus_per_worker: must be between 0 and 64, got {self.gpus_per_worker}"
            )
        if self.ready_timeout_s <= 0:
            raise ValueError("ready_timeout_s: must be positive")
        try:
            parse_cpu(self.worker_cpu, "worker_cpu")
            parse_memory(self.worker_memory, "worker_memory")
            if parse_duration(self.stop_grace, "stop_grace") <= 0:
                raise SpecError("stop_grace", "must be positive")
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        if self.data_dir is not None:
            try:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                probe = self.data_dir / ".write-probe"
                probe.write_text("ok")
                probe.unlink()
            except OSError as exc:
                raise ValueError(f"data_dir: {self.data_dir} is not writable: {exc}") from None


def worker_id(index: int) -> str:
    """The node id of the dev cluster's ``index``-th worker (1-based)."""
    return f"w{index}"


def preferred_metrics_ports(options: DevClusterOptions) -> dict[str, int]:
    """The port each program of a dev cluster of ``options`` serves /metrics on when it
    is free (a replica's dashboard too), by replica id and worker node id: fixed, so the
    dashboard's address stays the same from one run to the next; none with
    ``ephemeral_ports`` (every port free). Workers added later get the next ports."""
    if options.ephemeral_ports:
        return {}
    n = options.replicas
    ports = dict(zip(FIVE_REPLICA_IDS[:n], FIVE_DASHBOARD_PORTS[:n], strict=True))
    for i in range(1, MAX_WORKERS + 1):
        ports[worker_id(i)] = DEFAULT_WORKER_METRICS_BASE + i - 1
    return ports
