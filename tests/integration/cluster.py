"""Real synapse-scheduler processes on 127.0.0.1 for integration tests.

Processes are started by :mod:`synapse_ha.local.launcher` (own process group, log file,
free ports, bounded waits, a close that stops everything); this module adds what the
tests share: a fixed Raft password, ``wait_for`` and request builders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
from click.testing import CliRunner, Result

from synapse_ha.cli.main import cli
from synapse_ha.client import Cluster
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import NodeStatus
from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.process import Replica
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.local.waiting import RPC_ERRORS, wait_until
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import node_status

__all__ = [
    "LocalCluster",
    "Replica",
    "job_spec",
    "one_worker_cluster",
    "pausable_cluster",
    "register_request",
    "reserve_ports",
    "wait_for",
]

T = TypeVar("T")
PASSWORD = "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="


def wait_for(
    what: str, probe: Callable[[], T | None], timeout_s: float = 15.0, every_s: float = 0.05
) -> T:
    """Call ``probe`` until it returns something other than None/False; bounded."""
    return wait_until(what, probe, timeout_s, every_s=every_s, retry_on=RPC_ERRORS)


@contextlib.contextmanager
def pausable_cluster(
    root: Path, extra_args: Sequence[str] = (), leader_timeout_s: float = 60.0
) -> Iterator[LocalCluster]:
    """Three replicas started and leading; on the way out every replica a test paused
    (SIGSTOP) is resumed first, so that it can be stopped."""
    c = LocalCluster(root, extra_args=extra_args)
    try:
        c.start()
        c.serving_leader(timeout_s=leader_timeout_s)
        yield c
    finally:
        for r in c.replicas:
            if r.process is not None and r.process.poll() is None:
                os.killpg(r.process.pid, signal.SIGCONT)
        c.close()


class LocalCluster(LocalReplicas):
    """Replicas ``r1``..``rN`` on free loopback ports, data and logs under ``root``."""

    def __init__(self, root: Path, size: int = 3, extra_args: Sequence[str] = ()) -> None:
        super().__init__(root, size, extra_args, password=PASSWORD)

    def stub(self, replica: Replica) -> pb_grpc.SchedulerServiceStub:
        return pb_grpc.SchedulerServiceStub(self.channel(replica.grpc))  # type: ignore[no-untyped-call]


def job_spec(name: str = "train", replicas: int = 1, gpu: int = 0) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=replicas,
        resources=pb.Resources(cpu_milli=1000, memory_mib=1024, gpu=gpu),
        shell_command="echo $RANK",
    )


def register_request(node_id: str, host: str, gpu: int = 8) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=node_id,
        address=f"{host}:7070",
        capacity=pb.Resources(cpu_milli=64_000, memory_mib=512 * 1024, gpu=gpu),
        gpu_islands=[pb.RegisterNodeRequest.GpuIsland(gpus=list(range(gpu)))] if gpu else [],
        topology=[pb.TopologyLabel(level="rack", value="r1")],
    )


@contextlib.contextmanager
def one_worker_cluster(
    prefix: str, worker_flags: Sequence[str], replica_flags: Sequence[str] = ()
) -> Iterator[tuple[LocalCluster, ClusterClient]]:
    """One replica and one worker ``w1`` (``worker_flags``), the worker ready (the serving
    leader already raised the cluster's format); everything stopped and removed on the way
    out."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = LocalCluster(root / "cluster", size=1, extra_args=replica_flags)
    client: ClusterClient | None = None
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        client = c = cluster.client(timeout_s=30.0)
        worker = cluster.launcher.worker(
            cluster.grpc_addresses, "w1", root / "w1", extra=list(worker_flags)
        )
        cluster.launcher.start(worker)
        wait_for(
            "w1 ready",
            lambda: any(
                n.node_id == "w1" and node_status(n) is NodeStatus.READY for n in c.list_nodes()
            ),
            30.0,
        )
        yield cluster, client
    finally:
        if client is not None:
            client.close()
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def python_client_cluster(prefix: str) -> Iterator[LocalCluster]:
    """:func:`one_worker_cluster` with a worker for small CPU gangs (no GPUs, no cgroups,
    a short stop grace), for the Python client's tests."""
    flags = ["--mock-gpus", "0", "--no-cgroups", "--stop-grace", "1s"]
    with one_worker_cluster(prefix, flags) as (cluster, _):
        yield cluster


@contextlib.contextmanager
def admin_python_client(local: LocalCluster) -> Iterator[Cluster]:
    """The Python client of ``local``, as its admin (by certificate)."""
    assert local.credentials is not None
    with Cluster(local.grpc_addresses, tls=local.credentials.admin_tls(), timeout_s=30) as c:
        yield c


# Per member: the small CPU gang the Python client's tests run.
SMALL = {"gpu": 0, "cpu": "100m", "memory": "64Mi"}


def small_spec(name: str, command: str) -> dict[str, object]:
    """A one-member job spec (as a mapping) of :data:`SMALL` running ``command``."""
    return {"name": name, "replicas": 1, "resources": SMALL, "command": command}


def synctl(local: LocalCluster, *args: str) -> Result:
    """``synctl --cluster <local's replicas> ARGS`` run in process as ``local``'s admin."""
    creds = local.credentials
    assert creds is not None
    tls = creds.admin_tls()
    env = {"SYNAPSE_CA": str(tls.ca), "SYNAPSE_CERT": str(tls.cert), "SYNAPSE_KEY": str(tls.key)}
    addresses = ",".join(local.grpc_addresses)
    return CliRunner().invoke(cli, ["--cluster", addresses, "--timeout", "20", *args], env=env)


def membership_change(call: Callable[[], pb.MembershipResponse]) -> pb.MembershipResponse:
    """The answer of a membership change that must go through, retried (bounded) while
    the leader judges it unsafe for now: on a loaded machine a live replica may briefly
    look unreachable or behind to the leader."""

    def attempt() -> pb.MembershipResponse | None:
        try:
            return call()
        except grpc.RpcError as exc:
            if failure_of(exc).reason in (Reason.WOULD_LOSE_QUORUM, Reason.CHANGE_IN_FLIGHT):
                return None
            raise

    return wait_for("the membership change", attempt, timeout_s=30.0, every_s=0.2)
