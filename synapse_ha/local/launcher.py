"""The one way this project starts its programs as real processes.

Used by the dev cluster (``synctl dev up``, the demo), the integration tests, the chaos
suite and the benchmarks. A :class:`Launcher` starts ``synapse-scheduler`` replicas,
``synapse-worker`` agents and any helper program, and owns every process it started:

* **Process groups.** Each program is started in a new session, so it leads a process
  group of its own; stopping it signals the whole group (the agent's member supervisors
  start sessions of their own and are handled by the marker sweep below).
* **Logs.** stdout and stderr go to one log file per process (appended across restarts);
  :meth:`Process.log_tail` reads its end for error messages.
* **A command prefix.** ``prefix`` is put before the program's argv, for example
  ``ip netns exec r1`` to run a replica inside a network namespace (``ip netns exec``
  execs the program, so the pid is the program's own).
* **A marker.** Every process gets ``SYNAPSE_LAUNCH_MARKER=<unique value>`` in its
  environment; everything it starts inherits it (members included, since the agent passes
  its environment on), so :meth:`Launcher.close` finds what is left whatever session or
  group it is in.
* **Bounded stops.** :meth:`Process.stop` sends SIGTERM to the group (after SIGCONT, so a
  paused program can act on it), waits ``grace_s`` and then SIGKILLs the group; every wait
  has a deadline. :meth:`Launcher.close` stops everything it started, then SIGKILLs every
  remaining group it knows and every process carrying its marker. It is idempotent and
  never raises because one process misbehaved, so it is safe in ``finally`` after any
  failure.
* **Bounded readiness waits.** :func:`wait_until` polls a probe until it answers, fails
  at once with :class:`ProcessExited` when a watched process dies, and raises
  :class:`WaitTimeout` (with the watched processes' log tails) at the deadline.
* **Held ports.** Loopback ports for programs that will listen on them are *held*
  (:class:`PortHolder`): a socket bound to the port but not listening stays open in the
  launcher until it closes. A program binds the port beside it (``SO_REUSEADDR``, which
  gRPC, pysyncobj and the HTTP servers set), and while the program is stopped for a
  restart no other socket can take the port: neither another bind nor the kernel's choice
  of a source port for an outgoing connection, which skips ports that are bound. A port
  merely probed free and closed again would be a port in the ephemeral range, free for
  any connection to take until the restarted program binds it.

* **Secure by default.** With ``credentials`` (a :class:`ClusterCredentials`), replicas
  and workers get their certificates (``--tls-*``), replicas the bootstrap admin token,
  and the launcher's own calls present the admin user's certificate; without, every
  program runs with ``--insecure``. Workers run members as the agent's user
  (``--run-as agent``): job owners have no local accounts on a development machine.

Programs run as ``python -m synapse_ha.programs.scheduler`` / ``...worker`` with this
interpreter; nothing here imports them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.security.bundle import ClusterCredentials, new_raft_password
from synapse_ha.security.tls import Transport
from synapse_ha.worker.members import running_groups

T = TypeVar("T")

HOST = "127.0.0.1"
MARKER_VARIABLE = "SYNAPSE_LAUNCH_MARKER"
RAFT_PASSWORD_VARIABLE = "SYNAPSE_RAFT_PASSWORD"
# What a readiness probe over gRPC may raise while a program is still starting.
RPC_ERRORS: tuple[type[BaseException], ...] = (grpc.RpcError, ClusterUnavailable, OSError)
SCHEDULER_MODULE = "synapse_ha.programs.scheduler"
WORKER_MODULE = "synapse_ha.programs.worker"

DEFAULT_STOP_GRACE_S = 3.0
KILL_WAIT_S = 5.0  # bound on reaping a SIGKILLed process
_POLL_S = 0.05


class LaunchError(Exception):
    """A program could not be started or did not become ready; the message says why."""


class ProcessExited(LaunchError):
    """A process that should be running has exited."""

    def __init__(self, process: Process) -> None:
        code = process.returncode
        super().__init__(
            f"{process.name} exited with code {code}; its log {process.log_path} ends with:\n"
            f"{process.log_tail()}"
        )
        self.process = process
        self.returncode = code


class WaitTimeout(LaunchError):
    """A bounded wait for readiness ran out."""


# ------------------------------------------------------------------ processes


@dataclass
class Process:
    """One program: its command, its log, and (once started) its OS process.

    ``pid`` is also the id of the process group the program leads. ``expect_running`` is
    False once the process was stopped or killed on purpose, so waits do not report it.
    """

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None  # the whole environment (None: the launcher's)
    prefix: list[str] = field(default_factory=list)  # e.g. ["ip", "netns", "exec", "r1"]
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    expect_running: bool = True

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:]

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group, if the process has not been reaped."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def signal_process(self, sig: int) -> None:
        """Send ``sig`` to the program's own process only (not the rest of its group)."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the program only: its children (member supervisors) keep running, as
        they would beside a frozen program."""
        if self.alive:
            self.signal_process(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        self.signal_process(signal.SIGCONT)
        self.paused = False

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit; whether it has."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self, sig: int = signal.SIGKILL, wait_s: float = KILL_WAIT_S) -> None:
        """Send ``sig`` to the group and wait (bounded) until the process has exited;
        SIGKILL the group when it is still there after ``wait_s``. Marks the process as
        not expected to run."""
        self.expect_running = False
        if self.process is None:
            return
        if sig != signal.SIGKILL:
            self.signal_group(signal.SIGCONT)
        self.signal_group(sig)
        if not self.wait(wait_s):
            self.signal_group(signal.SIGKILL)
            self.wait(KILL_WAIT_S)
        self.paused = False

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """A graceful stop, bounded: SIGTERM to the group, SIGKILL after ``grace_s``."""
        self.kill(signal.SIGTERM, wait_s=grace_s)


@dataclass
class Replica(Process):
    """A ``synapse-scheduler`` replica."""

    replica_id: str = ""
    raft: str = ""  # host:port of its Raft traffic
    grpc: str = ""  # host:port of its gRPC API
    data_dir: Path = field(default_factory=Path)
    metrics: str = ""  # host:port of /metrics and the dashboard (port 0: see its status)


@dataclass
class Worker(Process):
    """A ``synapse-worker`` agent."""

    node_id: str = ""
    data_dir: Path = field(default_factory=Path)
    metrics: str = ""  # host:port of its /metrics (port 0: chosen by the worker)


def metrics_address(host: str, ports: PortHolder | None = None) -> str:
    """Where a program on ``host`` serves /metrics. Port 0 (the program picks a free one
    and reports it: a replica in its status) unless ``ports`` is given: then, on
    loopback, a port held by ``ports``, so that the URL is known before the program
    starts and stays the same across restarts."""
    if ports is None or host != HOST:
        return f"{host}:0"
    return f"{host}:{ports.reserve(1, host)[0]}"


@dataclass(frozen=True)
class Peer:
    """One replica's identity and addresses, as every replica's ``--replica`` names it."""

    replica_id: str
    raft: str
    grpc: str

    @property
    def flag(self) -> str:
        return f"{self.replica_id}={self.raft},{self.grpc}"


def scheduler_argv(
    me: Peer, peers: Sequence[Peer], data_dir: Path, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of one replica of the cluster formed by ``peers``."""
    argv = [sys.executable, "-m", SCHEDULER_MODULE, "--id", me.replica_id]
    for peer in peers:
        argv += ["--replica", peer.flag]
    return [*argv, "--data-dir", str(data_dir), *extra]


