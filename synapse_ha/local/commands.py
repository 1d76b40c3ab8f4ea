"""The command lines of ``synapse-scheduler`` replicas and ``synapse-worker`` agents.

Programs run as ``python -m synapse_ha.programs.scheduler`` / ``...worker`` with this
interpreter; nothing here imports them. A replica is named to its peers by a
:class:`Peer` (its id and its Raft and gRPC addresses).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from synapse_ha.local.ports import HOST, PortHolder, reserve_ports

SCHEDULER_MODULE = "synapse_ha.programs.scheduler"
WORKER_MODULE = "synapse_ha.programs.worker"


def metrics_address(host: str, ports: PortHolder | None = None, preferred: int = 0) -> str:
    """Where a program on ``host`` serves /metrics (and a replica its dashboard). Port 0
    (the program picks a free one and reports it: a replica in its status) unless
    ``ports`` is given: then, on loopback, a port held by ``ports``, so that the URL is
    known before the program starts and stays the same across restarts: ``preferred``
    when it is free (the same URL from one run to the next), else a free one."""
    if ports is None or host != HOST:
        return f"{host}:0"
    return f"{host}:{ports.reserve_preferred(preferred, host)}"


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
        n = 2 * len(ids)
        ports = holder.reserve(n, host) if holder is not None else reserve_ports(n, host)
        grpc_ports = grpc_ports if grpc_ports is not None else ports[: len(ids)]
        raft_ports = raft_ports if raft_ports is not None else ports[len(ids) :]
    return [
        Peer(rid, f"{host}:{raft}", f"{host}:{gport}")
        for rid, gport, raft in zip(ids, grpc_ports, raft_ports, strict=True)
    ]
