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
  environment; everything it starts inherits it (members included: workers pass it on
  to their members with ``--member-env-passthrough``), so :meth:`Launcher.close` finds
  what is left whatever session or group it is in.
* **Bounded stops.** :meth:`Launcher.close` stops everything it started (see
  :mod:`synapse_ha.local.process`), then SIGKILLs every remaining group it knows and every
  process carrying its marker. It is idempotent and never raises because one process
  misbehaved, so it is safe in ``finally`` after any failure.
* **Held ports.** The loopback ports of the programs it starts are held by its
  :class:`~synapse_ha.local.ports.PortHolder` until it closes, so a program stopped for a
  restart finds its ports free.
* **Secure by default.** With ``credentials`` (a :class:`ClusterCredentials`), replicas
  and workers get their certificates (``--tls-*``) and replicas the bootstrap admin
  token; without, every program runs with ``--insecure``. Workers run members as the
  agent's user (``--run-as agent``): job owners have no local accounts on a development
  machine.

Readiness waits are in :mod:`synapse_ha.local.waiting`, command lines in
:mod:`synapse_ha.local.commands`, the replicas of a control plane in
:mod:`synapse_ha.local.replicas`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from synapse_ha.local.commands import Peer, metrics_address, scheduler_argv, worker_argv
from synapse_ha.local.ports import HOST, PortHolder
from synapse_ha.local.process import (
    DEFAULT_STOP_GRACE_S,
    KILL_WAIT_S,
    LaunchError,
    Process,
    Replica,
    Worker,
    processes_with_env,
)
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.worker.procgroup import running_groups

MARKER_VARIABLE = "SYNAPSE_LAUNCH_MARKER"
_POLL_S = 0.05

T_Process = TypeVar("T_Process", bound=Process)


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
        # With fixed ports: the port a program (by replica id or node id) gets when free.
        self.preferred_metrics_ports: dict[str, int] = {}
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
        preferred = self.preferred_metrics_ports.get(me.replica_id, 0)
        metrics = metrics_address(me.grpc.rpartition(":")[0], self._fixed_ports(), preferred)
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
        preferred = self.preferred_metrics_ports.get(node_id, 0)
        metrics = metrics_address(listen.rpartition(":")[0], self._fixed_ports(), preferred)
        observe = ["--metrics-address", metrics]
        # Members get none of the agent's variables but those named: the marker is one.
        marker = ["--member-env-passthrough", MARKER_VARIABLE]
        return Worker(
            metrics=metrics,
            name=name or f"worker {node_id}",
            argv=worker_argv(
                schedulers,
                node_id,
                listen,
                data_dir,
                [*security, *run_as, *observe, *marker, *extra],
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