def worker_argv(
    schedulers: Sequence[str], node_id: str, listen: str, data_dir: Path, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of one worker agent reporting to the replicas at ``schedulers``."""
    return [
        sys.executable,
        "-m",
        WORKER_MODULE,
        "--scheduler",
        ",".join(schedulers),
        "--node-id",
        node_id,
        "--listen",
        listen,
        "--data-dir",
        str(data_dir),
        *extra,
    ]


def loopback_peers(
    ids: Sequence[str],
    host: str = HOST,
    grpc_ports: Sequence[int] | None = None,
    raft_ports: Sequence[int] | None = None,
    *,
    holder: PortHolder | None = None,
) -> list[Peer]:
    """Peers on ``host``; ports left out are held by ``holder`` (by default for the
    life of this process, see :func:`reserve_ports`)."""
    if grpc_ports is None or raft_ports is None:
        ports = (holder or _PROCESS_PORTS).reserve(2 * len(ids), host)
        grpc_ports = grpc_ports if grpc_ports is not None else ports[: len(ids)]
        raft_ports = raft_ports if raft_ports is not None else ports[len(ids) :]
    return [
        Peer(rid, f"{host}:{raft}", f"{host}:{gport}")
        for rid, gport, raft in zip(ids, grpc_ports, raft_ports, strict=True)
    ]


# ------------------------------------------------------------------- launcher


class Launcher:
    """Starts processes and stops every one of them on :meth:`close`.

    ``env`` is the base environment of every process (default: this process's); a
    process's own ``env`` replaces it. The marker variable is added to both. ``logs_dir``
    holds the log of a process started without an explicit log path.

    Thread-safety: :meth:`start` and :meth:`close` may be called from any thread; once
    :meth:`close` has begun, :meth:`start` raises :class:`LaunchError`.
    """

    def __init__(
        self,
        logs_dir: Path,
        env: Mapping[str, str] | None = None,
        credentials: ClusterCredentials | None = None,
        fixed_metrics_ports: bool = False,
    ) -> None:
        self.logs_dir = logs_dir
        self.credentials = credentials
        self.fixed_metrics_ports = fixed_metrics_ports  # see metrics_address
        # Ports of the programs started here, held until close (see PortHolder).
        self.ports = PortHolder()
        self.env = dict(os.environ if env is None else env)
        self.marker = uuid.uuid4().hex
        self.processes: list[Process] = []
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def groups(self) -> set[int]:
        """Every process group this launcher started, plus those given to :meth:`adopt`."""
        with self._lock:
            return set(self._groups)

    def adopt(self, pgid: int) -> None:
        """Have :meth:`close` SIGKILL group ``pgid`` too (e.g. a member's supervisor)."""
        with self._lock:
            self._groups.add(pgid)

    def process(
        self,
        name: str,
        argv: list[str],
        *,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> Process:
        """Start a helper program (a sink, a load generator) and return it."""
        p = Process(
            name,
            argv,
            log_path or self.logs_dir / f"{name}.log",
            env=None if env is None else dict(env),
            prefix=list(prefix),
        )
        return self.start(p)

    def replica(
        self,
        me: Peer,
        peers: Sequence[Peer],
        data_dir: Path,
        *,
        extra: Sequence[str] = (),
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
        name: str | None = None,
    ) -> Replica:
        """A replica of the cluster ``peers``, prepared but not started (see :meth:`start`)."""
        if self.credentials is None:
            security = ["--insecure"]
        else:
            security = [
                *self.credentials.tls_args(self.credentials.replica_tls(me.replica_id)),
                "--bootstrap-token-file",
                str(self.credentials.admin_token_file),
            ]
        metrics = metrics_address(me.grpc.rpartition(":")[0], self._fixed_ports())
        # Heartbeat streams: a port the replica picks and tells workers.
        streams = ["--agent-address", f"{me.grpc.rpartition(':')[0]}:0"]
        return Replica(
            metrics=metrics,
            name=name or f"replica {me.replica_id}",
            argv=scheduler_argv(
                me, peers, data_dir, [*security, "--metrics-address", metrics, *streams, *extra]
            ),
            log_path=log_path or self.logs_dir / f"{me.replica_id}.log",
            env=None if env is None else dict(env),
            prefix=list(prefix),
            replica_id=me.replica_id,
            raft=me.raft,
            grpc=me.grpc,
            data_dir=data_dir,
        )

    def _fixed_ports(self) -> PortHolder | None:
        return self.ports if self.fixed_metrics_ports else None

    def worker(
        self,
        schedulers: Sequence[str],
        node_id: str,
        data_dir: Path,
        *,
        listen: str = f"{HOST}:0",
        extra: Sequence[str] = (),
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
        name: str | None = None,
    ) -> Worker:
        """A worker agent, prepared but not started (see :meth:`start`)."""
        security = (
            ["--insecure"]
            if self.credentials is None
            else self.credentials.tls_args(self.credentials.worker_tls(node_id))
        )
        run_as = [] if "--run-as" in extra else ["--run-as", "agent"]
        metrics = metrics_address(listen.rpartition(":")[0], self._fixed_ports())
        observe = ["--metrics-address", metrics]
        return Worker(
            metrics=metrics,
            name=name or f"worker {node_id}",
            argv=worker_argv(
                schedulers, node_id, listen, data_dir, [*security, *run_as, *observe, *extra]
            ),
            log_path=log_path or self.logs_dir / f"{node_id}.log",
            env=None if env is None else dict(env),
            prefix=list(prefix),
            node_id=node_id,
            data_dir=data_dir,
        )

    def start(self, p: T_Process) -> T_Process:
        """Start ``p`` (again, after it exited) in a session of its own, its output
        appended to its log. Raises :class:`LaunchError` once the launcher is closed or
        while ``p`` still runs."""
        # Under the lock, so that no process starts once close() has begun.
        with self._lock:
            if self._closed:
                raise LaunchError(f"cannot start {p.name}: the launcher was closed")
            if p.alive:
                raise LaunchError(f"{p.name} is already running")
            env = dict(self.env if p.env is None else p.env)
            env[MARKER_VARIABLE] = self.marker
            p.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(p.log_path, "ab") as log:
                p.process = subprocess.Popen(
                    [*p.prefix, *p.argv],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    env=env,
                )
            p.paused = False
            p.expect_running = True
            if not any(q is p for q in self.processes):
                self.processes.append(p)
            self._groups.add(p.process.pid)
        return p

    def stop_all(self, processes: Iterable[Process], grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """Stop several processes at once: SIGTERM to every group, one shared grace,
        then SIGKILL for whatever is left; bounded."""
        chosen = [p for p in processes if p.process is not None]
        for p in chosen:
            p.expect_running = False
            p.signal_group(signal.SIGCONT)
            p.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.alive for p in chosen):
            time.sleep(_POLL_S)
        for p in chosen:
            p.kill(signal.SIGKILL)

    def marked(self) -> list[int]:
        """Pids of live processes that carry this launcher's marker."""
        return processes_with_env(MARKER_VARIABLE, self.marker)

    def close(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """Stop everything this launcher started: its processes (SIGTERM, then SIGKILL
        after ``grace_s``), every group it knows, then every process carrying its marker.
        Idempotent; bounded; errors of one process do not keep the others running."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            processes = list(self.processes)
        try:
            self.stop_all(processes, grace_s)
        finally:
            self._sweep()
            self.ports.release()

    def _sweep(self) -> None:
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            groups = self.groups & running_groups()
            pids = self.marked()
            if not groups and not pids:
                return
            if time.monotonic() >= deadline:
                return
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_S)


T_Process = TypeVar("T_Process", bound=Process)


# ------------------------------------------------------------------ replicas


class LocalReplicas:
    """The replicas of one control plane, started and stopped together.

    ``peers`` default to ``size`` replicas ``r1``, ``r2``, ... on free loopback ports.
    Replica ``id`` keeps its data in ``data_root/id`` and logs to ``logs_dir`` under
    ``log_name`` (``{id}`` is replaced). The Raft password (random unless given) reaches
    the replicas only through their environment. With a ``launcher`` of the caller's,
    :meth:`close` stops the replicas only; otherwise it closes its own launcher.
    """

    def __init__(
        self,
        root: Path,
        size: int = 3,
        extra_args: Sequence[str] = (),
        *,
        insecure: bool = False,
        peers: Sequence[Peer] | None = None,
        data_root: Path | None = None,
        logs_dir: Path | None = None,
        log_name: str = "{id}.log",
        password: str | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.extra_args = list(extra_args)
        self.password = password or new_raft_password()
        self._owns_launcher = launcher is None
        self.launcher = launcher or Launcher(logs_dir or root)
        ids = [f"r{i + 1}" for i in range(size)]
        self.peers = list(peers or loopback_peers(ids, holder=self.launcher.ports))
        if self.launcher.credentials is None and not insecure:
            self.launcher.credentials = ClusterCredentials.ensure(root / "credentials")
        self.credentials = self.launcher.credentials
        # The launcher's own calls: as the admin user, by certificate.
        self.transport = Transport(
            None if self.credentials is None else self.credentials.admin_tls()
        )
        data_root = data_root or root
        logs_dir = logs_dir or self.launcher.logs_dir
        env = {**self.launcher.env, RAFT_PASSWORD_VARIABLE: self.password}
        self.replicas: list[Replica] = [
            self.launcher.replica(
                peer,
                self.peers,
                data_root / peer.replica_id,
                extra=self.extra_args,
                log_path=logs_dir / log_name.format(id=peer.replica_id),
                env=env,
            )
            for peer in self.peers
        ]

    # ---------------------------------------------------------------- processes

    def start(self, replica: Replica | None = None) -> None:
        """Start one replica (again), or every replica; returns at once (see
        :meth:`serving_leader`)."""
        for r in [replica] if replica else self.replicas:
            r.data_dir.mkdir(parents=True, exist_ok=True)
            self.launcher.start(r)

    def kill(self, replica: Replica, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the replica's group and wait until it has exited (SIGKILL
        after a bounded wait)."""
        replica.kill(sig)

    def close(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """Stop every replica (and, with its own launcher, everything it started)."""
        if self._owns_launcher:
            self.launcher.close(grace_s)
        else:
            self.launcher.stop_all(self.replicas, grace_s)

    def logs(self, chars: int = 4000) -> str:
        return "\n".join(f"----- {r.replica_id} -----\n{r.log_tail(chars)}" for r in self.replicas)

    # ------------------------------------------ membership and backup

    def add_replica(self, replica_id: str, extra: Sequence[str] | None = None) -> Replica:
        """A new replica on free loopback ports, prepared but not started, knowing every
        peer so far and itself; it gets its own certificate. By default it runs with the
        cluster's extra arguments and ``--join``. Make it a member with
        ``client().add_replica(...)`` before or after starting it."""
        if any(p.replica_id == replica_id for p in self.peers):
            raise LaunchError(f"replica {replica_id!r} exists already")
        (peer,) = loopback_peers([replica_id], holder=self.launcher.ports)
        self.peers.append(peer)
        first = self.replicas[0]
        replica = self.launcher.replica(
            peer,
            self.peers,
            first.data_dir.parent / replica_id,
            extra=[*self.extra_args, "--join"] if extra is None else extra,
            log_path=first.log_path.parent
            / first.log_path.name.replace(first.replica_id, replica_id),
            env=first.env,
        )
        self.replicas.append(replica)
        return replica

    # ------------------------------------------------------------------- access

    @property
    def grpc_addresses(self) -> list[str]:
        return [r.grpc for r in self.replicas]

    def replica(self, replica_id: str) -> Replica:
        for r in self.replicas:
            if r.replica_id == replica_id:
                return r
        ids = [r.replica_id for r in self.replicas]
        raise LaunchError(f"no replica {replica_id!r} (replicas are {ids})")

    def client(
        self,
        timeout_s: float = 10.0,
        per_try_timeout_s: float = 2.0,
        *,
        token: str | None = None,
        transport: Transport | None = None,
    ) -> ClusterClient:
        """A new client of these replicas; the caller closes it. By default it is the
        admin (by certificate); with ``token`` it is that token's user (over the
        transport-only client certificate unless ``transport`` is given)."""
        if transport is None:
            transport = self.transport
            if token is not None and self.credentials is not None:
                transport = Transport(self.credentials.client_tls())
        return ClusterClient(
            self.grpc_addresses,
            timeout_s=timeout_s,
            per_try_timeout_s=per_try_timeout_s,
            token=token,
            channel_factory=transport.channel,
        )

    def channel(self, address: str) -> grpc.Channel:
        """A channel to ``address`` as the admin (the caller closes it)."""
        return self.transport.channel(address)

    def local_status(self, replica: Replica, timeout_s: float = 1.0) -> pb.ReplicaStatus:
        """The replica's own view of itself (raises ``grpc.RpcError`` when it is down)."""
        return replica_status(replica.grpc, timeout_s, self.transport)

    def leader(self) -> Replica | None:
        """The running replica that says it leads (the highest term wins), or None."""
        best: tuple[int, Replica] | None = None
        for r in self.replicas:
            if not r.alive or r.paused:
                continue
            try:
                status = self.local_status(r)
            except grpc.RpcError:
                continue
            if status.role == "leader" and (best is None or status.term > best[0]):
                best = (status.term, r)
        return best[1] if best else None

    def serving_leader(
        self, timeout_s: float = 15.0, *, abort: threading.Event | None = None
    ) -> Replica:
        """Wait (bounded) until exactly one running replica says it leads and it answers
        a leader-only read; that replica. Fails early when a replica expected to run
        has exited."""

        def probe() -> Replica | None:
            leaders = []
            for r in self.replicas:
                if not r.alive or r.paused:
                    continue
                with contextlib.suppress(grpc.RpcError):
                    if self.local_status(r).role == "leader":
                        leaders.append(r)
            if len(leaders) != 1:
                return None
            with self.channel(leaders[0].grpc) as channel:
                stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
                stub.ListNodes(pb.ListNodesRequest(), timeout=1.0)
            return leaders[0]

        return wait_until(
            "a serving leader",
            probe,
            timeout_s,
            every_s=0.05,
            watch=self.replicas,
            retry_on=RPC_ERRORS,
            abort=abort,
        )

    def followers(self, leader: Replica) -> list[Replica]:
        return [r for r in self.replicas if r is not leader and r.alive]


def replica_status(
    address: str, timeout_s: float = 1.0, transport: Transport | None = None
) -> pb.ReplicaStatus:
    """What the replica at ``address`` says about itself (``grpc.RpcError`` when down)."""
    with (transport or Transport.insecure()).channel(address) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.GetClusterStatus(
            pb.GetClusterStatusRequest(local_only=True), timeout=timeout_s
        )
    status: pb.ReplicaStatus = answer.replicas[0]
    return status


# ------------------------------------------------------------------- waiting


def wait_until(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float,
    *,
    every_s: float = 0.1,
    watch: Sequence[Process] = (),
    retry_on: tuple[type[BaseException], ...] = (OSError,),
    abort: threading.Event | None = None,
) -> T:
    """Call ``probe`` until it returns something other than None or False; return that.

    Exceptions of the types in ``retry_on`` count as "not yet". Raises
    :class:`ProcessExited` as soon as a process in ``watch`` that is expected to run has
    exited, :class:`WaitTimeout` after ``timeout_s`` (naming ``what``, the last error and
    the end of the watched processes' logs), and :class:`LaunchError` when ``abort`` is set.
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        if abort is not None and abort.is_set():
            raise LaunchError(f"interrupted while waiting for {what}")
        for p in watch:
            if p.expect_running and p.process is not None and p.process.poll() is not None:
                raise ProcessExited(p)
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except retry_on as exc:
            last = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        if time.monotonic() >= deadline:
            break
        if abort is not None:
            abort.wait(every_s)
        else:
            time.sleep(every_s)
    tails = "".join(f"\n--- {p.log_path} ---\n{p.log_tail(1200)}" for p in watch)
    raise WaitTimeout(
        f"timed out after {timeout_s:g}s waiting for {what} (last error: {last or 'none'})" + tails
    )


# --------------------------------------------------------------------- ports


class PortHolder:
    """Loopback ports held for programs that will listen on them.

    :meth:`reserve` binds a socket with ``SO_REUSEADDR`` to port 0 of the host and keeps
    it open without listening. The kernel gives it a port no other socket is bound to,
    and while it is open:

    * a program that binds the port with ``SO_REUSEADDR`` (gRPC servers, pysyncobj's
      Raft server, Python's HTTP servers) can listen on it, stop, and listen again;
    * no other bind without that option and no bind to port 0 gets it, and no outgoing
      connection is given it as its source port: the kernel skips bound ports when it
      picks one. A stopped replica's port cannot be taken before its restart;
    * a connection to it is refused (nothing listens), as to a closed port.

    :meth:`release` closes the sockets. Thread-safe.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], socket.socket] = {}
        self._lock = threading.Lock()

    def reserve(self, n: int, host: str = HOST) -> list[int]:
        """``n`` distinct ports on ``host``, held until :meth:`release`."""
        taken: list[socket.socket] = []
        try:
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                taken.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, 0))
        except BaseException:
            for s in taken:
                s.close()
            raise
        ports = [s.getsockname()[1] for s in taken]
        with self._lock:
            for port, s in zip(ports, taken, strict=True):
                self._held[(host, port)] = s
        return ports

    def held(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._held)

    def release(self, ports: Iterable[int] | None = None, host: str = HOST) -> None:
        """Stop holding ``ports`` of ``host`` (every port held, when None)."""
        with self._lock:
            keys = list(self._held) if ports is None else [(host, p) for p in ports]
            for key in keys:
                s = self._held.pop(key, None)
                if s is not None:
                    s.close()


# Ports asked for without a launcher: held for the life of this process.
_PROCESS_PORTS = PortHolder()


def reserve_ports(n: int, host: str = HOST) -> list[int]:
    """``n`` distinct ports on ``host`` held for the life of this process: nothing but a
    program binding them with ``SO_REUSEADDR`` can use them, and a connection to one is
    refused until a program listens on it. See :class:`PortHolder`; a
    :class:`Launcher`'s ports are released when it closes."""
    return _PROCESS_PORTS.reserve(n, host)


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether something listens on (or holds) ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


# ------------------------------------------------------------- finding processes


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment has ``name=value``.

    Processes whose environment cannot be read (another user's) are skipped.
    """
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry.name}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        state = stat[stat.rfind(")") + 2 :].split()[:1]
        if needle in environ.split(b"\0") and state not in (["Z"], ["X"]):
            found.append(int(entry.name))
    return found
