"""Nudges: the leader's hint that a worker should heartbeat now.

In process: ``WorkerNudger`` against the worker's own servicer. End to end: with a
heartbeat interval far longer than the test waits, a bound member can only start that
soon because the leader nudged its worker.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.rpc.nudge import WorkerNudger
from synapse_ha.worker.logs import add_worker_service
from tests.integration.cluster import LocalCluster, reserve_ports, wait_for
from tests.worker.workers import LocalWorkers


class Inbox:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.seen: list[str] = []
        self.event = threading.Event()

    def __call__(self, node_id: str) -> bool:
        self.seen.append(node_id)
        self.event.set()
        return node_id == self.node_id


@pytest.fixture
def worker_server(tmp_path: Path) -> Iterator[tuple[str, Inbox]]:
    inbox = Inbox("n1")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_worker_service(server, tmp_path, inbox)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", inbox
    finally:
        server.stop(grace=None).wait(5)


def test_the_worker_accepts_a_nudge_only_for_its_own_node(
    worker_server: tuple[str, Inbox],
) -> None:
    address, inbox = worker_server
    with grpc.insecure_channel(address) as channel:
        stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        assert stub.Nudge(wpb.NudgeRequest(node_id="n1"), timeout=10).accepted
        assert not stub.Nudge(wpb.NudgeRequest(node_id="n2"), timeout=10).accepted
    assert inbox.seen == ["n1", "n2"]


def test_the_nudger_reaches_the_worker_without_blocking_and_survives_dead_addresses(
    worker_server: tuple[str, Inbox],
) -> None:
    address, inbox = worker_server
    (closed_port,) = reserve_ports(1)
    nudger = WorkerNudger(timeout_s=2.0, max_channels=1)
    try:
        nudger.nudge([("gone", f"127.0.0.1:{closed_port}"), ("n1", address)])
        assert inbox.event.wait(10)
        assert inbox.seen == ["n1"]
        assert len(nudger._channels) == 1  # the least recently used channel was closed
    finally:
        nudger.close()
    nudger.nudge([("n1", address)])  # after close: ignored, never raises
    assert inbox.seen == ["n1"]


def test_a_nudger_needs_room_for_a_channel() -> None:
    with pytest.raises(ValueError, match="max_channels"):
        WorkerNudger(max_channels=0)


@pytest.mark.integration
def test_a_bound_member_starts_long_before_the_next_heartbeat(tmp_path: Path) -> None:
    # Heartbeats every 60 s: after its registration heartbeat the worker would not ask
    # again for a minute, so a start within the wait below needs the leader's nudge.
    cluster = LocalCluster(
        tmp_path / "cluster",
        extra_args=[
            "--heartbeat-interval",
            "60s",
            "--lease-ttl",
            "120s",
            "--leader-step-down",
            "60s",
            "--dead-timeout",
            "300s",
        ],
    )
    workers = LocalWorkers(tmp_path / "workers", [], cluster.credentials)
    try:
        cluster.start()
        cluster.serving_leader()
        workers.schedulers = cluster.grpc_addresses
        workers.root.mkdir()
        workers.start("w1", "--cpu", "1", "--memory", "1Gi", "--mock-gpus", "0")
        with cluster.client() as client:
            wait_for("the worker to register", lambda: len(client.list_nodes()) == 1, 30)
            out = tmp_path / "started"
            spec = pb.JobSpec(
                name="nudged",
                replicas=1,
                resources=pb.Resources(cpu_milli=100, memory_mib=16),
                shell_command=f"touch {out}",
            )
            job_id = client.submit_job(spec).job_id
            wait_for("the member to start", out.exists, timeout_s=20)
            assert client.get_job(job_id).attempt.fencing_token > 0
    finally:
        workers.close()
        cluster.close()
