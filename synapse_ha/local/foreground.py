"""``synctl dev up``: a local dev cluster kept up in the foreground until a signal.

:func:`run_foreground` starts a :class:`~synapse_ha.local.devcluster.DevCluster`, prints
where it is (:func:`describe`), reports programs that exit, and stops everything on
SIGINT or SIGTERM, or when a majority of the replicas is gone.

Once the cluster serves, it writes the *dev profile*
(:func:`synapse_ha.client.credentials.write_dev_profile`): synctl and the Python client
of the same account then find the cluster and its admin credentials with no flag and no
variable; ``synctl dev env`` prints it as ``export`` lines. The profile is removed when
the cluster stops. One dev cluster runs per account: a second ``synctl dev up`` while a
live profile exists is refused. The replicas listen on 127.0.0.1:7101-7103 (7105) when
those ports are free, else on free ports, which the profile tells the clients.

The first line it prints after the start is the dashboard's address (the first
replica's, 127.0.0.1:7191 when free) and the file of the token to sign in with.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from synapse_ha.client.credentials import (
    DevProfile,
    dev_profile_path,
    read_dev_profile,
    remove_dev_profile,
    write_dev_profile,
)
from synapse_ha.local.devcluster import DevCluster, DevClusterError, PortBusy
from synapse_ha.local.devoptions import (
    DEFAULT_WORKER_PORT_BASE,
    FIVE_GRPC_PORTS,
    FIVE_RAFT_PORTS,
    DevClusterOptions,
)
from synapse_ha.local.ports import HOST, port_in_use
from synapse_ha.security.tls import INSECURE_WARNING

_Handler = Callable[[int, FrameType | None], Any] | int | None


def dashboard_line(cluster: DevCluster) -> str:
    """Where to open the dashboard (the first replica's) and how to sign in."""
    first = cluster.replicas[0].replica_id
    where = f"dashboard: {cluster.dashboard_url} (replica {first}'s; every replica serves one)"
    if cluster.credentials is None:
        return f"{where} — no sign-in (insecure)"
    token = cluster.credentials.admin_token_file
    return f"{where} — sign in with the admin token in {token}"


def moved_ports(cluster: DevCluster) -> list[str]:
    """A line for each program whose fixed /metrics port was taken."""
    programs = [(r.replica_id, r.name, r.metrics) for r in cluster.replicas]
    programs += [(w.node_id, w.name, w.metrics) for w in cluster.workers]
    lines = []
    for key, name, metrics in programs:
        preferred = cluster.preferred_metrics_ports.get(key, 0)
        if preferred and metrics != f"{HOST}:{preferred}":
            lines.append(f"{HOST}:{preferred} is in use: {name} serves on {metrics} instead")
    return lines


def describe(cluster: DevCluster) -> list[str]:
    """Lines describing a running cluster: the dashboard first, then replicas, workers,
    data, the export line."""
    leader = cluster.leader_id()
    scheme = "http" if cluster.credentials is None else "https"
    lines = [dashboard_line(cluster), *moved_ports(cluster), "replicas:"]
    for r in cluster.replicas:
        role = "leader" if r.replica_id == leader else "follower"
        lines.append(f"  {r.replica_id}  grpc {r.grpc}  raft {r.raft}  {role}")
        # Observability
        lines.append(
            f"      metrics {scheme}://{r.metrics}/metrics  dashboard {scheme}://{r.metrics}/"
        )
    lines.append("workers:")
    for w in cluster.workers:
        lines.append(
            f"  {w.node_id:<4} {w.gpus} GPU  {w.topology}  log service {w.address or w.listen}"
        )
        lines.append(f"      metrics {scheme}://{w.metrics}/metrics")
    if cluster.credentials is not None:
        lines.append(
            "metrics need a client certificate of the cluster CA; the dashboard signs in "
            "with a token (the admin token is in the credentials directory)"
        )
    lines.append(f"data and logs: {cluster.data_dir}")
    if cluster.credentials is not None:
        lines.append(f"credentials: {cluster.credentials.root} (CA, certificates, admin token)")
    else:
        lines.append(f"warning: {INSECURE_WARNING}")
    lines.append("")
    lines.append(
        "synctl and the Python client (synapse_ha.client.Cluster.from_env) of this account "
        "find it by themselves, as its admin; other shells and tools: "
        'eval "$(synctl dev env)", or:'
    )
    lines += cluster.exports()
    return lines


def profile_of(cluster: DevCluster) -> DevProfile:
    """What clients need to reach ``cluster`` as its admin (written as the dev profile)."""
    credentials = cluster.credentials
    return DevProfile(
        cluster=cluster.cluster,
        pid=os.getpid(),
        tls=None if credentials is None else credentials.client_tls(),
        token_file=None if credentials is None else credentials.admin_token_file,
    )


def busy_default_port(options: DevClusterOptions) -> str | None:
    """The first fixed port ``options`` needs that is in use, described; None when all
    are free (or the options ask for free ports anyway)."""
    if options.ephemeral_ports:
        return None
    n = options.replicas
    wanted = [*FIVE_GRPC_PORTS[:n], *FIVE_RAFT_PORTS[:n]]
    wanted += [DEFAULT_WORKER_PORT_BASE + i for i in range(options.workers)]
    busy = next((port for port in wanted if port_in_use(port)), None)
    return None if busy is None else f"{HOST}:{busy}"


def run_foreground(options: DevClusterOptions, out: Callable[[str], None]) -> int:
    """Start a cluster, print where it is, and keep it up until SIGINT or SIGTERM; then
    stop everything and return 0. Returns 2 (after printing why) when the options are
    invalid or a fixed port is busy, 1 when the cluster failed to start or a replica
    died while running."""
    running = read_dev_profile()
    if running is not None:
        out(
            f"error: a dev cluster is already running (synctl dev up, pid {running.pid}, "
            f"{running.cluster}); stop it first, or use it"
        )
        return 2
    busy = busy_default_port(options)
    if busy is not None:
        out(f"{busy} is in use: the replicas and workers listen on free ports instead")
        options = dataclasses.replace(options, ephemeral_ports=True)
    stop = threading.Event()
    previous = _stop_on_signals(stop)
    try:
        try:
            cluster = DevCluster(options, abort=stop)
        except ValueError as exc:
            out(f"error: {exc}")
            return 2
        if options.insecure:
            out(f"warning: {INSECURE_WARNING}")
        failed = _start(cluster, options, stop, out)
        if failed is not None:
            return failed
        try:
            for line in describe(cluster):
                out(line)
            _publish(cluster, out)
            out("")
            out("ready; press Ctrl-C to stop")
            code = _watch(cluster, stop, out)
            out("stopping ...")
        finally:
            remove_dev_profile(os.getpid())
            cluster.stop()
        out("stopped")
        return code
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def _publish(cluster: DevCluster, out: Callable[[str], None]) -> None:
    """Write the dev profile; a profile that cannot be written costs only the discovery
    (the export lines are printed), so it is a warning."""
    try:
        path = write_dev_profile(profile_of(cluster))
    except OSError as exc:
        out(f"warning: cannot write {dev_profile_path()}: {exc}; use the export lines above")
        return
    out(f"profile: {path} (removed when this cluster stops)")


def _stop_on_signals(stop: threading.Event) -> dict[signal.Signals, _Handler]:
    """Have SIGINT and SIGTERM set ``stop`` (in the main thread only); the handlers
    they had before."""
    previous: dict[signal.Signals, _Handler] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, lambda signum, frame: stop.set())
    return previous


