"""A leader that freezes (SIGSTOP: its sockets stay open, nothing is closed) under real
workers running a gang, and what the frozen leader answers when it wakes.

The workers must find the new leader within their lease: the gang's attempt survives
(same fencing token, still running, no member killed, no node declared dead). The woken
leader serves nothing from its old term: no stale read, no write."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import NodeStatus
from synapse_ha.local.process import Replica
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import node_status
from synapse_ha.worker.pidns import ECHO_PID
from tests.integration.cluster import LocalCluster, job_spec, pausable_cluster, wait_for
from tests.worker.helpers import process_gone
from tests.worker.test_integration_worker import gang, pid_of, start_workers, wait_state
from tests.worker.workers import LocalWorkers, workers_of

pytestmark = pytest.mark.integration

FREEZE_S = 10.0  # longer than the lease (4 s) and the dead timeout (10 s) together allow
REFUSALS = frozenset({Reason.NOT_LEADER, Reason.LEADER_NOT_READY, Reason.NO_LEADER})


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three replicas with the default timeouts (heartbeat 1 s, lease 4 s, dead 10 s)."""
    with pausable_cluster(tmp_path / "cluster") as c:
        yield c


@pytest.fixture
def workers(cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalWorkers]:
    with workers_of(cluster, tmp_path / "workers") as w:
        yield w


def new_leader(cluster: LocalCluster, old: Replica) -> Replica:
    leader = cluster.serving_leader(timeout_s=30)
    assert leader is not old
    return leader


def test_a_gang_keeps_running_while_the_leader_is_frozen(
    cluster: LocalCluster, workers: LocalWorkers, tmp_path: Path
) -> None:
    with cluster.client(timeout_s=30.0) as client:
        start_workers(workers, client, 2)
        running = RunningGang.start(client, "frozen", tmp_path / "out")
    old = cluster.serving_leader()
    old.pause()
    try:
        leader = new_leader(cluster, old)
        time.sleep(FREEZE_S)
    finally:
        old.resume()
    wait_for("the woken replica to follow", lambda: cluster.serving_leader() is leader)
    running.assert_survived(cluster, workers)


@dataclass(frozen=True)
class RunningGang:
    """A 2-member gang that sleeps, one member on each of two workers: its job, its
    members' pids and its attempt when it started."""

    job_id: str
    pids: tuple[int, ...]
    attempt: pb.Attempt

    @classmethod
    def start(cls, client: ClusterClient, name: str, out: Path) -> RunningGang:
        out.mkdir()
        command = f"{ECHO_PID} > $OUT/pid-$RANK; exec sleep 600"
        job_id = client.submit_job(gang(name, 2, command, out, retries=2)).job_id
        pids = (pid_of(out, "pid-0"), pid_of(out, "pid-1"))
        return cls(job_id, pids, wait_state(client, job_id, "RUNNING").attempt)

    def assert_survived(self, cluster: LocalCluster, workers: LocalWorkers) -> None:
        """The same attempt still runs: no member killed, no node dead, nothing fenced."""
        with cluster.client(timeout_s=30.0) as client:
            job = client.get_job(self.job_id)
            nodes = {n.node_id: node_status(n) for n in client.list_nodes()}
        assert job.state == "RUNNING", job
        before = (self.attempt.number, self.attempt.fencing_token)
        assert (job.attempt.number, job.attempt.fencing_token) == before
        assert nodes == {"w1": NodeStatus.READY, "w2": NodeStatus.READY}
        assert not [p for p in self.pids if process_gone(p)]
        logs = workers.logs()
        assert "fenced" not in logs and "declared this node dead" not in logs, logs


def _answer(future: grpc.Future[Any]) -> tuple[Any, Reason | None]:
    try:
        return future.result(timeout=10.0), None
    except grpc.RpcError as exc:
        return None, failure_of(exc).reason


def test_a_woken_leader_serves_no_stale_read_and_takes_no_write(cluster: LocalCluster) -> None:
    old = cluster.serving_leader()
    with cluster.channel(old.grpc) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.ListNodes(pb.ListNodesRequest(), timeout=5.0)  # the connection is open
        old.pause()
        try:
            leader = new_leader(cluster, old)
            with cluster.client(timeout_s=30.0) as client:
                job_id = client.submit_job(job_spec("after-the-freeze"), request_id="fz-1").job_id
            # Asked before it wakes: the calls wait in its socket and are the first
            # things it reads.
            reads = [
                stub.GetJob.future(pb.GetJobRequest(job_id=job_id), timeout=10.0) for _ in range(4)
            ]
            spec = job_spec("stale")
            writes = [
                stub.SubmitJob.future(
                    pb.SubmitJobRequest(spec=spec, request_id=f"fz-{i}"), timeout=10.0
                )
                for i in range(2, 4)
            ]
        finally:
            old.resume()
        read_answers = [_answer(f) for f in reads]
        write_answers = [_answer(f) for f in writes]
    for got, refused in read_answers:
        # Either the current data or a refusal that sends the caller to the leader.
        assert refused in REFUSALS or (got is not None and got.job.job_id == job_id), refused
    for wrote, refused in write_answers:
        assert wrote is None and refused in REFUSALS, (wrote, refused)
    assert cluster.serving_leader() is leader
    with cluster.client() as client:
        assert [j.spec.name for j in client.list_jobs()] == ["after-the-freeze"]


def test_a_client_finds_the_new_leader_while_the_old_one_is_frozen(
    cluster: LocalCluster,
) -> None:
    old = cluster.serving_leader()
    client: ClusterClient = cluster.client(timeout_s=30.0)
    with client:
        client.submit_job(job_spec("before"), request_id="fz-before")
        assert client.leader_hint == old.grpc
        old.pause()
        try:
            client.submit_job(job_spec("during"), request_id="fz-during")
            # The next call starts elsewhere instead of waiting on the frozen replica.
            assert client.leader_hint != old.grpc
            attempts: list[str] = []
            real_invoke = client.scheduler

            def recording(address: str) -> pb_grpc.SchedulerServiceStub:
                attempts.append(address)
                return real_invoke(address)

            client.scheduler = recording  # type: ignore[method-assign]
            client.submit_job(job_spec("after"), request_id="fz-after")
            assert attempts and old.grpc not in attempts, attempts
        finally:
            old.resume()


def test_a_fresh_client_does_not_wait_out_a_frozen_leader(cluster: LocalCluster) -> None:
    """A client that has never seen the cluster, whose first address is the frozen
    leader: its write lands once the others elect a leader, long before the per-try
    deadline it would have waited on the frozen replica (the hedge moves on)."""
    per_try_s = 20.0
    old = cluster.serving_leader()
    addresses = [old.grpc, *(a for a in cluster.grpc_addresses if a != old.grpc)]
    old.pause()
    try:
        started = time.monotonic()
        with ClusterClient(
            addresses,
            timeout_s=60.0,
            per_try_timeout_s=per_try_s,
            channel_factory=cluster.transport.channel,
        ) as client:
            job_id = client.submit_job(job_spec("fresh"), request_id="fz-fresh").job_id
            took = time.monotonic() - started
            assert client.leader_hint != old.grpc
    finally:
        old.resume()
    # An election (under a second) and the hedge delay, with room for a loaded machine.
    assert took < per_try_s / 2, took
    with cluster.client(timeout_s=30.0) as client:
        assert client.get_job(job_id).spec.name == "fresh"
