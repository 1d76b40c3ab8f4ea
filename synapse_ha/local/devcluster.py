"""A real local cluster on 127.0.0.1: three scheduler replicas and mock-GPU workers.

This is the engine behind ``synctl dev up`` and ``make demo``. Every program is a real
``synapse-scheduler`` or ``synapse-worker`` process, started by
:mod:`synapse_ha.local.launcher` as ``python -m`` with this interpreter, in a process group
of its own, with its log under ``DATA_DIR/logs``. The ports it listens on and the options
it takes are in :mod:`synapse_ha.local.devoptions`; :mod:`synapse_ha.local.foreground`
keeps one up for ``synctl dev up``.

Workers are spread over racks in contiguous blocks (``w1``, ``w2`` in ``r1``; ``w3``,
``w4`` in ``r2`` for four workers and two racks), with the topology labels
``zone=z1,block=b1,rack=rK``. Each declares ``gpus_per_worker`` mock GPUs in one NVLink
island and a fixed CPU and memory capacity, so results do not depend on the machine.

Lifecycle. :meth:`DevCluster.start` returns once a leader serves requests and every
worker is registered and ready; every wait is bounded by ``ready_timeout_s`` and fails
with :class:`DevClusterError` naming what it waited for and the tail of the relevant log.
:meth:`DevCluster.stop` is idempotent: it stops workers gracefully (their members get
SIGTERM, then SIGKILL after the stop grace), then the replicas, SIGKILLs any process
group that is still there (including members' supervisors and members, found through
the workers' pid records, and every process carrying the launcher's marker) and, for a
temporary data directory, removes it.

Secure by default. The cluster's credentials live in ``DATA_DIR/credentials``
(:class:`~synapse_ha.security.bundle.ClusterCredentials`: a CA, one certificate per
replica and worker, the admin user's certificate, a transport-only client certificate
and the bootstrap admin token), made on the first start and reused with a kept data
directory. Replicas and workers serve mutual TLS only; the cluster's own calls (status,
waiting for workers, :meth:`DevCluster.client`) present the admin certificate, and
:meth:`DevCluster.read_log` reads a member's log with a grant signed by a replica, as
``synctl logs`` does. :meth:`DevCluster.exports` gives the ``export`` lines that point
``synctl`` at the cluster as its admin. ``DevClusterOptions(insecure=True)`` runs
everything in plaintext without authentication (every program warns at start).

A fresh Raft password is generated for every run; it reaches the replicas only through
their environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import NodeStatus
from synapse_ha.core.spec.document import parse_duration
from synapse_ha.local.commands import loopback_peers
from synapse_ha.local.devoptions import (
    DEFAULT_WORKER_PORT_BASE,
    FIVE_GRPC_PORTS,
    FIVE_RAFT_PORTS,
    FIVE_REPLICA_IDS,
    MAX_WORKERS,
    DevClusterOptions,
    preferred_metrics_ports,
    worker_id,
)
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.ports import HOST, port_in_use
from synapse_ha.local.process import LaunchError, Process, Replica, Worker
from synapse_ha.local.replicas import LocalReplicas, replica_status
from synapse_ha.local.waiting import RPC_ERRORS, wait_until
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.rpc.states import node_status
from synapse_ha.security.bundle import ClusterCredentials, new_raft_password
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import Transport
from synapse_ha.worker.procgroup import kill_recorded_process
from synapse_ha.worker.records import read_json

T = TypeVar("T")

_POLL_S = 0.3
_REPLICA_STOP_S = 5.0
_KILL_WAIT_S = 5.0


class DevClusterError(Exception):
    """The local cluster could not start or do what was asked; the message says why."""


class PortBusy(DevClusterError):
    """A fixed port the cluster needs is already in use."""


@dataclass
class DevWorker(Worker):
    """A worker agent of the dev cluster, in one rack, with mock GPUs."""

    rack: str = ""
    gpus: int = 0
    listen: str = ""
    address: str = ""  # as registered with the control plane

    @property
    def topology(self) -> str:
        return f"zone=z1,block=b1,rack={self.rack}"


class DevCluster:
    """Three replicas and mock-GPU workers on loopback; a context manager.

    Not thread-safe, except :meth:`stop`, which may be called from any thread once.
    """

    def __init__(
        self, options: DevClusterOptions | None = None, *, abort: threading.Event | None = None
    ) -> None:
        self.options = options or DevClusterOptions()
        self.options.check()
        self._stop_grace_s = parse_duration(self.options.stop_grace, "stop_grace") / 1000
        self._abort = abort or threading.Event()
        self.owns_data_dir = self.options.data_dir is None
        self.keep_data = self.options.keep_data  # may be set before stop() to keep logs
        self.data_dir = Path(
            tempfile.mkdtemp(prefix="synapse-dev-")
            if self.options.data_dir is None
            else self.options.data_dir
        ).resolve()
        self.logs_dir = self.data_dir / "logs"
        self.raft_password = new_raft_password()
        self.credentials: ClusterCredentials | None = (
            None
            if self.options.insecure
            else ClusterCredentials.ensure(self.data_dir / "credentials")
        )
        self.launcher = Launcher(
            self.logs_dir, env=os.environ, credentials=self.credentials, fixed_metrics_ports=True
        )
        # Dashboards and /metrics on fixed ports when free (none with ephemeral ports).
        self.preferred_metrics_ports = preferred_metrics_ports(self.options)
        self.launcher.preferred_metrics_ports = self.preferred_metrics_ports
        self.workers: list[DevWorker] = []
        self._client: ClusterClient | None = None
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._started = False
        n = self.options.replicas
        ids = FIVE_REPLICA_IDS[:n]
        if self.options.ephemeral_ports:
            peers = loopback_peers(ids, holder=self.launcher.ports)
        else:
            peers = loopback_peers(ids, HOST, FIVE_GRPC_PORTS[:n], FIVE_RAFT_PORTS[:n])
        self._replicas = LocalReplicas(
            self.data_dir / "replicas",
            peers=peers,
            logs_dir=self.logs_dir,
            log_name="scheduler-{id}.log",
            password=self.raft_password,
            launcher=self.launcher,
            insecure=self.options.insecure,
        )
        self.replicas: list[Replica] = self._replicas.replicas
        # The cluster's own calls: as the admin user, by certificate (plaintext if insecure).
        self.transport: Transport = self._replicas.transport

    # ------------------------------------------------------------------ access

    @property
    def cluster_addresses(self) -> list[str]:
        """gRPC addresses of the replicas (what ``--cluster`` takes)."""
        return [r.grpc for r in self.replicas]

    @property
    def dashboard_url(self) -> str:
        """The dashboard of the first replica (every replica serves one)."""
        scheme = "http" if self.credentials is None else "https"
        return f"{scheme}://{self.replicas[0].metrics}/"

    @property
    def cluster(self) -> str:
        """The value for ``SYNAPSE_CLUSTER``."""
        return ",".join(self.cluster_addresses)

    def client(self, timeout_s: float = 10.0, *, token: str | None = None) -> ClusterClient:
        """A new client for this cluster; the caller closes it. By default it is the admin
        (by certificate); with ``token`` it is that token's user, over the transport-only
        client certificate."""
        return self._replicas.client(timeout_s, per_try_timeout_s=1.0, token=token)

    def exports(self) -> list[str]:
        """Shell lines that point ``synctl`` at this cluster as its admin: the addresses,
        and (unless insecure) the CA, the client certificate and the admin token file."""
        lines = [f"export SYNAPSE_CLUSTER={self.cluster}"]
        if self.credentials is not None:
            lines += self.credentials.exports()
        return lines

    def read_log(
        self, client: ClusterClient, job_id: str, rank: int, timeout_s: float = 5.0
    ) -> str:
        """A member's whole output (current or last attempt), read from its worker the way
        ``synctl logs`` reads it: ``client`` asks the leader for a log grant
        (``GrantLogAccess``, refused unless the caller may manage the job) and the worker
        is called over this cluster's transport with the grant. An insecure cluster signs
        no grants (``NEEDS_TLS``); the worker is then read without one. Raises
        ``grpc.RpcError`` for a refusal or a worker that does not answer."""
        request = pb.GrantLogAccessRequest(job_id=job_id, rank=rank)
        metadata: tuple[tuple[str, str], ...] = ()
        address = node_id = ""
        try:
            answer: pb.GrantLogAccessResponse = client.call(
                "GrantLogAccess",
                lambda a, t: client.scheduler(a).GrantLogAccess(request, timeout=t),
            )
            metadata = ((GRANT_METADATA_KEY, answer.grant),)
            address, node_id = answer.node_address, answer.node_id
        except grpc.RpcError as exc:
            if failure_of(exc).reason is not Reason.NEEDS_TLS:
                raise
        if not address:
            job = client.get_job(job_id)
            node_id = next(m.node_id for m in job.attempt.members if m.rank == rank)
            address = next(n.address for n in client.list_nodes() if n.node_id == node_id)
        with self.transport.channel(address, worker=node_id) as channel:
            stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            chunks = stub.ReadLog(
                wpb.ReadLogRequest(job_id=job_id, rank=rank), timeout=timeout_s, metadata=metadata
            )
            return b"".join(chunk.data for chunk in chunks).decode(errors="replace")

    def replica(self, replica_id: str) -> Replica:
        try:
            return self._replicas.replica(replica_id)
        except LaunchError as exc:
            raise DevClusterError(str(exc)) from None

    def worker(self, node_id: str) -> DevWorker:
        for w in self.workers:
            if w.node_id == node_id:
                return w
        raise DevClusterError(f"no worker {node_id!r}")

    @property
    def process_groups(self) -> set[int]:
        """Every process group this cluster started so far: replicas, workers, and the
        members' supervisors and members recorded in the workers' data directories
        (still complete after :meth:`stop` has removed those directories)."""
        if not self._stopped:
            self._remember_member_groups()
        return self.launcher.groups

    def replica_status(self, replica: Replica, timeout_s: float = 1.0) -> pb.ReplicaStatus:
        """The replica's own view of itself (raises ``grpc.RpcError`` when it is down)."""
        return replica_status(replica.grpc, timeout_s, self.transport)

    def leader_id(self) -> str | None:
        """The id of the live replica that says it leads (highest term wins), or None."""
        leader = self._replicas.leader()
        return leader.replica_id if leader is not None else None

    # --------------------------------------------------------------- lifecycle

    def __enter__(self) -> DevCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the replicas and workers and wait until they serve. Raises
        :class:`PortBusy` before starting anything when a fixed port is taken, and
        :class:`DevClusterError` when a process dies or a wait times out (the caller
        then calls :meth:`stop`, as ``with`` does)."""
        if self._started:
            raise DevClusterError("this cluster was already started")
        self._started = True
        if not self.options.ephemeral_ports:
            self._check_ports()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        for replica in self.replicas:
            replica.data_dir.mkdir(parents=True, exist_ok=True)
            self._launch(replica)
        self.wait_for_leader()
        racks = self._initial_racks()
        for rack in racks:
            self._start_worker(rack, self.options.gpus_per_worker)
        self._wait_workers_ready(list(self.workers))

    def stop(self) -> None:
        """Stop everything this cluster started; safe to call more than once."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        if self._client is not None:
            self._client.close()
            self._client = None
        try:
            # Workers first, while the replicas still run: their members get SIGTERM and
            # the stop grace. Then what the pid records name, then the replicas; the
            # launcher's close SIGKILLs whatever is left (groups and marked processes).
            self.launcher.stop_all(self.workers, self._stop_grace_s + 5.0)
            self._remember_member_groups()
            self._kill_recorded_members()
            self.launcher.stop_all(self.replicas, _REPLICA_STOP_S)
        finally:
            self.launcher.close()
        if self.owns_data_dir and not self.keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # ----------------------------------------------------------------- faults

    def kill_replica(self, replica_id: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL, SIGTERM or SIGINT) to a replica's process group and wait
        until it has exited (SIGKILL after a bounded wait)."""
        if sig not in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            raise ValueError(f"sig: {sig} does not end a process; use SIGKILL or SIGTERM")
        self.replica(replica_id).kill(sig, _KILL_WAIT_S)

    def restart_replica(self, replica_id: str) -> None:
        """Start a stopped replica again on its ports and data directory."""
        replica = self.replica(replica_id)
        if replica.alive:
            raise DevClusterError(f"replica {replica_id} is still running")
        self._launch(replica)
        replica.expect_running = True

    def add_worker(self, rack: str | None = None, gpus: int | None = None) -> DevWorker:
        """Start one more worker (in ``rack``, default the rack with the fewest workers)
        and wait until the control plane lists it as ready."""
        if len(self.workers) >= MAX_WORKERS:
            raise DevClusterError(f"at most {MAX_WORKERS} workers")
        if rack is None:
            counts = {f"r{i + 1}": 0 for i in range(self.options.racks)}
            for w in self.workers:
                counts[w.rack] = counts.get(w.rack, 0) + 1
            rack = min(counts, key=lambda k: (counts[k], int(k[1:]) if k[1:].isdigit() else 0))
        if not rack or any(c in rack for c in ",= "):
            raise DevClusterError(f"rack: {rack!r} is not a rack name (e.g. r3)")
        worker_gpus = self.options.gpus_per_worker if gpus is None else gpus
        if not 0 <= worker_gpus <= 64:
            raise DevClusterError(f"gpus: must be between 0 and 64, got {worker_gpus}")
        worker = self._start_worker(rack, worker_gpus)
        self._wait_workers_ready([worker])
        return worker

    def stop_worker(self, node_id: str) -> None:
        """Stop one worker gracefully (its members are stopped too)."""
        self.worker(node_id).stop(self._stop_grace_s + 5.0)

    # ---------------------------------------------------------------- waiting

    def wait_for_leader(self, timeout_s: float | None = None) -> str:
        """Wait until a leader serves writes (a leader-only read succeeds); its id."""

        limit = self.options.ready_timeout_s if timeout_s is None else timeout_s
        try:
            return self._replicas.serving_leader(limit, abort=self._abort).replica_id
        except LaunchError as exc:
            raise DevClusterError(str(exc)) from None

    def _wait_workers_ready(self, workers: list[DevWorker]) -> None:
        wanted = {w.node_id: w for w in workers}

        def probe() -> bool | None:
            with self.client(timeout_s=1.0) as client:
                nodes = {n.node_id: n for n in client.list_nodes()}
            ready = [
                nid
                for nid in wanted
                if nid in nodes and node_status(nodes[nid]) is NodeStatus.READY
            ]
            for nid in ready:
                wanted[nid].address = nodes[nid].address
            return True if len(ready) == len(wanted) else None

        names = ", ".join(wanted) or "no workers"
        self._wait(f"workers {names} to register", probe, None, list(workers))

    def _wait(
        self,
        what: str,
        probe: Callable[[], T | None],
        timeout_s: float | None,
        processes: list[DevWorker],
    ) -> T:
        """Wait for ``probe``, bounded by ``ready_timeout_s``; a :class:`DevClusterError`
        names what it waited for (with the watched logs) or which process exited."""
        limit = self.options.ready_timeout_s if timeout_s is None else timeout_s
        try:
            return wait_until(
                what,
                probe,
                limit,
                every_s=_POLL_S,
                watch=processes,
                retry_on=RPC_ERRORS,
                abort=self._abort,
            )
        except LaunchError as exc:
            raise DevClusterError(str(exc)) from None

    # --------------------------------------------------------------- internals

    def _check_ports(self) -> None:
        wanted: list[tuple[int, str]] = []
        for r in self.replicas:
            wanted.append((int(r.grpc.rpartition(":")[2]), f"gRPC of replica {r.replica_id}"))
            wanted.append((int(r.raft.rpartition(":")[2]), f"Raft of replica {r.replica_id}"))
        for i in range(self.options.workers):
            wanted.append((DEFAULT_WORKER_PORT_BASE + i, f"log service of worker w{i + 1}"))
        for port, role in wanted:
            if port_in_use(port):
                raise PortBusy(
                    f"{HOST}:{port} ({role}) is already in use; is another dev cluster "
                    "running? Stop it, or free the port"
                )

    def _initial_racks(self) -> list[str]:
        n, racks = self.options.workers, self.options.racks
        return [f"r{i * racks // n + 1}" for i in range(n)]

    def _start_worker(self, rack: str, gpus: int) -> DevWorker:
        index = len(self.workers) + 1
        node_id = worker_id(index)
        if self.options.ephemeral_ports:
            listen = f"{HOST}:0"
        else:
            port = DEFAULT_WORKER_PORT_BASE + index - 1
            if port_in_use(port):
                raise PortBusy(f"{HOST}:{port} (log service of worker {node_id}) is in use")
            listen = f"{HOST}:{port}"
        data = self.data_dir / "workers" / node_id
        worker = DevWorker(
            name=f"worker {node_id}",
            argv=[],
            log_path=self.logs_dir / f"worker-{node_id}.log",
            node_id=node_id,
            rack=rack,
            gpus=gpus,
            listen=listen,
            data_dir=data,
        )
        # The launcher adds the worker's certificate (or --insecure) and --run-as agent.
        prepared = self.launcher.worker(
            self.cluster_addresses,
            node_id,
            data,
            listen=listen,
            extra=[
                "--topology",
                worker.topology,
                "--mock-gpus",
                str(gpus),
                "--cpu",
                self.options.worker_cpu,
                "--memory",
                self.options.worker_memory,
                "--no-cgroups",  # capacities are declared, not measured, on a dev machine
                "--stop-grace",
                self.options.stop_grace,
            ],
        )
        worker.argv, worker.metrics = prepared.argv, prepared.metrics
        self.workers.append(worker)
        self._launch(worker)
        return worker

    def _launch(self, p: Process) -> None:
        if self._stopped:
            raise DevClusterError("this cluster was stopped")
        try:
            self.launcher.start(p)
        except LaunchError as exc:
            raise DevClusterError(str(exc)) from None

    def _member_records(self) -> Iterator[dict[str, object]]:
        for w in self.workers:
            members = w.data_dir / "members"
            if not members.is_dir():
                continue
            for name in ("shim.json", "member.json"):
                for path in members.glob(f"*/*/{name}"):
                    record = read_json(path)
                    if record is not None:
                        yield record

    def _remember_member_groups(self) -> None:
        for record in self._member_records():
            pid = record.get("pid")
            if isinstance(pid, int) and pid > 0:
                self.launcher.adopt(pid)  # shims and members each lead their own session

    def _kill_recorded_members(self) -> None:
        for record in self._member_records():
            kill_recorded_process(record)
