"""Fuzzing a live synapse-worker's WorkerService (ReadLog, Nudge, and any method added).

A worker agent (worker certificate, mutual TLS) joins a 3-replica cluster and runs one job
to its end, so that a member log exists. Requests drawn from the descriptors, and
near-valid ReadLog requests naming that job with random attempt, rank, offset, size and
follow, go out as a replica (allowed everything), as the admin with a valid log grant, as
the admin without one, and as another node. After every batch: the agent runs and answers
a Nudge within a bound, no answer was UNKNOWN or INTERNAL, and the cluster's invariants hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import Transport
from synapse_ha.worker.logs import find_member_dir
from tests.fuzz import harness
from tests.fuzz.cluster import STATUS_BOUND_S, FuzzCluster
from tests.fuzz.strategies import Method, message_strategy, request_methods
from tests.integration.cluster import wait_for
from tests.worker.workers import LocalWorkers

pytestmark = pytest.mark.integration

METHODS = request_methods([wpb.DESCRIPTOR])
NODE = "fw1"
TALLY = harness.Tally("worker")


@dataclass
class Rig:
    cluster: FuzzCluster
    workers: LocalWorkers
    address: str = ""
    job_id: str = ""
    grant: str = ""
    channels: dict[str, grpc.Channel] = field(default_factory=dict)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root: Path = tmp_path_factory.mktemp("fuzz-worker")
    cluster = FuzzCluster(root / "cluster")
    workers = LocalWorkers(root / "workers", [], cluster.replicas.credentials)
    r = Rig(cluster, workers)
    try:
        cluster.start()
        workers.schedulers = cluster.replicas.grpc_addresses
        workers.start(NODE, "--cpu", "2", "--memory", "1Gi")
        with cluster.replicas.client(timeout_s=30.0) as admin:

            def registered() -> str | None:
                nodes = {n.node_id: n for n in admin.list_nodes()}
                return nodes[NODE].address if NODE in nodes else None

            r.address = wait_for("the worker's registration", registered, timeout_s=60.0)
            spec = pb.JobSpec(
                name="fuzz-log",
                replicas=1,
                resources=pb.Resources(cpu_milli=100, memory_mib=16),
                shell_command="echo line one; echo line two",
            )
            r.job_id = admin.submit_job(spec).job_id

            def finished() -> bool:
                return admin.get_job(r.job_id).state == "SUCCEEDED"

            wait_for("the job to succeed", finished, timeout_s=90.0)
            leader = cluster.replicas.serving_leader()
            stub = admin.scheduler(leader.grpc)
            r.grant = stub.GrantLogAccess(
                pb.GrantLogAccessRequest(job_id=r.job_id), timeout=30.0
            ).grant
        creds = cluster.replicas.credentials
        assert creds is not None
        transports = {
            "replica": Transport(creds.replica_tls("r1")),
            "admin": Transport(creds.admin_tls()),
            "granted": Transport(creds.admin_tls()),
            "node": Transport(creds.worker_tls("other-node")),
        }
        r.channels = {who: t.channel(r.address, worker=NODE) for who, t in transports.items()}
        yield r
    finally:
        for channel in r.channels.values():
            channel.close()
        workers.close()
        cluster.close()
        harness.record(TALLY.summary())


def _metadata(rig: Rig, who: str) -> tuple[tuple[str, str], ...]:
    return ((GRANT_METADATA_KEY, rig.grant),) if who == "granted" else ()


def _near_valid_read(job_id: str) -> st.SearchStrategy[Message]:
    i32 = st.one_of(st.integers(-3, 3), st.integers(-(2**31), 2**31 - 1))
    return st.builds(
        lambda a, r, o, m, f: wpb.ReadLogRequest(
            job_id=job_id, attempt=a, rank=r, offset=o, max_bytes=m, follow=f
        ),
        i32,
        i32,
        st.one_of(st.integers(-100, 100), st.integers(-(2**63), 2**63 - 1)),
        i32,
        st.booleans(),
    )


@st.composite
def _batch(draw: Any, job_id: str) -> list[tuple[str, Method, Message]]:
    calls = []
    for _ in range(draw(st.integers(1, 5))):
        method = draw(st.sampled_from(METHODS))
        who = draw(st.sampled_from(["replica", "admin", "granted", "node"]))
        if method.name == "ReadLog" and draw(st.booleans()):
            request = draw(_near_valid_read(job_id))
        else:
            request = draw(message_strategy(method.input))
        calls.append((who, method, request))
    return calls


def _assert_worker_alive(rig: Rig) -> None:
    (worker,) = rig.workers.workers
    assert worker.alive, f"the worker exited:\n{worker.log_tail()}"
    stub = wpb_grpc.WorkerServiceStub(rig.channels["replica"])  # type: ignore[no-untyped-call]
    stub.Nudge(wpb.NudgeRequest(node_id="nobody"), timeout=STATUS_BOUND_S)


@settings(
    max_examples=harness.examples(12),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_worker_requests_leave_the_worker_alive(rig: Rig, data: st.DataObject) -> None:
    TALLY.examples += 1
    TALLY.batches += 1
    for who, method, request in data.draw(_batch(rig.job_id)):
        outcome = harness.call(rig.channels[who], method, [request], _metadata(rig, who))
        TALLY.add(method.name, who, outcome)
    _assert_worker_alive(rig)
    assert TALLY.crashes == [], "\n".join(TALLY.crashes)
    rig.cluster.assert_alive()
    rig.cluster.assert_invariants(rig.cluster.state(rig.cluster.leader_id()))


def test_the_grant_reads_the_log_and_its_absence_is_refused(rig: Rig) -> None:
    """The rig really reaches the handlers: with the grant the log comes back, without
    it the worker refuses."""
    (method,) = [m for m in METHODS if m.name == "ReadLog"]
    request = wpb.ReadLogRequest(job_id=rig.job_id)
    granted = harness.call(rig.channels["granted"], method, [request], _metadata(rig, "granted"))
    refused = harness.call(rig.channels["admin"], method, [request])
    assert granted.kind == harness.ACCEPTED, granted
    assert refused.kind == harness.REJECTED and refused.code == "PERMISSION_DENIED", refused


def test_a_job_id_no_file_can_have_finds_no_log(tmp_path: Path) -> None:
    """Found by the fuzzer: a 300-character job id made ReadLog fail with UNKNOWN
    (ENAMETOOLONG escaped the handler); it is a job this node has no log of."""
    assert find_member_dir(tmp_path, "a" * 300, 0, 0) is None
    assert find_member_dir(tmp_path, "a\x00b", 0, 0) is None
