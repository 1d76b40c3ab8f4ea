"""``synctl dev up``: a local dev cluster kept up in the foreground until a signal.

:func:`run_foreground` starts a :class:`~synapse_ha.local.devcluster.DevCluster`, prints
where it is (:func:`describe`, ending with the ``export`` lines that point ``synctl`` at
it as its admin), reports programs that exit, and stops everything on SIGINT or SIGTERM,
or when a majority of the replicas is gone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from synapse_ha.local.devcluster import DevCluster, DevClusterError, PortBusy
from synapse_ha.local.devoptions import DevClusterOptions
from synapse_ha.local.ports import HOST
from synapse_ha.security.tls import INSECURE_WARNING

_Handler = Callable[[int, FrameType | None], Any] | int | None


def describe(cluster: DevCluster) -> list[str]:
    """Lines describing a running cluster: replicas, workers, data, the export line."""
    leader = cluster.leader_id()
    scheme = "http" if cluster.credentials is None else "https"
    lines = ["replicas:"]
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
    lines.append("point synctl at it (as the cluster admin):")
    lines += cluster.exports()
    return lines


def run_foreground(options: DevClusterOptions, out: Callable[[str], None]) -> int:
    """Start a cluster, print where it is, and keep it up until SIGINT or SIGTERM; then
    stop everything and return 0. Returns 2 (after printing why) when the options are
    invalid or a fixed port is busy, 1 when the cluster failed to start or a replica
    died while running."""
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
            out("")
            out("ready; press Ctrl-C to stop")
            code = _watch(cluster, stop, out)
            out("stopping ...")
        finally:
            cluster.stop()
        out("stopped")
        return code
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


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
