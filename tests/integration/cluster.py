"""Real synapse-scheduler processes on 127.0.0.1 for integration tests and benchmarks.

Every process runs in its own process group; :meth:`LocalCluster.close` kills every group
it started (SIGKILL after a short SIGTERM grace), so a failing test never leaks replicas.
Waits are bounded by explicit deadlines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from synapse_ha.rpc.client import ClusterClient
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc

T = TypeVar("T")
PASSWORD = "integration-test-password"


def free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_for(
    what: str, probe: Callable[[], T | None], timeout_s: float = 15.0, every_s: float = 0.05
) -> T:
    """Call ``probe`` until it returns something other than None/False; bounded."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except (grpc.RpcError, OSError) as exc:
            last_error = exc
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last_error})")


@dataclass
class ReplicaProcess:
    replica_id: str
    raft: str
    grpc: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class LocalCluster:
    root: Path
    size: int = 3
    extra_args: list[str] = field(default_factory=list)
    replicas: list[ReplicaProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * self.size)
        for i in range(self.size):
            rid = f"r{i + 1}"
            data = self.root / rid
            self.replicas.append(
                ReplicaProcess(
                    replica_id=rid,
                    raft=f"127.0.0.1:{ports[2 * i]}",
                    grpc=f"127.0.0.1:{ports[2 * i + 1]}",
                    data_dir=data,
                    log_path=self.root / f"{rid}.log",
                )
            )

    # ------------------------------------------------------------- processes

    def command(self, replica: ReplicaProcess) -> list[str]:
        args = [sys.executable, "-m", "synapse_ha.programs.scheduler", "--id", replica.replica_id]
        for r in self.replicas:
            args += ["--replica", f"{r.replica_id}={r.raft},{r.grpc}"]
        return [*args, "--data-dir", str(replica.data_dir), *self.extra_args]

    def start(self, replica: ReplicaProcess | None = None) -> None:
        for r in [replica] if replica else self.replicas:
            assert not r.alive, f"{r.replica_id} is already running"
            log = open(r.log_path, "ab")  # noqa: SIM115 - handed to the child
            try:
                r.process = subprocess.Popen(
                    self.command(r),
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**os.environ, "SYNAPSE_RAFT_PASSWORD": PASSWORD},
                )
            finally:
                log.close()

    def kill(self, replica: ReplicaProcess, sig: int = signal.SIGKILL) -> None:
        process = replica.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
        try:
            process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5.0)
        replica.process = None

    def close(self) -> None:
        for r in self.replicas:
            if r.process is not None:
                try:
                    if r.process.poll() is None:
                        os.killpg(r.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.process.wait(timeout=5.0)
                r.process = None

    def logs(self) -> str:
        parts = []
        for r in self.replicas:
            text = r.log_path.read_text(errors="replace") if r.log_path.exists() else ""
            parts.append(f"----- {r.replica_id} -----\n{text[-4000:]}")
        return "\n".join(parts)

    # ----------------------------------------------------------------- access

    @property
    def grpc_addresses(self) -> list[str]:
        return [r.grpc for r in self.replicas]

    def client(self, **kwargs: float) -> ClusterClient:
        return ClusterClient(self.grpc_addresses, **kwargs)

    def stub(self, replica: ReplicaProcess) -> pb_grpc.SchedulerServiceStub:
        return pb_grpc.SchedulerServiceStub(grpc.insecure_channel(replica.grpc))

    def local_status(self, replica: ReplicaProcess) -> pb.ReplicaStatus:
        with grpc.insecure_channel(replica.grpc) as channel:
            answer = pb_grpc.SchedulerServiceStub(channel).GetClusterStatus(
                pb.GetClusterStatusRequest(local_only=True), timeout=1.0
            )
        status: pb.ReplicaStatus = answer.replicas[0]
        return status

    def serving_leader(self, timeout_s: float = 15.0) -> ReplicaProcess:
        """Wait until exactly one live replica is leader and serves writes."""

        def probe() -> ReplicaProcess | None:
            leaders = []
            for r in self.replicas:
                if not r.alive:
                    continue
                try:
                    if self.local_status(r).role == "leader":
                        leaders.append(r)
                except grpc.RpcError:
                    continue
            if len(leaders) != 1:
                return None
            leader = leaders[0]
            # A barrier-committed leader answers a fresh read.
            with grpc.insecure_channel(leader.grpc) as channel:
                pb_grpc.SchedulerServiceStub(channel).ListNodes(pb.ListNodesRequest(), timeout=1.0)
            return leader

        return wait_for("a serving leader", probe, timeout_s)

    def followers(self, leader: ReplicaProcess) -> list[ReplicaProcess]:
        return [r for r in self.replicas if r is not leader and r.alive]


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