def _start(
    cluster: DevCluster,
    options: DevClusterOptions,
    stop: threading.Event,
    out: Callable[[str], None],
) -> int | None:
    """Start ``cluster``; None once it serves, else the exit code (after stopping it
    and printing why)."""
    try:
        out(
            f"starting {options.replicas} replicas and {options.workers} worker(s) in "
            f"{options.racks} rack(s) on {HOST} ..."
        )
        cluster.start()
    except PortBusy as exc:
        cluster.stop()
        out(f"error: {exc}")
        return 2
    except DevClusterError as exc:
        keep = not stop.is_set()
        cluster.keep_data = cluster.keep_data or keep
        cluster.stop()
        if stop.is_set():
            out("interrupted; stopped everything")
            return 0
        out(f"error: {exc}")
        out(f"logs kept in {cluster.logs_dir}")
        return 1
    except BaseException:
        cluster.stop()
        raise
    return None


def _watch(cluster: DevCluster, stop: threading.Event, out: Callable[[str], None]) -> int:
    """Report programs that exit until ``stop`` is set (0) or a majority of the replicas
    is gone (1, keeping the data)."""
    reported: set[str] = set()
    while not stop.wait(1.0):
        for p in [*cluster.replicas, *cluster.workers]:
            if p.name not in reported and not p.alive:
                reported.add(p.name)
                out(f"warning: {p.name} exited; see {p.log_path}")
        if sum(not r.alive for r in cluster.replicas) > len(cluster.replicas) // 2:
            out("error: a majority of the replicas is gone; stopping")
            cluster.keep_data = True
            return 1
    return 0
