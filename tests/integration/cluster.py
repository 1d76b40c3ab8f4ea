"""Real synapse-scheduler processes on 127.0.0.1 for integration tests.

Processes are started by :mod:`synapse_ha.local.launcher` (own process group, log file,
free ports, bounded waits, a close that stops everything); this module adds what the
tests share: a fixed Raft password, ``wait_for`` and request builders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.process import Replica
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.local.waiting import RPC_ERRORS, wait_until
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc

__all__ = ["LocalCluster", "Replica", "job_spec", "register_request", "reserve_ports", "wait_for"]

T = TypeVar("T")
PASSWORD = "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="


def wait_for(
    what: str, probe: Callable[[], T | None], timeout_s: float = 15.0, every_s: float = 0.05
) -> T:
    """Call ``probe`` until it returns something other than None/False; bounded."""
    return wait_until(what, probe, timeout_s, every_s=every_s, retry_on=RPC_ERRORS)


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
